"""FedAWE (fedhet.algorithms.fedawe): the server averages where the round's clients start
and adds the clipped mean of each innovation times the rounds since its client last took
part; a client's local steps start from the model of the round after its last
participation (the trainer's start_point); with every client in every round it is FedAvg;
a run resumes to the same numbers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.fedawe import FedAWE, FedAWEOptions
from fedhet.client.group import Member
from fedhet.client.state import ClientData
from fedhet.client.trainer import LocalTrainer
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.layers import FlatModel
from fedhet.models.zoo import build_model


def _rule(clip: float):
    return FedAWE.build(FedAWEOptions(echo_clip=clip), AlgorithmContext(make_config().train))


def _setting(clients: int):
    return SimpleNamespace(num_clients=clients, params=torch.zeros(2, dtype=torch.float64))


def _round(rule, state, t: int, innovations: dict[int, list[float]]):
    params, empty = torch.zeros(2, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    updates = [ClientUpdate(c, Coverage(), 1, 10, 0.0, torch.tensor(g, dtype=torch.float64))
               for c, g in innovations.items()]  # fmt: skip
    context = SimpleNamespace(plan=SimpleNamespace(round=t))
    layout = SimpleNamespace(buffer_slices=None)
    new, _ = rule.aggregation.aggregate(params, empty, updates, state, context, layout)
    return new


def test_gossip_and_echo_by_hand():
    """x^0 = 0, three clients, no clip. Round 0: clients 0, 1 (echo 1 each) with innovations
    (1, 0), (0, 2): x^1 = (0.5, 1). Round 1: client 2 alone, absent since the start (echo 2),
    innovation (2, 2) from x^0: x^2 = 0 + 2 (2, 2) = (4, 4). Round 2: client 0 (starts at
    x^1, echo 2, innovation (1, 1)) and client 2 (starts at x^2, echo 1, innovation (0, -2)):
    x^3 = mean(x^1, x^2) + mean(2 (1, 1), (0, -2)) = (2.25, 2.5) + (1, 0) = (3.25, 2.5).
    Kept models: those some client starts from, x^1 (client 1) and x^3 (clients 0, 2)."""
    rule = _rule(0.0)
    state = rule.aggregation.init_state(_setting(3))
    assert _round(rule, state, 0, {0: [1.0, 0.0], 1: [0.0, 2.0]}).tolist() == [0.5, 1.0]
    assert _round(rule, state, 1, {2: [2.0, 2.0]}).tolist() == [4.0, 4.0]
    assert state["awe_echo"] == [2]
    assert _round(rule, state, 2, {0: [1.0, 1.0], 2: [0.0, -2.0]}).tolist() == pytest.approx([3.25, 2.5])
    assert state["awe_echo"] == [2, 1] and state["awe_last"].tolist() == [2, 0, 2]
    assert sorted(state["awe_models"]) == [0, 2] and state["awe_models"][0].tolist() == [0.5, 1.0]


def test_the_mean_echoed_innovation_is_clipped_to_echo_clip():
    rule = _rule(0.5)
    state = rule.aggregation.init_state(_setting(2))
    new = _round(rule, state, 0, {0: [3.0, 0.0], 1: [0.0, 4.0]})  # mean (1.5, 2), norm 2.5
    assert new.tolist() == pytest.approx([0.3, 0.4])


def test_local_steps_start_from_the_clients_own_model():
    """The trainer with FedAWE's client part trains from the task's start and returns
    w_u - start: the same as training from that model sent as the global one."""
    torch.manual_seed(0)
    flat = FlatModel(build_model("mlp", (1, 2, 2), 3, [5]))
    trainer = LocalTrainer(flat)
    sent, buffers = flat.params.detach().clone(), flat.buffers.detach().clone()
    start = sent + 0.3 * torch.randn_like(sent)
    data = ClientData(torch.randn(20, 1, 2, 2), torch.randint(0, 3, (20,)), np.arange(20))
    task = ClientTask(round=0, client=0, lr=0.1, batch_size=5, local_steps=3, payload={"start": start})
    rule = _rule(0.5).client

    def delta(params, rule, task):
        member = Member(task, data, {}, np.random.default_rng(1))
        return trainer.train_group([member], params, buffers, rule)[0].delta

    ours = delta(sent, rule, task)
    plain = delta(start, None, ClientTask(round=0, client=0, lr=0.1, batch_size=5, local_steps=3))
    torch.testing.assert_close(ours, plain)
    assert not torch.allclose(ours, delta(sent, None, ClientTask(round=0, client=0, lr=0.1, batch_size=5,
                                                                 local_steps=3)))  # fmt: skip


def test_with_every_client_every_round_it_is_fedavg(tmp_path):
    base = {"system.model": "full", "system.deadline": 1.0, "train.local_steps": 2, "run.rounds": 4,
            "algorithm.echo_clip": 0.0}  # fmt: skip
    awe = run(make_config({**base, "algorithm.name": "fedawe"}), tmp_path / "awe")
    base.pop("algorithm.echo_clip")
    avg = run(make_config({**base, "algorithm.name": "drop"}), tmp_path / "drop")
    for a, b in zip(awe.metrics, avg.metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5) and a["mean_echo"] == 1.0


def test_a_fedawe_run_echoes_absences_and_resumes_to_the_same_numbers(tmp_path):
    overrides = {"algorithm.name": "fedawe", "system.model": "full", "system.deadline": 1.0, "run.rounds": 12,
                 "system.participation": "two-group", "system.participation_min": 0.2}  # fmt: skip
    config = make_config(overrides)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert max(row["mean_echo"] for row in whole.metrics) > 1 and whole.metrics[-1]["start_models"] > 1


def test_bad_options_are_one_line():
    with pytest.raises(ConfigError, match="algorithm.echo_clip = -1"):
        FedAWEOptions(echo_clip=-1).validate()
    with pytest.raises(ConfigError, match="algorithm.echo_lr = 0"):
        FedAWEOptions(echo_lr=0).validate()
