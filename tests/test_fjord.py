"""FjORD: the ordered-dropout sub-model of width p is exactly the first p share of every
hidden layer's units (nested); a client of width p_max trains only inside its sub-model; an
element is averaged over the clients whose p_max holds it, weighted by examples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import config_from

from fedhet.algorithms.fjord import FjORD, FjORDOptions
from fedhet.config import ConfigError
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models.layers import FlatModel
from fedhet.models.width import kept_units, ordered_dropout_hooks, width_mask
from fedhet.models.zoo import mlp


def _forward(model, x, rate):
    handles = ordered_dropout_hooks(model, rate)
    try:
        return model(x)
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("rate", [0.2, 0.5, 0.75, 1.0])
def test_the_width_p_sub_model_is_the_first_p_share_of_every_hidden_layer(rate):
    """Ordered dropout at p equals a network built from the leading ceil(p K) units of each
    hidden layer (weights sliced [:k_out, :k_in]), the classes whole, nothing rescaled."""
    torch.manual_seed(0)
    model = mlp((12,), 5, hidden=[10, 7])
    x = torch.randn(4, 12)
    (w1, b1), (w2, b2), (w3, b3) = [(b[-2].weight, b[-2].bias) if len(b) > 1 else (b[0].weight, b[0].bias)
                                    for b in model.blocks]  # fmt: skip
    k1, k2 = kept_units(10, rate), kept_units(7, rate)
    h = F.relu(x @ w1[:k1].T + b1[:k1])
    h = F.relu(h @ w2[:k2, :k1].T + b2[:k2])
    sliced = h @ w3[:, :k2].T + b3
    assert torch.allclose(_forward(model, x, rate), sliced, atol=1e-6)


def test_sub_models_are_nested_and_equal_the_width_masked_model():
    """Zeroing every element outside width_mask(p) (how a client of p_max holds its
    sub-model) gives the same outputs as ordered dropout at p, and a narrower p inside it is
    unchanged by the zeroing: the sub-model of p is a prefix of that of q > p."""
    torch.manual_seed(1)
    model = mlp((12,), 5, hidden=[10, 7])
    flat = FlatModel(model)
    x = torch.randn(3, 12)
    dropped = _forward(model, x, 0.6)
    narrow = _forward(model, x, 0.3)
    with torch.no_grad():
        flat.params.mul_(width_mask(flat.layout, 0.6))
    assert torch.allclose(model(x), dropped, atol=1e-6)
    assert torch.allclose(_forward(model, x, 0.3), narrow, atol=1e-6)
    assert width_mask(flat.layout, 0.3).le(width_mask(flat.layout, 0.6)).all()


BASE = {
    "run": {"name": "fj", "rounds": 3, "threads": 1, "seed": 4},
    "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.5},
    "model": {"name": "mlp", "hidden": [20, 10]},
    "train": {"batch_size": 8, "local_steps": 3, "lr": 0.1},
    "system": {"model": "per-step", "time_per_sample_step": 0.01, "capability_profile": "list",
               "capabilities": [3.0, 2.0, 1.0, 0.6, 0.3, 0.15], "deadline": 0.3},
    "algorithm": {"name": "fjord"},
}  # fmt: skip


def _config(**sections):
    return config_from(BASE, **sections)


def test_a_client_trains_only_inside_its_sub_model_and_widths_follow_speed(tmp_path):
    from fedhet.world import build_world

    world = build_world(_config())
    rule = world.algorithm
    widths = [
        rule.rate_for(t, 0.3, rule.init_state(world.setting())["rate_cost"]) for t in (0.2, 0.35, 0.6, 5.0)
    ]
    assert widths[0] == 1.0 and widths[0] > widths[1] > widths[2] and widths[3] is None
    # one client's real update at width 0.6: zero outside the mask, not inside
    from fedhet.messages import ClientTask

    task = ClientTask(round=0, client=2, lr=0.1, batch_size=8, local_steps=4, coverage=Coverage(1, 0.6))
    data, rng = world.client_data(2), np.random.default_rng(0)
    update = world.worker.execute(task, world.initial_params, world.initial_buffers, data, {}, rng, rule)
    mask = width_mask(world.flat.layout, 0.6)
    assert torch.all(update.delta[~mask] == 0) and update.delta[mask].abs().sum() > 0


def test_each_element_is_averaged_over_its_holders_weighted_by_examples():
    layout = FlatModel(mlp((4,), 3, hidden=[10])).layout
    rule = FjORD(FjORDOptions(), train=None)
    wide, narrow = width_mask(layout, 1.0), width_mask(layout, 0.2)
    params = torch.zeros(layout.num_params)
    updates = [
        ClientUpdate(0, Coverage(1, 1.0), 1, 30, 0.0, torch.full((layout.num_params,), 1.0)),
        ClientUpdate(1, Coverage(1, 0.2), 1, 10, 0.0, torch.where(narrow, 5.0, 0.0)),
    ]

    class Context:
        pass

    new, _ = rule.aggregate(params, torch.zeros(0), updates, {}, Context(), layout)
    # inside the 0.2 block: (30 * 1 + 10 * 5) / 40 = 2; outside it only client 0 holds: 1
    assert torch.allclose(new[narrow], torch.tensor(2.0))
    assert torch.allclose(new[wide & ~narrow], torch.tensor(1.0))


def test_a_fjord_run_resumes_bit_identically(tmp_path):
    config = _config(run={"rounds": 5})
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=2)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    assert whole.metrics[-1]["participants"] == 5  # the slowest client fits no width


def test_without_distillation_fjord_differs_and_padded_is_refused(tmp_path):
    kd = RunLoop(_config(), tmp_path / "kd").run()
    plain = RunLoop(_config(algorithm={"distillation": False}), tmp_path / "plain").run()
    assert kd.metrics[-1]["train_loss"] != plain.metrics[-1]["train_loss"]
    with pytest.raises(ConfigError, match="algorithm.aggregate"):
        _config(algorithm={"aggregate": "padded"})
