"""Real short runs: determinism, resume after interruption, learning, run files."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import make_config

from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import FedhetError


def test_same_seed_gives_identical_metrics(tmp_path):
    config = make_config({"run.rounds": 8, "run.eval_every": 2})
    a = run(config, tmp_path / "a").metrics
    b = run(config, tmp_path / "b").metrics
    assert a == b
    c = run(make_config({"run.rounds": 8, "run.eval_every": 2, "run.seed": 2}), tmp_path / "c").metrics
    assert a != c


@pytest.mark.parametrize("algorithm", ["salf", "drop", "fedavg"])
def test_interrupted_run_resumes_to_identical_final_metrics(tmp_path, algorithm):
    overrides = {
        "run.rounds": 10,
        "run.eval_every": 3,
        "algorithm.name": algorithm,
        "train.momentum": 0.5,
        "train.keep_momentum": True,
        "system.model": "exponential",
        "system.time_per_sample_layer": 0.02,
    }
    config = make_config(overrides)
    whole = run(config, tmp_path / "whole")
    partial = RunLoop(config, tmp_path / "cut").run(stop_after=4)
    assert partial.summary["rounds"] == 4 and not (tmp_path / "cut" / "summary.json").exists()
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert resumed.summary["final_test_accuracy"] == whole.summary["final_test_accuracy"]
    with open(tmp_path / "cut" / "metrics.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 10


def test_existing_run_is_not_overwritten_silently(tmp_path):
    config = make_config({"run.rounds": 2})
    run(config, tmp_path / "r")
    with pytest.raises(FedhetError, match="--resume"):
        run(config, tmp_path / "r")
    other = make_config({"run.rounds": 2, "train.lr": 0.5})
    with pytest.raises(FedhetError, match="different configuration"):
        run(other, tmp_path / "r", resume=True)


def test_run_directory_has_the_promised_files(tmp_path):
    result = run(make_config({"run.rounds": 6, "run.eval_every": 3}), tmp_path / "r")
    with open(tmp_path / "r" / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    for column in (
        "round",
        "sim_time",
        "deadline",
        "participants",
        "mean_depth",
        "train_loss",
        "test_accuracy",
    ):
        assert column in rows[0]
    assert rows[0]["test_accuracy"] == "" and rows[2]["test_accuracy"] != ""
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for key in (
        "algorithm",
        "dataset",
        "model",
        "seed",
        "rounds",
        "sim_time",
        "wall_time",
        "final_test_accuracy",
        "best_test_accuracy",
    ):
        assert key in summary
    assert summary == result.summary
    assert (tmp_path / "r" / "config.toml").read_text().count("[run]") == 1


def test_digits_run_learns_well_above_chance(tmp_path):
    config = make_config(
        {
            "run.rounds": 40,
            "run.eval_every": 10,
            "train.local_steps": 5,
            "system.straggler_ratio": 0.5,
            "algorithm.name": "salf",
        }
    )
    summary = run(config, tmp_path / "learn").summary
    assert summary["final_test_accuracy"] > 0.6  # chance is 0.1


def test_wait_for_all_rounds_last_as_long_as_the_slowest_client(tmp_path):
    common = {"run.rounds": 5, "system.straggler_ratio": 0.5}
    fedavg = run(make_config({**common, "algorithm.name": "fedavg"}), tmp_path / "f").metrics
    salf = run(make_config({**common, "algorithm.name": "salf"}), tmp_path / "s").metrics
    assert all(r["round_time"] > 1.0 for r in fedavg)  # stragglers finish after the deadline
    assert all(r["round_time"] <= 1.0 and r["deadline"] == 1.0 for r in salf)
    assert all(r["deadline"] is None and r["mean_depth"] == 1.0 for r in fedavg)
