"""An event-driven run's starts as one computation (fedhet.engine.drivers.EventDriver with a
pool that declares ``run_from_models``): a start trains when an update of it is needed, with
every start made meanwhile, each from the model sent to it. A start gives what it gives at
once: bit for bit where each trains alone (groups of one), within float tolerance grouped;
a resumed run with starts pending continues exactly; the starts really train together."""

from __future__ import annotations

import pytest
from conftest import make_config

from fedhet.engine.cohort import CohortRun
from fedhet.engine.launch import run, run_together
from fedhet.engine.loop import RunLoop

RULES = {
    "fedbuff": {"algorithm.buffer_size": 2, "algorithm.max_concurrency": 6},
    "fedasync": {},
    "ca2fl": {"algorithm.buffer_size": 2},
    "fadas": {"algorithm.buffer_size": 2, "algorithm.eta": 0.01},
    "ringmaster": {"algorithm.delay_threshold": 3},
    "fedcompass": {},
}


def _config(name: str, **extra):
    """Half the clients absent at times (starts that train and are dropped, a client started
    again before its first start trained), momentum kept per client (a client's starts must
    train in their order), two local steps, heterogeneous speeds."""
    keys = {"algorithm.name": name, "run.rounds": 24, "run.eval_every": 8, "run.pool": "batched",
            "system.model": "exponential", "system.capability_profile": "uniform",
            "system.participation": "two-group", "system.participation_min": 0.4,
            "train.local_steps": 2, "train.momentum": 0.5, "train.keep_momentum": True,
            **RULES[name], **extra}  # fmt: skip
    return make_config(keys)


@pytest.mark.parametrize("name", list(RULES))
def test_deferred_starts_give_what_starts_trained_at_once_give_bit_for_bit(tmp_path, name):
    """Groups of one (``clients_per_batch = 1``): trained later or at once (a run whose client
    errors are skipped trains at once), every row and every account is the same."""
    alone = {"run.clients_per_batch": 1}
    later = run(_config(name, **alone), tmp_path / "later")
    at_once = run(_config(name, **alone, **{"run.on_client_error": "skip"}), tmp_path / "now")
    assert later.metrics == at_once.metrics
    for key in ("train_flops", "bytes_up", "bytes_down", "energy", "final_test_accuracy", "rounds"):
        assert later.summary[key] == at_once.summary[key], key


@pytest.mark.parametrize("name", ["fedbuff", "fedcompass"])
def test_a_run_with_starts_pending_resumes_to_its_uninterrupted_numbers(tmp_path, name):
    config = _config(name, **{"run.checkpoint_every": 0})  # every server step saved, starts pending
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=9)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert resumed.summary["train_flops"] == whole.summary["train_flops"]


def _close(alone, grouped) -> None:
    assert [r["participants"] for r in grouped.metrics] == [r["participants"] for r in alone.metrics]
    assert [r["sim_time"] for r in grouped.metrics] == [r["sim_time"] for r in alone.metrics]
    for a, b in zip(alone.metrics, grouped.metrics, strict=True):
        if a["train_loss"] == a["train_loss"]:  # not NaN
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5, abs=1e-6)
        if a.get("test_accuracy") is not None:
            assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-3)


@pytest.mark.parametrize("name", ["ringmaster", "fedbuff"])
def test_the_starts_train_grouped_and_give_what_one_at_a_time_gives(tmp_path, name):
    """The batched pool's groups against the in-process pool (every start alone, at once):
    float tolerance; most starts trained in groups, not only the first start of every client."""
    alone = run(_config(name, **{"run.pool": "in-process"}), tmp_path / "alone")
    grouped = run(_config(name), tmp_path / "grouped")
    _close(alone, grouped)
    assert grouped.summary["train_flops"] == pytest.approx(alone.summary["train_flops"], rel=1e-12)
    starts = grouped.summary["tasks_grouped"] + grouped.summary["tasks_alone"]
    assert starts > 2 * 10 and grouped.summary["tasks_grouped"] > 0.6 * starts


def test_event_driven_runs_in_lockstep_give_what_each_gives_alone(tmp_path):
    """Runs in a cohort hand in their pending starts when each needs them; each run's numbers
    are its own (within float tolerance)."""
    seeds = [1, 2]
    alone = [run(_config("fedbuff", **{"run.seed": s}), tmp_path / f"alone-{s}") for s in seeds]
    together = run_together(
        [CohortRun(_config("fedbuff", **{"run.seed": s}), tmp_path / f"together-{s}") for s in seeds]
    )
    for a, b in zip(alone, together, strict=True):
        assert not isinstance(b, BaseException), b
        _close(a, b)
        assert b.summary["lockstep_runs"] == 2


def test_pending_starts_train_once_their_models_reach_the_cap(tmp_path, monkeypatch):
    """With room for one kept model, the starts of each server step train before the next
    step's start: smaller groups, the same numbers as with no cap (groups of one)."""
    from fedhet.engine import drivers

    alone = {"run.clients_per_batch": 1}
    free = run(_config("fedbuff", **alone), tmp_path / "free")
    grouped_free = run(_config("fedbuff"), tmp_path / "grouped-free").summary["tasks_grouped"]
    monkeypatch.setattr(drivers, "PENDING_MODEL_BYTES", 1)
    capped = run(_config("fedbuff", **alone), tmp_path / "capped")
    assert capped.metrics == free.metrics
    grouped_capped = run(_config("fedbuff"), tmp_path / "grouped-capped").summary["tasks_grouped"]
    assert grouped_capped < grouped_free
