"""FedCompass (Li et al., ICLR 2024) on the event-driven driver: its scheduler hands out step
counts from each client's measured seconds per step so that arrival groups finish together.
Checked on a hand-made timeline (the groups, the step counts, the server steps and their
staleness), on the scheduler's late-arrival and latest-time paths, on the aggregation by
hand, and for a bit-identical resume."""

from __future__ import annotations

import json

import pytest
import torch
from test_fedbuff import _config

from fedhet.algorithms.fedcompass import FedCompass, FedCompassOptions
from fedhet.config import ConfigError, TrainConfig
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage

# three clients of capabilities 1.5, 1 and 0.5 (mean 1): a step of batch 8 takes
# 0.125 x 8 / P = 2/3 s, 1 s and 2 s; Q_max = 5, Q_min = 1, lambda = 1.5
TIMELINE = {
    "run": {"rounds": 6},
    "data": {"num_clients": 3},
    "train": {"local_steps": 5},
    "system": {"model": "per-step", "time_per_sample_step": 0.125, "capability_profile": "list",
               "capabilities": [1.5, 1.0, 0.5]},
    "algorithm": {"name": "fedcompass"},
}  # fmt: skip


def test_groups_form_and_arrive_together_on_a_hand_made_timeline(tmp_path):
    """Everyone starts with Q_max = 5 steps and is applied alone on first arrival (t = 10/3,
    5, 10). Client 0 then opens group 0 (5 steps: expected 20/3, latest 25/3); client 1,
    back at t = 5, joins it with floor((20/3 - 5) / 1) = 1 step; the group is one server step
    at t = 20/3. Reassigned fastest first at 20/3: client 0 opens a group expected at 10 and
    client 1 joins it with 3 steps; at t = 10 client 0 completes it, then client 2's first
    arrival is applied alone; client 0 opens a group expected at 40/3, client 1 joins with 3
    steps and client 2 (2 s a step) with floor((40/3 - 10) / 2) = 1."""
    result = RunLoop(_config(**TIMELINE), tmp_path / "r").run()
    report = json.loads((tmp_path / "r" / "fedcompass.json").read_text())
    log = report["server_steps"]
    assert [s["clients"] for s in log] == [[0], [1], [1, 0], [1, 0], [2], [2, 1, 0]]
    assert [s["staleness"] for s in log] == [[0], [1], [0, 1], [0, 0], [4], [0, 1, 1]]
    assert [r["sim_time"] for r in result.metrics] == pytest.approx([10 / 3, 5, 20 / 3, 10, 10, 40 / 3])
    starts = [(s["client"], s["steps"]) for s in report["starts"]]
    assert starts == [(0, 5), (1, 5), (2, 5), (0, 5), (1, 1), (0, 5), (1, 3), (0, 5), (1, 3), (2, 1)]
    assert report["seconds_per_step"] == pytest.approx({"0": 2 / 3, "1": 1.0, "2": 2.0})


def test_a_late_member_leaves_its_group_and_the_latest_time_applies_the_rest():
    """Two clients of 1 s a step: client 0 opens a group (5 steps, expected 5, latest 7.5) and
    client 1 joins it with 5 steps. Client 0 arrives on time and waits; at 7.5 (due) the
    group is applied with client 0 alone; client 1, arriving at 9, is late: it starts again
    at once and its update waits in the general buffer for the next group's step."""
    rule = FedCompass(FedCompassOptions(), TrainConfig(local_steps=5))
    state = {"log": [], "starts": [], "shares": [0.5, 0.5], "groups": {}, "next_group": 0, "single": [],
             "clients": {0: {"speed": 1.0, "group": None}, 1: {"speed": 1.0, "group": None}}}  # fmt: skip
    assert rule.plan_starts(state, [1, 0], 0.0) == [5, 5]
    assert state["groups"][0] == {"members": [0, 1], "arrived": [], "expected": 5.0, "latest": 7.5}
    assert rule.arrive(state, 0, 5.0) is False  # on time: it waits for its group
    assert rule.take(state, [(0, 0)], 5.0) == []
    assert rule.due(state) == 7.5
    assert rule.take(state, [(0, 0)], 7.5) == [0]
    assert rule.arrive(state, 1, 9.0) is True  # late: free at once
    assert state["groups"] == {}
    assert rule.take(state, [(1, 1)], 9.0) == []  # no group is ready: it stays buffered
    # its 9 s for 5 steps make S_1 = 0.1 x 1 + 0.9 x 1.8 = 1.72: it joins the new group with
    # floor((14 - 9) / 1.72) = 2 steps
    assert rule.plan_starts(state, [0, 1], 9.0) == [5, 2]
    assert state["clients"][1]["speed"] == pytest.approx(1.72)
    rule.arrive(state, 0, 14.0)
    rule.arrive(state, 1, 14.0)
    assert rule.take(state, [(1, 1), (0, 0), (1, 0)], 14.0) == [0, 1, 2]  # the general buffer too


def _update(client: int, delta: list[float]) -> ClientUpdate:
    return ClientUpdate(client, Coverage(), 1, 10, 0.5, torch.tensor(delta))


def test_a_group_step_moves_the_model_toward_each_local_model_by_hand():
    """x + sum_i alpha s(tau_i) p_i (x_tau_i + Delta_i - x) with polynomial s = (1 + tau)^-1/2."""
    rule = FedCompass(FedCompassOptions(alpha=0.8, staleness="polynomial"), TrainConfig())
    state = {"log": [], "shares": [0.25, 0.75]}
    x = torch.tensor([1.0, 2.0])
    sent = torch.tensor([0.0, 0.0])
    arrivals = [
        (_update(0, [2.0, 0.0]), 0, x, torch.zeros(0)),
        (_update(1, [4.0, 4.0]), 3, sent, torch.zeros(0)),
    ]
    new, _ = rule.apply_models(x, torch.zeros(0), arrivals, state, 0)
    expected = x + 0.8 * 0.25 * torch.tensor([2.0, 0.0]) + 0.8 * 0.5 * 0.75 * (torch.tensor([4.0, 4.0]) - x)
    assert torch.allclose(new, expected)


def test_a_fedcompass_run_resumes_bit_identically(tmp_path):
    config = _config(
        run={"rounds": 10},
        train={"local_steps": 4},
        system={"model": "per-step", "time_per_sample_step": 0.1, "capability_profile": "uniform",
                "step_jitter": 0.3},
        algorithm={"name": "fedcompass", "staleness": "polynomial"},
    )  # fmt: skip
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=4)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    assert (tmp_path / "cut" / "fedcompass.json").read_text() == (
        tmp_path / "whole" / "fedcompass.json"
    ).read_text()


@pytest.mark.parametrize(
    ("options", "key"),
    [({"min_ratio": 0.0}, "min_ratio"), ({"latest_factor": 0.5}, "latest_factor"), ({"alpha": 1.5}, "alpha"),
     ({"speed_momentum": 0.0}, "speed_momentum"), ({"max_steps": -1}, "max_steps"),
     ({"weights": "x"}, "weights")],
)  # fmt: skip
def test_bad_fedcompass_options_are_refused(options, key):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _config(algorithm={"name": "fedcompass", **options})
