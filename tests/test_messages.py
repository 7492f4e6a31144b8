"""Client tasks and updates are plain messages: they survive a round trip through dicts of
NumPy arrays and scalars (what a Flower RecordDict carries), and a client's work depends only
on its message, its data, its state and its own random stream."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, make_config

from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientTask, ClientUpdate, Coverage


def _plain(value) -> bool:
    return isinstance(value, np.ndarray | bool | int | float | str)


@pytest.mark.parametrize("deadline", [None, 2.5])
def test_client_task_round_trips_through_plain_dicts(deadline):
    task = ClientTask(
        round=7,
        client=3,
        lr=0.05,
        batch_size=16,
        local_steps=4,
        coverage=Coverage(2, 0.5),
        deadline=deadline,
        model_round=6,
        kind="train",
        payload={"control": torch.arange(5, dtype=torch.float32), "alpha": 0.1, "tag": "x"},
    )
    data = task.to_dict()
    assert all(_plain(v) for v in data.values()), {k: type(v) for k, v in data.items()}
    back = ClientTask.from_dict(data)
    assert torch.equal(back.payload.pop("control"), task.payload["control"])
    original = dict(task.__dict__, payload={k: v for k, v in task.payload.items() if k != "control"})
    assert back.__dict__ == original


def test_client_update_round_trips_through_plain_dicts():
    update = ClientUpdate(
        client=2,
        coverage=Coverage(3),
        steps=5,
        num_samples=120,
        loss=0.75,
        delta=torch.randn(11),
        delta_buffers=torch.randn(4),
        model_round=9,
        payload={"control_change": torch.randn(11), "grad_sq_norm": 2.5},
    )
    data = update.to_dict()
    assert all(_plain(v) for v in data.values())
    back = ClientUpdate.from_dict(data)
    assert torch.equal(back.delta, update.delta) and torch.equal(back.delta_buffers, update.delta_buffers)
    assert torch.equal(back.payload["control_change"], update.payload["control_change"])
    assert back.payload["grad_sq_norm"] == 2.5
    for key in ("client", "coverage", "steps", "num_samples", "loss", "model_round"):
        assert getattr(back, key) == getattr(update, key)


def test_a_payload_that_cannot_travel_is_refused():
    with pytest.raises(TypeError, match="payload 'bad'"):
        ClientTask(0, 0, 0.1, 1, 1, payload={"bad": [1, 2]}).to_dict()


def _shuffled(seed):
    rng = np.random.default_rng(seed)

    def order(tasks):
        return [tasks[i] for i in rng.permutation(len(tasks))]

    return order


@pytest.mark.parametrize(
    "overrides",
    [
        {"algorithm.name": "salf", "train.momentum": 0.5, "train.keep_momentum": True},
        {
            "algorithm.name": "scaffold",
            "system.model": "per-step",
            "train.local_steps": 3,
            "system.time_per_sample_step": 0.05,
        },  # fmt: skip
        {"algorithm.name": "fedstale", "system.model": "full", "system.participation": "two-group"},
    ],
)
def test_clients_run_in_any_order_give_bit_identical_results(tmp_path, overrides):
    """Each client's random stream comes from (seed, round, client) and updates are
    aggregated in client order, so shuffling the order in which a round's clients run changes
    nothing, to the last bit."""
    config = make_config(
        {"run.rounds": 6, "run.eval_every": 3, "system.step_jitter": 0.3, "system.deadline": 2.0, **overrides}
    )
    straight = run(config, tmp_path / "straight")
    shuffled = run(config, tmp_path / "shuffled", client_order=_shuffled(0))
    reversed_ = run(config, tmp_path / "reversed", client_order=lambda tasks: tasks[::-1])
    assert straight.metrics == shuffled.metrics == reversed_.metrics
    final = [
        torch.load(p / "checkpoint.pt", weights_only=False)["params"]
        for p in (tmp_path / "straight", tmp_path / "shuffled", tmp_path / "reversed")
    ]
    assert torch.equal(final[0], final[1]) and torch.equal(final[0], final[2])


def test_client_state_is_checkpointed_and_resumes_identically(tmp_path):
    """SCAFFOLD's c_i live in the client-state store, which the checkpoint carries."""
    config = make_config(
        {"run.rounds": 8, "run.eval_every": 4, "algorithm.name": "scaffold", "train.local_steps": 2}
    )
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)
    stored = saved["client_states"]
    assert len(stored) >= 5 and set(stored) <= set(range(10))  # clients that have trained
    assert all(s["algorithm/control"].abs().sum() > 0 for s in stored.values())
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics


FORBIDDEN_FOR_ALGORITHMS = ("fedhet.client", "fedhet.engine", "fedhet.data", "fedhet.world", "fedhet.config")


def test_algorithms_depend_only_on_messages_layout_and_marginals():
    """No module under fedhet/algorithms imports the trainer, an engine, the data, the world
    or the config module."""
    offenders = []
    for path in sorted((REPO / "src" / "fedhet" / "algorithms").glob("*.py")):
        tree = ast.parse(Path(path).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith(FORBIDDEN_FOR_ALGORITHMS):
                    offenders.append(f"{path.name}: {name}")
    assert not offenders, offenders
