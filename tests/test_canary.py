"""A method's canary (fedhet.bench.canary): a short deterministic run whose hash says how the
method behaves in a scenario, the same on every build where its numbers are the same."""

from __future__ import annotations

from pathlib import Path

from conftest import SMOKE_SUITE

from fedhet.bench.canary import ROUNDS, behaviour, canary_config, canary_fingerprint
from fedhet.bench.suite import load_suite


def _metrics(folder: Path, loss: str) -> Path:
    folder.mkdir()
    (folder / "metrics.csv").write_text(f"round,train_loss,test_accuracy\n1,{loss},0.5\n")
    return folder


def test_the_hash_ignores_the_last_digits_and_sees_a_change_of_behaviour(tmp_path):
    """Rounded to 6 significant digits: a float sum in another order is the same behaviour,
    a loss that moved in the fourth digit, or another way of stopping, is not."""
    base = behaviour(_metrics(tmp_path / "a", "2.3025850929940455"), "rounds")
    assert behaviour(_metrics(tmp_path / "b", "2.3025850929940460"), "rounds") == base
    assert behaviour(_metrics(tmp_path / "c", "2.3028"), "rounds") != base
    assert behaviour(tmp_path / "a", "time_budget") != base


def test_a_canary_is_a_short_run_of_the_seed_configuration_and_tells_methods_apart():
    """The canary runs the scenario with the method at seed 1, briefly, on the in-process
    pool; it is the same twice, and differs between methods that behave differently."""
    suite = load_suite(SMOKE_SUITE)
    scenario = suite.scenarios[0]
    methods = {m.label: m for m in suite.methods}
    raw = canary_config(suite, scenario, methods["salf"])
    assert raw["run"]["rounds"] == ROUNDS and raw["run"]["pool"] == "in-process" and raw["run"]["seed"] == 1
    assert "validation_fraction" not in raw["data"] and raw["data"]["fraction"] <= 0.05
    salf = canary_fingerprint(suite, scenario, methods["salf"])
    assert len(salf) == 16 and canary_fingerprint(suite, scenario, methods["salf"]) == salf
    assert canary_fingerprint(suite, scenario, methods["fedavg"]) != salf
