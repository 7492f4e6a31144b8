"""REFL's staleness-aware aggregation (Abdelmoniem et al., EuroSys 2023): a straggler keeps
training past the deadline and its update joins the round it arrives in, weighted by
(1 - beta) / (tau + 1) + beta (1 - exp(-Lambda / Lambda_max) / kappa). Checked against a
hand computation of the weights, on a hand-made timeline of late arrivals, and for a
bit-identical resume with updates still on their way."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_fedbuff import _config

from fedhet.algorithms.refl import REFL, stale_weights
from fedhet.config import ConfigError
from fedhet.engine.loop import RunLoop


def test_stale_weights_by_hand():
    """Fresh (1, 1) and (1, -1): S = (2, 0), mean (1, 0). Stale (0, 2), 1 round old:
    ||(2, 2)/3 - (1, 0)||^2 = 5/9; stale (4, 0), 3 rounds old: ||(2, 0) - (1, 0)||^2 = 1."""
    stale = [(torch.tensor([0.0, 2.0]), 1), (torch.tensor([4.0, 0.0]), 3)]
    weights = stale_weights(torch.tensor([2.0, 0.0]), 2, stale, beta=0.35, kappa=1.0)
    expected = [0.65 / 2 + 0.35 * (1 - math.exp(-5 / 9)), 0.65 / 4 + 0.35 * (1 - math.exp(-1.0))]
    assert weights == pytest.approx(expected)
    # kappa scales the boost down; with no fresh update Lambda / Lambda_max is taken as 1
    assert stale_weights(None, 0, stale[:1], 0.5, 2.0) == pytest.approx([0.25 + 0.5 * (1 - math.exp(-1) / 2)])


def test_lateness_counts_the_rounds_a_straggler_spans():
    assert [REFL.Aggregation.lateness(f, 2.0) for f in (1.0, 2.0, 2.5, 4.0, 8.0)] == [0, 0, 1, 1, 3]
    assert REFL.Aggregation.lateness(9.0, None) == 0


# four clients of capabilities 1.5, 1.5, 0.75 and 0.25 (mean 1): two steps of batch 8 take
# 4/3, 4/3, 8/3 and 8 s against a deadline of 2 s
TIMELINE = {
    "run": {"rounds": 4},
    "train": {"local_steps": 2},
    "system": {"model": "per-step", "time_per_sample_step": 0.125, "capability_profile": "list",
               "capabilities": [1.5, 1.5, 0.75, 0.25], "deadline": 2.0},
    "algorithm": {"name": "refl"},
}  # fmt: skip


def test_late_updates_join_the_round_they_arrive_in(tmp_path):
    """Client 2 (8/3 s) arrives one round late, client 3 (8 s) three; neither is asked while
    its update is on its way, so client 2 trains again in round 3 and both arrive in 4."""
    RunLoop(_config(**TIMELINE), tmp_path / "r").run()
    log = json.loads((tmp_path / "r" / "refl.json").read_text())["rounds"]
    assert [r["fresh"] for r in log] == [[0, 1]] * 4
    assert [[(s["client"], s["staleness"]) for s in r["stale"]] for r in log] == [
        [],
        [(2, 1)],
        [],
        [(3, 3), (2, 1)],
    ]
    assert all(0 < s["weight"] <= 1 for r in log for s in r["stale"])


def test_a_refl_run_resumes_bit_identically_with_updates_on_their_way(tmp_path):
    config = _config(**{**TIMELINE, "run": {"rounds": 8}})
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    assert (tmp_path / "cut" / "refl.json").read_text() == (tmp_path / "whole" / "refl.json").read_text()


@pytest.mark.parametrize(
    ("options", "key"),
    [({"beta": 1.5}, "beta"), ({"kappa": 0.5}, "kappa"), ({"max_staleness": -1}, "max_staleness")],
)
def test_bad_refl_options_are_refused(options, key):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _config(algorithm={"name": "refl", **options})
