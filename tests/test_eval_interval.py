"""``run.eval_interval``: evaluation on one simulated-time grid, whatever a rule's round
lengths. The first round (server step) ending at or after each multiple of the interval is
evaluated, and the last; a rule whose rounds all last the deadline is evaluated at the same
rounds as ``run.eval_every`` = interval / deadline, with the same numbers; an event-driven
rule's short server steps no longer mean more evaluations (finer times to a target) than a
round rule gets in the same budget."""

from __future__ import annotations

import math

import pytest
from conftest import make_config

from fedhet.config import ConfigError
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop

EXPONENTIAL = {
    "run.rounds": 1000,
    "run.time_budget": 12.0,
    "system.model": "exponential",
    "system.deadline": 0.6,
    "system.time_per_sample_layer": 0.015,
    "system.capability_profile": "uniform",
}

GRID_15 = {"run.eval_interval": 1.5, "run.eval_every": 1}  # the base configuration evaluates every 5
GRID_2 = {"run.eval_interval": 2.0, "run.eval_every": 1}


def _evaluated(metrics: list[dict]) -> list[int]:
    return [int(r["round"]) for r in metrics if r.get("test_accuracy") is not None]


def _first_after_each_multiple(metrics: list[dict], interval: float) -> list[int]:
    """The rows the rule says: the first to end at or after each multiple, and the last."""
    expected, reached = [], 0
    for row in metrics:
        multiples = math.floor(row["sim_time"] / interval + 1e-9)
        if multiples > reached:
            expected.append(int(row["round"]))
            reached = multiples
    last = int(metrics[-1]["round"])
    return expected if expected and expected[-1] == last else [*expected, last]


def test_wait_for_all_rounds_of_uneven_length_are_evaluated_on_the_time_grid(tmp_path):
    config = make_config({**EXPONENTIAL, "algorithm.name": "fedavg", **GRID_15})
    metrics = run(config, tmp_path / "grid").metrics
    lengths = {round(b["sim_time"] - a["sim_time"], 6) for a, b in zip(metrics, metrics[1:], strict=False)}
    assert len(lengths) > 3  # the rounds really are of different lengths
    assert _evaluated(metrics) == _first_after_each_multiple(metrics, 1.5)


def test_rounds_of_one_deadline_are_evaluated_as_every_nth_round_with_the_same_numbers(tmp_path):
    # 0.2 s rounds: ten of them add up to 1.9999999999999998 s, which reaches 2 s
    shared = {"run.rounds": 1000, "run.time_budget": 6.0, "system.deadline": 0.2}
    by_rounds = run(make_config({**shared, "run.eval_every": 10}), tmp_path / "rounds").metrics
    by_time = run(make_config({**shared, **GRID_2}), tmp_path / "time").metrics
    assert _evaluated(by_time) == _evaluated(by_rounds) == [10, 20, 30]
    assert by_time == by_rounds


def test_an_event_driven_rule_is_evaluated_once_per_interval_not_every_nth_server_step(tmp_path):
    shared = {"run.rounds": 100000, "run.time_budget": 6.0, "system.deadline": 0.2,
              "algorithm.name": "ringmaster"}  # fmt: skip
    steps = run(make_config({**shared, "run.eval_every": 10}), tmp_path / "steps").metrics
    grid = run(make_config({**shared, **GRID_2}), tmp_path / "grid").metrics
    assert len(grid) == len(steps) > 60  # short server steps: many of them in 6 s
    assert len(_evaluated(steps)) > 6
    assert _evaluated(grid) == _first_after_each_multiple(grid, 2.0) and len(_evaluated(grid)) == 3
    assert grid[-1]["test_accuracy"] == steps[-1]["test_accuracy"]  # the same run, evaluated less


def test_a_resumed_run_evaluates_the_rows_the_whole_run_does(tmp_path):
    config = make_config({**EXPONENTIAL, "algorithm.name": "fedavg", **GRID_15})
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=4)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"run.eval_interval": 2.0, "run.eval_every": 10}, "run.eval_interval = 2 with run.eval_every = 10"),
        ({"run.eval_interval": -1.0, "run.eval_every": 1}, "run.eval_interval"),
        ({"run.eval_interval": float("nan"), "run.eval_every": 1}, "run.eval_interval"),
    ],
)
def test_a_second_cadence_or_a_bad_interval_is_refused_by_name(overrides, words):
    with pytest.raises(ConfigError, match=words):
        make_config(overrides)
