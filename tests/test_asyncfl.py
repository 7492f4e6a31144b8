"""AsyncFL (SALF Sec. IV): a straggler that reached layer d delivers its full update 2 d
rounds late, computed on the model it was sent; fresh and arriving updates are averaged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms.asyncfl import AsyncFL, AsyncFLOptions
from fedhet.algorithms.base import ClientAssignment, RoundContext, RoundPlan
from fedhet.config import ConfigError, from_dict
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage
from fedhet.system import Marginals, Outcomes


def _context(round_index: int, depths: list[int]) -> RoundContext:
    n = len(depths)
    depth = np.array(depths)
    plan = RoundPlan(round_index, 1.0, 0.1, [ClientAssignment(8, 1) for _ in range(n)])
    outcomes = Outcomes(np.ones(n, bool), depth, np.ones(n), np.ones(n))
    marginals = Marginals(np.ones((n, 3)), np.zeros(3), np.ones(n))
    return RoundContext(plan, outcomes, marginals, n, 3)


def test_staleness_follows_a_hand_made_schedule():
    """Round 0: client 0 finishes, client 1 reached layer 2, client 2 layer 3: client 1's
    update arrives in round 4 (staleness 4), client 2's in round 6 (staleness 6); busy
    clients are not asked meanwhile; each round averages what is fresh or due."""
    algorithm = AsyncFL(AsyncFLOptions(), None)
    state = algorithm.init_state(None)
    params = torch.zeros(2)
    deltas = {0: torch.tensor([1.0, 0.0]), 1: torch.tensor([0.0, 4.0]), 2: torch.tensor([8.0, 8.0])}

    def update(c):
        return ClientUpdate(c, Coverage(1), 1, 10, 0.5, deltas[c])

    history = []
    for t in range(7):
        context = _context(t, [1, 2, 3] if t == 0 else [1, 1, 1])
        asked = [c for c in range(3) if algorithm.client_task(context, c, state) is not None]
        history.append(asked)
        params, _ = algorithm.aggregate(
            params, torch.zeros(0), [update(c) for c in asked], state, context, None
        )
    # a client whose update arrives in round t is free again from round t + 1
    assert history == [[0, 1, 2], [0], [0], [0], [0], [0, 1], [0, 1]]
    stale = {entry["round"]: entry["stale"] for entry in state["log"] if entry["stale"]}
    assert stale == {5: [{"client": 1, "staleness": 4}], 7: [{"client": 2, "staleness": 6}]}
    # rounds 1-4: client 0 alone, +(1, 0) each; round 5: client 0 and client 1's stale update,
    # ((1,0) + (0,4)) / 2; round 6: clients 0 and 1 fresh, the same; round 7: clients 0 and 1
    # fresh and client 2's stale update, ((1,0) + (0,4) + (8,8)) / 3
    torch.testing.assert_close(params, torch.tensor([4.0 + 0.5 + 0.5 + 3.0, 2.0 + 2.0 + 4.0]))


def test_the_fresh_reading_counts_a_stragglers_update_at_once_and_rests_it():
    """late_update = "fresh" on the same schedule: who is asked is the same (a straggler that
    reached layer d sits out the next 2 d rounds), but its update, computed on the current
    model, joins the round it was asked in; nothing is stale."""
    algorithm = AsyncFL(AsyncFLOptions(late_update="fresh"), None)
    state = algorithm.init_state(None)
    params = torch.zeros(2)
    deltas = {0: torch.tensor([1.0, 0.0]), 1: torch.tensor([0.0, 4.0]), 2: torch.tensor([8.0, 8.0])}
    history = []
    for t in range(7):
        context = _context(t, [1, 2, 3] if t == 0 else [1, 1, 1])
        asked = [c for c in range(3) if algorithm.client_task(context, c, state) is not None]
        history.append(asked)
        updates = [ClientUpdate(c, Coverage(1), 1, 10, 0.5, deltas[c]) for c in asked]
        params, _ = algorithm.aggregate(params, torch.zeros(0), updates, state, context, None)
    assert history == [[0, 1, 2], [0], [0], [0], [0], [0, 1], [0, 1]]
    assert not any(entry["stale"] for entry in state["log"]) and not state["pending"]
    # round 1: all three, (9, 12) / 3; rounds 2-5: +(1, 0); rounds 6-7: +(0.5, 2)
    torch.testing.assert_close(params, torch.tensor([3.0 + 4.0 + 1.0, 4.0 + 4.0]))
    with pytest.raises(ConfigError, match="algorithm.late_update = 'later'"):
        AsyncFLOptions(late_update="later").validate()


def test_without_stragglers_asyncfl_is_fedavg(tmp_path):
    base = {
        "run": {"name": "a", "rounds": 6, "threads": 1, "seed": 4},
        "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [16]},
        "system": {"model": "full", "deadline": 1.0},
    }
    mine = RunLoop(from_dict({**base, "algorithm": {"name": "asyncfl"}}), tmp_path / "a").run()
    theirs = RunLoop(from_dict({**base, "algorithm": {"name": "fedavg"}}), tmp_path / "f").run()
    assert [r["test_accuracy"] for r in mine.metrics] == [r["test_accuracy"] for r in theirs.metrics]
    assert [r["test_loss"] for r in mine.metrics] == [r["test_loss"] for r in theirs.metrics]


def test_an_asyncfl_run_with_stragglers_resumes_with_updates_in_flight(tmp_path):
    config = from_dict({
        "run": {"name": "a", "rounds": 10, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [16]},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "asyncfl"},
    })  # fmt: skip
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    import json

    report = json.loads((tmp_path / "whole" / "asyncfl.json").read_text())
    assert any(entry["stale"] for entry in report["rounds"])
