"""A run limited by ``run.time_budget`` never exceeds it on the virtual clock; wait-for-all
FedAvg gets fewer rounds than deadline-based SALF under the same budget."""

from __future__ import annotations

import pytest
from conftest import make_config

from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop

BUDGET = {
    "run.rounds": 1000,
    "run.time_budget": 12.0,
    "run.eval_every": 1000,
    "system.model": "exponential",
    "system.deadline": 0.6,
    "system.time_per_sample_layer": 0.015,  # batch 16: mean 0.24 per layer, 3 layers
    "system.capability_profile": "uniform",
}


@pytest.mark.parametrize("algorithm", ["fedavg", "salf", "drop"])
def test_time_budget_is_never_exceeded(tmp_path, algorithm):
    result = run(make_config({**BUDGET, "algorithm.name": algorithm}), tmp_path / algorithm)
    summary = result.summary
    assert summary["stopped_by"] == "time_budget" and summary["finished"]
    assert 0 < summary["sim_time"] <= 12.0
    assert result.metrics[-1]["test_accuracy"] is not None  # the last round is evaluated


def test_wait_for_all_gets_fewer_rounds_than_salf_under_one_budget(tmp_path):
    fedavg = run(make_config({**BUDGET, "algorithm.name": "fedavg"}), tmp_path / "f").summary
    salf = run(make_config({**BUDGET, "algorithm.name": "salf"}), tmp_path / "s").summary
    assert salf["rounds"] == 20  # 12 / 0.6: every round lasts its deadline
    assert fedavg["rounds"] < salf["rounds"]


def test_budget_stop_survives_resume(tmp_path):
    config = make_config({**BUDGET, "algorithm.name": "fedavg"})
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics and resumed.summary["rounds"] == whole.summary["rounds"]
    again = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert again.metrics == whole.metrics
