"""HeteroFL: width-reduced sub-models for slow clients, averaged element by element over the
clients that hold them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.algorithms.heterofl import HeteroFL, HeteroFLOptions
from fedhet.config import ConfigError, from_dict
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models import FlatModel, build_model
from fedhet.models.width import scaler_hooks, width_mask


def _mask_blocks(flat, mask):
    """The mask cut back into the shapes of the model's parameters."""
    out, offset = [], 0
    for params in flat.layer_params:
        for p in params:
            out.append(mask[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    return out


def _two_sub_model_updates():
    """A 6-8-3 MLP's layout and random parameters, and two updates: 2 on every element of a
    rate-0.5 sub-model, 4 on every element of a rate-0.25 one; also their masks."""
    flat = FlatModel(build_model("mlp", (6,), 3, [8]))
    layout, params = flat.layout, torch.randn(flat.layout.num_params)
    half, quarter = width_mask(layout, 0.5).float(), width_mask(layout, 0.25).float()
    updates = [
        ClientUpdate(0, Coverage(1, 0.5), 1, 10, 0.1, 2.0 * half),
        ClientUpdate(1, Coverage(1, 0.25), 1, 10, 0.1, 4.0 * quarter),
    ]
    return layout, params, half.bool(), quarter.bool(), updates


def _straggler_config(rounds: int, **algorithm):
    return from_dict({
        # the in-process pool, where _run_recording_tasks records each task and update
        "run": {"name": "h", "rounds": rounds, "threads": 1, "pool": "in-process"},
        "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [16, 8]},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "heterofl", **algorithm},
    })  # fmt: skip


def _run_recording_tasks(config, folder):
    """Run ``config``; return (the run's result, every (task, update) the clients handled)."""
    from fedhet.engine.pool import InProcessPool

    seen = []
    original = InProcessPool.run

    def spy(self, tasks, params, buffers):
        updates = list(original(self, tasks, params, buffers))
        seen.extend(zip(tasks, updates, strict=True))
        return iter(updates)

    InProcessPool.run = spy
    try:
        result = RunLoop(config, folder).run()
    finally:
        InProcessPool.run = original
    return result, seen


def test_an_mlp_sub_model_holds_the_leading_units_of_every_hidden_layer():
    flat = FlatModel(build_model("mlp", (64,), 10, [32, 16]))
    w1, b1, w2, b2, w3, b3 = _mask_blocks(flat, width_mask(flat.layout, 0.5))
    assert w1[:16].all() and not w1[16:].any() and b1[:16].all() and not b1[16:].any()
    assert w2[:8, :16].all() and not w2[8:].any() and not w2[:, 16:].any()
    assert w3[:, :8].all() and not w3[:, 8:].any() and b3.all()  # classes stay whole
    assert int(width_mask(flat.layout, 0.5).sum()) == 16 * 64 + 16 + 8 * 16 + 8 + 10 * 8 + 10


def test_a_cnn_sub_model_keeps_channels_and_their_spatial_features_after_the_flatten():
    flat = FlatModel(build_model("cnn2", (1, 28, 28), 10))
    c1, cb1, c2, cb2, f1, fb1, f2, fb2 = _mask_blocks(flat, width_mask(flat.layout, 0.5))
    assert c1[:3].all() and not c1[3:].any()
    assert c2[:3, :3].all() and not c2[3:].any() and not c2[:, 3:].any()
    spatial = f1.shape[1] // 6
    assert f1[:25, : 3 * spatial].all() and not f1[:, 3 * spatial :].any() and not f1[25:].any()
    assert f2[:, :25].all() and not f2[:, 25:].any()


def test_the_masked_full_model_computes_the_sub_model():
    """Zeroing what a rate-0.5 sub-model does not hold and scaling hidden outputs by 1/r gives
    exactly the forward pass of the small network (hidden [16, 8]) with the leading weights."""
    torch.manual_seed(0)
    big = FlatModel(build_model("mlp", (64,), 10, [32, 16]))
    small = FlatModel(build_model("mlp", (64,), 10, [16, 8]))
    with torch.no_grad():
        big.params.mul_(width_mask(big.layout, 0.5))
        for p_small, p_big in zip(small.parameters_from_depth(1), big.parameters_from_depth(1), strict=True):
            p_small.copy_(p_big[tuple(slice(0, n) for n in p_small.shape)])
    assert_same_scaled_forward(big, small, 0.5)


def assert_same_scaled_forward(big, small, rate: float) -> None:
    """The two models, each with HeteroFL's scaler at ``rate``, compute the same outputs."""
    x = torch.randn(5, 64)
    hooks = scaler_hooks(big.model, rate) + scaler_hooks(small.model, rate)
    try:
        torch.testing.assert_close(big.model(x), small.model(x))
    finally:
        for h in hooks:
            h.remove()


def test_every_client_at_rate_1_is_fedavg(tmp_path):
    base = {
        "run": {"name": "h", "rounds": 8, "threads": 1, "seed": 2},
        "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [16]},
        "system": {"model": "full", "deadline": 1.0},
    }
    hetero = RunLoop(from_dict({**base, "algorithm": {"name": "heterofl"}}), tmp_path / "h").run()
    fedavg = RunLoop(from_dict({**base, "algorithm": {"name": "fedavg"}}), tmp_path / "f").run()
    for mine, theirs in zip(hetero.metrics, fedavg.metrics, strict=True):
        assert mine["test_accuracy"] == theirs["test_accuracy"]
        assert mine["test_loss"] == pytest.approx(theirs["test_loss"], abs=1e-6)


def test_elements_are_averaged_over_their_holders_and_unheld_ones_keep_their_value():
    layout, params, half, quarter, updates = _two_sub_model_updates()
    algorithm = HeteroFL(HeteroFLOptions(), None)
    new, _ = algorithm.aggregate(params, torch.zeros(0), updates, {}, None, layout)
    both = quarter
    only_half = half & ~both
    nobody = ~half
    torch.testing.assert_close(new[both], params[both] + 3.0)  # (2 + 4) / 2
    torch.testing.assert_close(new[only_half], params[only_half] + 2.0)
    torch.testing.assert_close(new[nobody], params[nobody])
    assert nobody.any() and only_half.any()


def test_a_client_trains_only_its_sub_model_and_the_rate_fits_the_deadline(tmp_path):
    from fedhet.world import build_world

    config = _straggler_config(3)
    world = build_world(config)
    _, seen = _run_recording_tasks(config, tmp_path / "r")
    rates = {task.coverage.width for task, _ in seen}
    assert 1.0 in rates and rates - {1.0}, rates  # finishers at full width, stragglers reduced
    for task, update in seen:
        outside = ~width_mask(world.flat.layout, task.coverage.width)
        assert not update.delta[outside].any() and update.delta.abs().sum() > 0
    algorithm = HeteroFL(HeteroFLOptions(), None)
    assert algorithm.rate_for(4.0, 1.0) == 0.5 and algorithm.rate_for(100.0, 1.0) == 0.0625
    assert algorithm.rate_for(1000.0, 1.0) is None and algorithm.rate_for(math.inf, 1.0) is None


def test_bad_rates_and_bn_examples_are_refused():
    base = {
        "run": {"name": "h", "rounds": 1, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 2, "fraction": 0.2},
        "system": {"model": "full"},
    }
    for rates in ([0.5], [1.0, 0.0], [1.0, float("nan")], []):
        with pytest.raises(ConfigError, match="algorithm.rates"):
            from_dict({**base, "algorithm": {"name": "heterofl", "rates": rates}})
    with pytest.raises(ConfigError, match="algorithm.bn_examples = -1"):
        from_dict({**base, "algorithm": {"name": "heterofl", "bn_examples": -1}})


def _batchnorm_inputs(flat, x):
    """Each BatchNorm's input on ``x`` in one training-mode pass (batch statistics)."""
    from fedhet.models.batchnorm import BATCHNORMS

    seen = []
    hooks = [
        m.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach().clone()))
        for m in flat.model.modules()
        if isinstance(m, BATCHNORMS)
    ]
    flat.model.train()
    with torch.no_grad():
        flat.model(x)
    for h in hooks:
        h.remove()
    return seen


def test_static_batchnorm_statistics_are_those_of_each_layers_inputs_in_training_mode():
    """With one batch, each BatchNorm's recomputed running mean / variance are the per-channel
    mean / unbiased variance of what that layer sees when the layers before it normalise with
    batch statistics; every other buffer and the parameters are untouched."""
    from fedhet.models.batchnorm import static_batchnorm_buffers

    torch.manual_seed(0)
    flat = FlatModel(build_model("vgg11", (3, 32, 32), 10))
    params = flat.params.clone()
    stale = torch.rand_like(flat.buffers) + 0.5  # statistics far from the right ones
    x = torch.randn(40, 3, 32, 32) * 2 + 1
    buffers = static_batchnorm_buffers(flat, params, stale, x, batch_size=64)
    flat.load(params, stale)
    inputs = _batchnorm_inputs(flat, x)
    flat.load(params, buffers)
    norms = [m for m in flat.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == len(inputs) == 8
    for norm, seen in zip(norms, inputs, strict=True):
        torch.testing.assert_close(norm.running_mean, seen.mean(dim=(0, 2, 3)), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(
            norm.running_var, seen.var(dim=(0, 2, 3), unbiased=True), rtol=1e-4, atol=1e-5
        )
        assert norm.momentum == 0.1  # restored
    torch.testing.assert_close(flat.params, params)


def test_a_sub_models_dropped_channels_stay_zero_through_batchnorm():
    """A rate-1/2 VGG sub-model (elements outside it zeroed, HeteroFL's scaler on): after every
    conv + BatchNorm + ReLU block the channels it does not hold are exactly zero, so the
    masked full model computes the sub-model."""
    torch.manual_seed(1)
    flat = FlatModel(build_model("vgg11", (3, 32, 32), 10))
    mask = width_mask(flat.layout, 0.5)
    with torch.no_grad():
        flat.params.mul_(mask)
    hooks = scaler_hooks(flat.model, 0.5)
    outputs = []
    for block in flat.model.blocks[:-1]:
        block.register_forward_hook(lambda mod, inp, out: outputs.append(out.detach()))
    flat.model.train()
    flat.model(torch.randn(6, 3, 32, 32))
    for h in hooks:
        h.remove()
    for out in outputs:
        kept = math.ceil(out.shape[1] / 2)
        assert not out[:, kept:].any() and out[:, :kept].abs().sum() > 0


def test_heterofl_runs_a_batchnorm_model_with_static_statistics(tmp_path):
    """End to end on VGG-11 and Fashion-MNIST-shaped data: the run's evaluated model carries
    BatchNorm statistics recomputed on the clients' training examples (not aggregated ones),
    and a resumed run equals an uninterrupted one."""
    from fedhet.data.sources import FMNIST_DEBIAN_DIR
    from fedhet.models.batchnorm import static_batchnorm_buffers
    from fedhet.world import build_world

    if not (Path(FMNIST_DEBIAN_DIR) / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST (dataset-fashion-mnist) not installed")
    raw = {
        "run": {"name": "bn", "rounds": 2, "threads": 1, "eval_every": 1},
        "data": {"dataset": "fmnist", "num_clients": 4, "fraction": 0.004},
        "model": {"name": "vgg11"},
        "train": {"batch_size": 8, "lr": 0.05},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "heterofl"},
    }
    config = from_dict(raw)
    result = RunLoop(config, tmp_path / "a").run()
    assert all(row["test_accuracy"] is not None for row in result.metrics)
    world = build_world(config)
    saved = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    x = world.dataset.x_train[np.sort(np.concatenate(world.client_indices))]
    expected = static_batchnorm_buffers(world.flat, saved["params"], world.initial_buffers, x)
    torch.testing.assert_close(saved["buffers"], expected)
    assert not torch.equal(saved["buffers"], world.initial_buffers)
    RunLoop(config, tmp_path / "b").run(stop_after=1)
    resumed = RunLoop(config, tmp_path / "b").run(resume=True)
    assert resumed.metrics == result.metrics


def test_a_sub_models_step_share_counts_each_layers_held_weights_by_hand():
    """MLP 6-8-4-3 at r = 0.5 holds 4x6 of 8x6 first-layer weights, 2x4 of 4x8, 3x2 of 3x4:
    multiply-adds [24, 8, 6] of [48, 32, 12]; a step (forward, weight gradients, input
    gradients above layer 1) costs 2(38 + 38 + 14) of 2(92 + 92 + 44) = 180 / 456, not r^2."""
    from fedhet.models.cost import multiply_adds, sub_model_step_share

    flat = FlatModel(build_model("mlp", (6,), 3, [8, 4]))
    counts = multiply_adds(flat.model, (6,))
    assert counts == [48, 32, 12]
    assert sub_model_step_share(flat.layout, counts, 0.5) == pytest.approx(180 / 456)
    assert sub_model_step_share(flat.layout, counts, 1.0) == pytest.approx(1.0)


def test_the_step_share_is_that_of_the_narrower_network_itself():
    """For an MLP the rate-0.5 sub-model is exactly the network with half the hidden units,
    so its share equals the ratio of the two networks' step FLOPs; for the CNN the share lies
    between r^2 and r (the input channels and the classes stay whole)."""
    from fedhet.models.cost import multiply_adds, sub_model_step_share, training_step_flops

    big = FlatModel(build_model("mlp", (784,), 10, [32, 16]))
    small = build_model("mlp", (784,), 10, [16, 8])
    expected = training_step_flops(multiply_adds(small, (784,)), 1) / training_step_flops(
        multiply_adds(big.model, (784,)), 1
    )
    share = sub_model_step_share(big.layout, multiply_adds(big.model, (784,)), 0.5)
    assert share == pytest.approx(expected) and share > 0.45
    cnn = FlatModel(build_model("cnn2", (1, 28, 28), 10))
    cnn_share = sub_model_step_share(cnn.layout, multiply_adds(cnn.model, (1, 28, 28)), 0.5)
    assert 0.25 < cnn_share < 0.5


def test_the_cost_rule_takes_the_widest_rate_whose_priced_cost_fits():
    """At T_u = 2.1 deadlines r = 0.5 fits when priced at r^2 (0.525) but not at the MLP's
    multiply-add share (0.49 x 2.1 > 1), which then gets r = 0.25; a client that fits the
    deadline trains the full model under either rule."""
    from fedhet.models.cost import multiply_adds

    flat = FlatModel(build_model("mlp", (784,), 10, [32, 16]))
    counts = multiply_adds(flat.model, (784,))
    priced = HeteroFL(HeteroFLOptions(), None)
    squared = HeteroFL(HeteroFLOptions(sub_model_cost="rate-squared"), None)
    costs, square_costs = priced.rate_costs(flat.layout, counts), squared.rate_costs(flat.layout, counts)
    assert square_costs["0.5"] == 0.25 and costs["0.5"] > 0.45 and costs["1.0"] == 1.0
    assert squared.rate_for(2.1, 1.0, square_costs) == 0.5
    assert priced.rate_for(2.1, 1.0, costs) == 0.25
    assert priced.rate_for(0.9, 1.0, costs) == 1.0 and priced.rate_for(2.0, None, costs) == 1.0


def test_the_fixed_rule_gives_every_straggler_the_fixed_rate_fitted_or_not():
    fixed = HeteroFL(HeteroFLOptions(width_rule="fixed"), None)
    assert fixed.rate_for(0.99, 1.0) == 1.0
    assert fixed.rate_for(1.5, 1.0) == 0.5 and fixed.rate_for(1e6, 1.0) == 0.5
    assert fixed.rate_for(math.inf, 1.0) == 0.5  # a straggler that reached no layer trains too
    assert HeteroFL(HeteroFLOptions(width_rule="fixed", fixed_rate=0.25), None).rate_for(3.0, 1.0) == 0.25


def test_padded_aggregation_averages_zero_padded_models_over_all_updates():
    """Two updates, rates 0.5 and 0.25: elements both hold get w + (2 + 4) / 2, elements only
    the rate-0.5 client holds get (w + 2 + 0) / 2, elements nobody holds (0 + 0) / 2 = 0:
    weights outside the sub-models shrink, as the padded reading implies."""
    layout, params, half, quarter, updates = _two_sub_model_updates()
    padded = HeteroFL(HeteroFLOptions(aggregate="padded"), None)
    new, _ = padded.aggregate(params, torch.zeros(0), updates, {}, None, layout)
    both = quarter
    only_half = half & ~both
    nobody = ~half
    torch.testing.assert_close(new[both], params[both] + 3.0)
    torch.testing.assert_close(new[only_half], (params[only_half] + 2.0) / 2)
    torch.testing.assert_close(new[nobody], torch.zeros(int(nobody.sum())))
    full = [ClientUpdate(i, Coverage(1, 1.0), 1, 10, 0.1, torch.full_like(params, float(i))) for i in (1, 3)]
    same, _ = padded.aggregate(params, torch.zeros(0), full, {}, None, layout)
    torch.testing.assert_close(same, params + 2.0)  # all at full width: FedAvg's mean


def test_a_fixed_rate_run_sends_stragglers_half_width_and_records_its_prices(tmp_path):
    # the server knows this round's stragglers (the oracle): every straggler gets the fixed rate
    config = _straggler_config(2, width_rule="fixed", aggregate="padded", planner_knowledge="oracle")
    result, seen = _run_recording_tasks(config, tmp_path / "r")
    widths = [task.coverage.width for task, _ in seen]
    assert sorted(set(widths)) == [0.5, 1.0] and widths.count(0.5) == 2 * 3  # 3 stragglers a round
    assert np.isfinite(result.metrics[-1]["test_loss"])


def test_bad_heterofl_choices_are_refused_in_one_line():
    base = {
        "run": {"name": "h", "rounds": 1, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 2, "fraction": 0.2},
        "system": {"model": "full"},
    }
    for key, value in (
        ("width_rule", "widest"),
        ("sub_model_cost", "flops"),
        ("aggregate", "sum"),
        ("fixed_rate", 0.0),
        ("fixed_rate", 1.5),
        ("fixed_rate", True),
    ):
        with pytest.raises(ConfigError, match=f"algorithm.{key}"):
            from_dict({**base, "algorithm": {"name": "heterofl", key: value}})
