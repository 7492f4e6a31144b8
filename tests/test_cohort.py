"""Runs as one computation (fedhet.engine.cohort, fedhet.engine.launch.run_together): the
seed runs of one setting step in lockstep and their clients train in shared groups, each
from its own run's model and buffers; every run gives what it gives alone (within float
tolerance: a group's rows are computed together), resumes on its own, and one run's end or
failure does not stop the others."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.engine.cohort import CohortRun
from fedhet.engine.launch import run, run_together
from fedhet.engine.loop import RunLoop

CASES = {
    "salf": {},  # partial depths: groups by depth
    "fedprox": {"algorithm.mu": 0.1, "train.local_steps": 2},  # the proximal anchor: each run's own model
    "scaffold": {"train.local_steps": 2},  # a payload and client state per run
    "fedawe": {"system.participation": "two-group", "system.participation_min": 0.3},  # the rule's own start
    "heterofl": {"algorithm.width_rule": "fixed"},  # sub-models: each row masked as its run's model
}


def _config(name: str, seed: int, **extra):
    keys = {"algorithm.name": name, "run.seed": seed, "run.rounds": 6, "run.eval_every": 3,
            "run.pool": "batched", "system.straggler_ratio": 0.5, **CASES[name], **extra}  # fmt: skip
    if name == "fedawe":
        keys.update({"system.model": "full", "system.deadline": 1.0})
    return make_config(keys)


def _same(alone, together) -> None:
    assert [r["participants"] for r in together.metrics] == [r["participants"] for r in alone.metrics]
    for a, b in zip(alone.metrics, together.metrics, strict=True):
        if a["train_loss"] == a["train_loss"]:  # not NaN
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5, abs=1e-6)
        if a.get("test_accuracy") is not None:
            assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-3)


@pytest.mark.parametrize("name", list(CASES))
def test_seed_runs_in_lockstep_give_what_each_gives_alone(tmp_path, name):
    seeds = [1, 2, 3]
    alone = [run(_config(name, s), tmp_path / f"alone-{s}") for s in seeds]
    together = run_together([CohortRun(_config(name, s), tmp_path / f"together-{s}") for s in seeds])
    for a, b in zip(alone, together, strict=True):
        assert not isinstance(b, BaseException), b
        _same(a, b)
        assert b.summary["lockstep_runs"] == 3
    grouped = sum(b.summary["tasks_grouped"] for b in together)
    assert grouped >= sum(a.summary["tasks_grouped"] for a in alone)  # groups span the runs


def test_each_client_starts_from_its_own_runs_model_and_buffers():
    """Three clients of three runs (different models, BatchNorm statistics) in one group give
    what each gives trained alone from its run's model."""
    from torch import nn

    from fedhet.client import LocalTrainer
    from fedhet.client.group import Member
    from fedhet.client.state import ClientData
    from fedhet.messages import ClientTask, Coverage
    from fedhet.models.layers import FlatModel, LayeredModel

    torch.manual_seed(0)
    trainer = LocalTrainer(FlatModel(LayeredModel([nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)),
                                                   nn.Linear(3, 2)])))  # fmt: skip
    base_params, base_buffers = trainer.flat.params.clone(), trainer.flat.buffers.clone()
    models = [(base_params + 0.2 * c, base_buffers + 0.1 * c) for c in range(3)]
    x, y = torch.randn(60, 4), torch.randint(0, 2, (60,))
    data = [ClientData(x, y, np.arange(20 * c, 20 * c + 20)) for c in range(3)]
    tasks = [ClientTask(0, c, 0.1, 5, 3, Coverage(1)) for c in range(3)]
    alone = [trainer.execute(t, p, b, d, {}, np.random.default_rng(t.client))
             for t, d, (p, b) in zip(tasks, data, models, strict=True)]  # fmt: skip
    members = [Member(t, d, {}, np.random.default_rng(t.client)) for t, d in zip(tasks, data, strict=True)]
    for member, (p, b) in zip(members[1:], models[1:], strict=True):
        member.start, member.start_buffers = p, b
    grouped = trainer.train_group(members, *models[0])
    for a, b in zip(alone, grouped, strict=True):
        assert b is not None
        torch.testing.assert_close(b.delta, a.delta, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b.delta_buffers, a.delta_buffers, atol=1e-6, rtol=1e-5)


def test_a_run_that_ends_or_fails_leaves_and_the_others_go_on(tmp_path):
    """Run 2 diverges (a huge learning rate: it stops at its first non-finite round), run 3
    cannot start (its folder is a file); run 1 finishes as alone."""
    (tmp_path / "together-3").write_text("not a folder")
    runs = [CohortRun(_config("salf", 1), tmp_path / "together-1"),
            CohortRun(_config("salf", 2, **{"train.lr": 1e30}), tmp_path / "together-2"),
            CohortRun(_config("salf", 3), tmp_path / "together-3")]  # fmt: skip
    results = run_together(runs)
    _same(run(_config("salf", 1), tmp_path / "alone-1"), results[0])
    assert not isinstance(results[1], BaseException) and results[1].summary["stopped_by"] == "non_finite"
    assert isinstance(results[2], BaseException)


def test_an_interrupted_run_resumes_in_lockstep_to_its_uninterrupted_numbers(tmp_path):
    whole = run(_config("salf", 1), tmp_path / "whole")
    RunLoop(_config("salf", 1), tmp_path / "cut").run(stop_after=3)
    results = run_together([CohortRun(_config("salf", 1), tmp_path / "cut", resume=True),
                            CohortRun(_config("salf", 2), tmp_path / "other")])  # fmt: skip
    _same(whole, results[0])
