"""Ringmaster ASGD (fedhet.algorithms.ringmaster): each arrival applied at once unless its
delay, counted in applied updates, reaches R; a discarded arrival does not age the others;
with R above every delay it is plain asynchronous SGD; a run resumes to the same numbers."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_config

from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.ringmaster import Ringmaster, RingmasterOptions, discarded_count
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate, Coverage


def _steps(threshold: int, arrivals: list[tuple[list[float], int]]):
    """Feed ``arrivals`` ((delta, staleness in server steps), one per server step)."""
    rule = Ringmaster.build(
        RingmasterOptions(delay_threshold=threshold), AlgorithmContext(make_config().train)
    )
    state = rule.aggregation.init_state(None)
    x, empty = torch.zeros(2, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    for version, (delta, staleness) in enumerate(arrivals):
        update = ClientUpdate(version, Coverage(), 1, 10, 0.0, torch.tensor(delta, dtype=torch.float64))
        x, _ = rule.aggregation.apply_buffer(x, empty, [(update, staleness)], state, version)
    return x, state


def test_delays_count_applied_updates_and_stale_ones_are_discarded():
    """R = 2. Server steps 0-4 receive A (sent at step 0: delay 0), B (sent at 0, one update
    applied since: 1), C (sent at 0: 2, discarded), D (sent at 0: still 2, since C applied
    nothing: discarded) and E (sent at step 3: 0). The model is A + B + E."""
    arrivals = [([1.0, 0.0], 0), ([0.0, 1.0], 1), ([5.0, 5.0], 2), ([7.0, 7.0], 3), ([0.5, 0.5], 1)]
    x, state = _steps(2, arrivals)
    assert [entry["delay"] for entry in state["log"]] == [0, 1, 2, 2, 0]
    assert [entry["applied"] for entry in state["log"]] == [True, True, False, False, True]
    assert x.tolist() == pytest.approx([1.5, 1.5])


def test_above_every_delay_it_is_plain_asynchronous_sgd():
    arrivals = [([1.0, 0.0], 0), ([0.0, 1.0], 1), ([5.0, 5.0], 2), ([7.0, 7.0], 3), ([0.5, 0.5], 1)]
    x, state = _steps(10, arrivals)
    assert all(entry["applied"] for entry in state["log"]) and x.tolist() == pytest.approx([13.5, 13.5])


def test_a_ringmaster_run_discards_and_resumes_to_the_same_numbers(tmp_path):
    overrides = {"algorithm.name": "ringmaster", "algorithm.delay_threshold": 3,
                 "system.model": "exponential", "run.rounds": 12}  # fmt: skip
    config = make_config(overrides)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    arrivals = json.loads((tmp_path / "whole" / "ringmaster.json").read_text())["arrivals"]
    assert any(not a["applied"] for a in arrivals) and whole.metrics[-1]["discarded"] > 0
    # the running count is the log's count of discards
    assert whole.metrics[-1]["discarded"] == sum(not a["applied"] for a in arrivals)


def test_a_state_saved_before_the_running_count_counts_its_log():
    """A checkpoint's state from before ``discarded`` was kept: the count starts from its log."""
    _, state = _steps(1, [([1.0, 0.0], 0), ([0.0, 1.0], 1), ([5.0, 5.0], 2), ([7.0, 7.0], 3)])
    expected = sum(not entry["applied"] for entry in state["log"])
    assert expected > 0 and state["discarded"] == expected
    del state["discarded"]
    assert discarded_count(state) == expected and state["discarded"] == expected


def test_bad_options_are_one_line():
    with pytest.raises(ConfigError, match="algorithm.delay_threshold = 0"):
        RingmasterOptions(delay_threshold=0).validate()
