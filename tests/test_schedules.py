"""Learning-rate schedules: the step decay's rate per round, its refusals, and a run that
applies it (the rate each round's clients train with is the one metrics.csv reports)."""

from __future__ import annotations

import re

import pytest
from conftest import make_config

from fedhet.engine.launch import run
from fedhet.errors import ConfigError
from fedhet.schedules import learning_rate


def test_step_decay_multiplies_at_each_milestone():
    """eta_0 d^k with k the milestones at or below the user's round t + 1 (t 0-based)."""
    rates = [learning_rate("step", 0.004, t, milestones=(3, 5), decay=0.5) for t in range(6)]
    assert rates == [0.004, 0.004, 0.002, 0.002, 0.001, 0.001]
    assert learning_rate("step", 0.1, 10) == 0.1  # no milestones: constant


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("lr_milestones", [3, 2], "increasing"),
        ("lr_milestones", [0], "whole numbers >= 1"),
        ("lr_decay", 0.0, "(0, 1]"),
        ("lr_decay", 1.5, "(0, 1]"),
    ],
)
def test_step_schedule_refuses_bad_values(key, value, words):
    with pytest.raises(ConfigError, match=rf"train\.{key}.*{re.escape(words)}"):
        make_config({"train.lr_schedule": "step", f"train.{key}": value})


def test_a_run_trains_with_the_decayed_rate(tmp_path):
    config = make_config(
        {"run.rounds": 4, "run.eval_every": 4, "train.lr": 0.08, "train.lr_schedule": "step",
         "train.lr_milestones": [2, 4], "train.lr_decay": 0.25}
    )  # fmt: skip
    rows = run(config, tmp_path / "step").metrics
    assert [r["lr"] for r in rows] == pytest.approx([0.08, 0.02, 0.02, 0.005])
