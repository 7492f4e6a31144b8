"""SLT (fedhet.algorithms.slt): a constrained client freezes the layers below the stage's,
trains that layer whole and a width-reduced head above it; the configuration's price counts
the frozen layers' forward pass; the server averages each element over the clients that
trained it; the stage moves from the input to the output; a run resumes to the same numbers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.slt import SLT, SLTOptions, stage_costs
from fedhet.client.group import Member
from fedhet.client.state import ClientData
from fedhet.client.trainer import LocalTrainer
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.cost import multiply_adds
from fedhet.models.layers import FlatModel
from fedhet.models.width import width_mask
from fedhet.models.zoo import build_model

# an MLP 4 -> 6 -> 4 -> 3: weights [6, 4], [4, 6], [3, 4] (+ biases); multiply-adds 24, 24, 12
MODEL = build_model("mlp", (1, 2, 2), 3, [6, 4])


def _layout():
    return FlatModel(build_model("mlp", (1, 2, 2), 3, [6, 4])).layout


def test_the_layers_up_to_the_stage_keep_their_width_and_the_head_is_narrow():
    """full_layers = 2, rate 0.5: layers 1 and 2 whole, so the output layer reads all of
    layer 2's units: everything is held. full_layers = 1: layer 2 keeps 2 of its 4 units and
    reads all 6 inputs; layer 3 keeps its 3 classes and reads those 2 units."""
    layout = _layout()
    assert bool(width_mask(layout, 0.5, 0, 2).all())
    mask = width_mask(layout, 0.5, 0, 1)
    sizes = [24 + 6, 24 + 4, 12 + 3]  # each layer's weight and bias
    first, second, third = torch.split(mask, sizes)
    assert bool(first.all())
    assert int(second[:24].sum()) == 2 * 6 and int(second[24:].sum()) == 2  # 2 units x 6 inputs, 2 biases
    assert int(third[:12].sum()) == 3 * 2 and bool(third[12:].all())  # 3 classes x 2 inputs, 3 biases


def test_stage_prices_by_hand():
    """Full step FLOPs per example: 2 (forward 60 + weight grads 60 + input grads 24 + 12)
    = 312. Stage 1 at s = 0.5: layers' held shares 1, 1/2, 1/2 -> scaled 24, 12, 6 and
    2 (42 + 42 + 18) = 204: 204/312. Stage 2 (the head is the output layer: width 1 only):
    2 (60 + 36 + 12) = 216. Stage 3: 2 (60 + 12) = 144."""
    mads = multiply_adds(MODEL, (1, 2, 2))
    assert mads == [24, 24, 12]
    costs = stage_costs(_layout(), mads, [1.0, 0.5])
    assert costs[1] == pytest.approx({1.0: 1.0, 0.5: 204 / 312})
    assert costs[2] == pytest.approx({1.0: 216 / 312}) and costs[3] == pytest.approx({1.0: 144 / 312})


def test_a_configuration_trains_only_its_layer_and_its_head():
    flat = FlatModel(build_model("mlp", (1, 2, 2), 3, [6, 4]))
    trainer = LocalTrainer(flat)
    params, buffers = flat.params.detach().clone(), flat.buffers.detach().clone()
    data = ClientData(torch.randn(20, 1, 2, 2), torch.randint(0, 3, (20,)), np.arange(20))
    task = ClientTask(round=0, client=0, lr=0.5, batch_size=5, local_steps=3, coverage=Coverage(2, 0.5, 0, 2))
    update = trainer.train_group([Member(task, data, {}, np.random.default_rng(0))], params, buffers)[0]
    assert update.delta.numel() == 28 + 15  # layers 2 and 3: frozen layer 1 is not in it
    # the head is the output layer, whole: the same as SALF's cut at depth 2 at full width
    plain = ClientTask(round=0, client=0, lr=0.5, batch_size=5, local_steps=3, coverage=Coverage(2))
    same = trainer.train_group([Member(plain, data, {}, np.random.default_rng(0))], params, buffers)[0]
    torch.testing.assert_close(update.delta, same.delta)
    # stage 1 at s = 0.5, one step on all 20 examples, by hand: layer 1 whole, layer 2 keeps
    # 2 of its 4 units (outputs divided by s, HeteroFL's scaler), the output reads those 2
    stage_one = Coverage(1, 0.5, 0, 1)
    task = ClientTask(round=0, client=0, lr=0.5, batch_size=20, local_steps=1, coverage=stage_one)
    update = trainer.train_group([Member(task, data, {}, np.random.default_rng(0))], params, buffers)[0]
    mask = width_mask(flat.layout, 0.5, 0, 1).float()
    w = (params * mask).clone().requires_grad_(True)
    w1, b1, w2, b2, w3, b3 = torch.split(w, [24, 6, 24, 4, 12, 3])
    h1 = torch.relu(data.x.reshape(20, 4) @ w1.view(6, 4).T + b1)
    h2 = torch.relu((h1 @ w2.view(4, 6).T + b2) / 0.5)
    loss = torch.nn.functional.cross_entropy(h2 @ w3.view(3, 4).T + b3, data.y)
    (grad,) = torch.autograd.grad(loss, w)
    torch.testing.assert_close(update.delta, -0.5 * grad * mask)


def test_each_element_is_averaged_over_the_clients_that_trained_it():
    """A full-model update of 1s and a stage-2 update of 3s (layers 2 and 3): layer 1 moves
    by 1 (one holder), layers 2 and 3 by 2 (the mean of both)."""
    layout = _layout()
    rule = SLT.build(SLTOptions(), AlgorithmContext(make_config().train))
    params, empty = torch.zeros(layout.num_params), torch.zeros(0)
    updates = [ClientUpdate(0, Coverage(), 1, 10, 0.0, torch.ones(layout.num_params)),
               ClientUpdate(1, Coverage(2, 1.0, 0, 2), 1, 10, 0.0, torch.full((43,), 3.0))]  # fmt: skip
    state = {"slt_stage": 1}
    context = SimpleNamespace(plan=SimpleNamespace(record={"slt_stage": 2}))
    new, _ = rule.aggregation.aggregate(params, empty, updates, state, context, layout)
    assert new[:30].tolist() == [1.0] * 30 and new[30:].tolist() == [2.0] * 43 and state["slt_stage"] == 2


def test_stages_move_to_the_output_and_a_run_resumes_to_the_same_numbers(tmp_path):
    overrides = {"algorithm.name": "slt", "algorithm.stage_rounds": 4, "run.rounds": 12,
                 "train.local_steps": 2, "system.model": "per-step", "system.time_per_sample_step": 0.01,
                 "system.deadline": 0.3,
                 "system.capability_profile": "uniform", "system.capability_low": 0.1,
                 "system.capability_high": 2.0}  # fmt: skip
    config = make_config(overrides)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert [row["slt_stage"] for row in whole.metrics] == [1.0] * 4 + [2.0] * 4 + [3.0] * 4
    clients = whole.summary.get("bytes_down") or 0
    assert clients > 0


def test_the_run_is_split_over_the_stages_by_its_rounds_or_its_time_budget():
    rule = SLT.build(SLTOptions(), AlgorithmContext(make_config().train))
    state = {"slt_rounds": 100, "slt_time_budget": 0.0, "slt_layers": 3}
    assert rule.planner.stage_rounds(state, 0.2) == 34
    state.update(slt_rounds=100_000, slt_time_budget=30.0)
    assert rule.planner.stage_rounds(state, 0.2) == 50  # 150 rounds of 0.2 s in 30 s


def test_bad_options_are_one_line():
    with pytest.raises(ConfigError, match="algorithm.stage_rounds = -1"):
        SLTOptions(stage_rounds=-1).validate()
    with pytest.raises(ConfigError, match="algorithm.rates"):
        SLTOptions(rates=[0]).validate()
