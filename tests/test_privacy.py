"""Privacy accounting of clip-noise (fedhet.engine.privacy): epsilon by Renyi DP under the
three sampling readings, each equal to dp-accounting composing the run's own releases one
by one, and no-amplification's to the closed form of the Gaussian mechanism's RDP; each
client's epsilon from its own participations; run.epsilon_budget stops a run before a
release would pass it; a resumed run goes on counting; bad settings are one line."""

from __future__ import annotations

import csv
import math

import pytest
from conftest import make_config

from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError

pytest.importorskip("dp_accounting")

Z, DELTA = 1.0, 1e-5
NOISE = {"train.postprocess": [{"name": "clip-noise", "max_norm": 1.0, "noise_multiplier": Z}]}
# drop-stragglers on digits with exponential compute times and a 45 s deadline: 2 to 6 of
# the 10 clients deliver in a round, so the releases vary in size
VARIED = {**NOISE, "run.rounds": 12, "run.eval_every": 6, "algorithm.name": "drop",
          "system.model": "exponential", "system.deadline": 45.0}  # fmt: skip


def _library_epsilon(reading: str, sizes: list[int], population: int) -> float:
    """dp-accounting's own RDP accountant composing each release in turn."""
    from dp_accounting import dp_event, privacy_accountant, rdp

    from fedhet.engine.privacy import ORDERS

    relation = privacy_accountant.NeighboringRelation
    neighbours = relation.REPLACE_ONE if reading == "without-replacement" else relation.ADD_OR_REMOVE_ONE
    accountant = rdp.RdpAccountant(list(ORDERS), neighbours)
    for n in sizes:
        gaussian = dp_event.GaussianDpEvent(Z)
        event = {
            "poisson": dp_event.PoissonSampledDpEvent(n / population, gaussian),
            "without-replacement": dp_event.SampledWithoutReplacementDpEvent(population, n, gaussian),
        }.get(reading, gaussian)
        accountant.compose(event)
    return accountant.get_epsilon(DELTA)


def _sizes(result) -> list[int]:
    return [int(r["participants"]) for r in result.metrics if int(r["participants"])]


def test_each_reading_is_the_composition_of_the_runs_releases(tmp_path):
    """Drop-stragglers at a deadline: releases of varying sizes; every reading's epsilon
    equals dp-accounting composing them one by one, and the readings order as amplification
    says (Poisson <= no amplification)."""
    result = run(make_config(VARIED), tmp_path / "drop")
    sizes, summary = _sizes(result), result.summary
    assert len(set(sizes)) > 1 and summary["releases"] == len(sizes)
    for reading in ("no-amplification", "poisson", "without-replacement"):
        key = f"epsilon_rdp_{reading.replace('-', '_')}"
        assert summary[key] == pytest.approx(_library_epsilon(reading, sizes, 10), rel=1e-9)
    assert summary["epsilon_rdp_poisson"] < summary["epsilon_rdp_no_amplification"]
    assert summary["epsilon"] == summary["epsilon_rdp_no_amplification"]  # the default reading
    assert result.metrics[-1]["epsilon"] == pytest.approx(summary["epsilon"])
    for reading in ("no_amplification", "poisson", "without_replacement"):  # every reading, every row
        assert result.metrics[-1][f"epsilon_{reading}"] == pytest.approx(summary[f"epsilon_rdp_{reading}"])
        first = result.metrics[0][f"epsilon_{reading}"]
        assert first == pytest.approx(_library_epsilon(reading.replace("_", "-"), sizes[:1], 10), rel=1e-9)
    assert summary["epsilon_pld_without_replacement"] is None  # no PLD for that event
    assert 0 < summary["epsilon_pld_poisson"] <= summary["epsilon_rdp_poisson"] * 1.01


def test_no_amplification_is_the_gaussian_mechanisms_closed_form_per_client(tmp_path):
    """Without amplification, k releases of Gaussian(z) have RDP k a / (2 z^2) at order a,
    converted to epsilon = min_a [RDP + log((a - 1) / a) - (log delta + log a) / (a - 1)];
    each client's epsilon is that at its own count of participations."""
    from fedhet.engine.privacy import ORDERS

    def closed_form(k: int) -> float:
        def at(a: float) -> float:
            return k * a / (2 * Z * Z) + math.log((a - 1) / a) - (math.log(DELTA) + math.log(a)) / (a - 1)

        return min(at(a) for a in ORDERS)

    result = run(make_config(VARIED), tmp_path / "drop")
    assert result.summary["epsilon"] == pytest.approx(closed_form(len(_sizes(result))), rel=1e-9)
    with open(tmp_path / "drop" / "clients.csv") as handle:
        rows = list(csv.DictReader(handle))
    counts = [int(r["releases"]) for r in rows]
    assert len(set(counts)) > 1 and sum(counts) == sum(_sizes(result))
    for row, k in zip(rows, counts, strict=True):
        assert float(row["epsilon"]) == pytest.approx(closed_form(k) if k else 0.0, rel=1e-9)
    assert result.summary["epsilon_client_max"] == pytest.approx(max(float(r["epsilon"]) for r in rows))


def test_the_budget_stops_the_run_before_a_release_would_pass_it(tmp_path):
    """run.epsilon_budget = 5: the run stops, finished, at the last release that keeps
    epsilon within 5 (one more would pass it)."""
    from fedhet.engine.privacy import ORDERS  # noqa: F401  (the library is there)

    config = make_config({**VARIED, "run.rounds": 50, "run.epsilon_budget": 5.0})
    result = run(config, tmp_path / "budget")
    sizes = _sizes(result)
    assert result.summary["stopped_by"] == "epsilon_budget" and result.summary["finished"]
    assert result.summary["epsilon"] <= 5.0 < _library_epsilon("no-amplification", [*sizes, sizes[-1]], 10)


def test_a_resumed_run_goes_on_counting(tmp_path):
    config = make_config(VARIED)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    for key in ("epsilon", "epsilon_rdp_poisson", "releases", "epsilon_client_max"):
        assert resumed.summary[key] == whole.summary[key]
    assert (tmp_path / "cut" / "clients.csv").read_text() == (tmp_path / "whole" / "clients.csv").read_text()


def test_a_run_the_budget_stopped_goes_on_when_resumed_with_a_larger_one(tmp_path):
    """Stopped at epsilon_budget = 10, resumed with 20: it runs on to where a run with 20
    from the start stops, with the same releases and epsilon."""
    stopped = RunLoop(
        make_config({**VARIED, "run.rounds": 60, "run.epsilon_budget": 10.0}), tmp_path / "x"
    ).run()
    assert stopped.summary["stopped_by"] == "epsilon_budget"
    larger = make_config({**VARIED, "run.rounds": 60, "run.epsilon_budget": 20.0})
    resumed = RunLoop(larger, tmp_path / "x").run(resume=True)
    whole = run(larger, tmp_path / "whole")
    assert resumed.summary["releases"] == whole.summary["releases"] > stopped.summary["releases"]
    assert resumed.summary["epsilon"] == whole.summary["epsilon"] <= 20.0


def test_a_budget_without_noise_or_below_one_release_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"run.epsilon_budget = 3: the run adds no noise to account"):
        run(make_config({"run.epsilon_budget": 3.0}), tmp_path / "plain")
    with pytest.raises(ConfigError, match=r"run.epsilon_budget = 0.5: less than one round's release costs"):
        run(make_config({**NOISE, "run.epsilon_budget": 0.5}), tmp_path / "tiny")
    with pytest.raises(ConfigError, match="clip-noise accounting"):
        bad = {"name": "clip-noise", "noise_multiplier": 1.0, "accounting": "x"}
        make_config({"train.postprocess": [bad]})


@pytest.mark.extended
def test_flowers_accountant_agrees_on_the_same_releases(tmp_path):
    """Flower's client-level RDP accountant (flwr.serverapp.RdpAccountant, itself on
    dp-accounting), fed the run's releases under the same orders, gives the run's epsilon
    under the Poisson and the without-replacement readings and without amplification."""
    serverapp = pytest.importorskip("flwr.serverapp")
    from flwr.supercore.privacy_accounting import NeighboringRelation, SamplingMethod

    from fedhet.engine.privacy import ORDERS

    result = run(make_config(VARIED), tmp_path / "drop")
    readings = {
        "poisson": (SamplingMethod.POISSON, NeighboringRelation.ADD_OR_REMOVE_ONE),
        "without_replacement": (SamplingMethod.WITHOUT_REPLACEMENT, NeighboringRelation.REPLACE_ONE),
        "no_amplification": (SamplingMethod.NO_AMPLIFICATION, NeighboringRelation.ADD_OR_REMOVE_ONE),
    }
    for key, (sampling, relation) in readings.items():
        config = serverapp.PrivacyConfig(DELTA, 10, relation, sampling)
        accountant = serverapp.RdpAccountant(config, orders=ORDERS)
        for n in _sizes(result):
            accountant.compose(serverapp.GaussianPrivacyEvent(Z, n, 10))
        assert accountant.get_epsilon(DELTA) == pytest.approx(result.summary[f"epsilon_rdp_{key}"], rel=1e-9)
