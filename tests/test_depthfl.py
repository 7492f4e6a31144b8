"""DepthFL: a client of depth k updates only blocks 1..k and their classifiers; depth follows
the client's speed under the deadline; each layer is averaged over the clients that hold it;
the model's output is the ensemble of its classifiers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import config_from

from fedhet.algorithms.depthfl import EXITS, consistency_weight
from fedhet.config import ConfigError
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.exits import with_exits
from fedhet.models.layers import FlatModel
from fedhet.models.zoo import mlp
from fedhet.world import build_world

BASE = {
    "run": {"name": "d", "rounds": 3, "threads": 1, "seed": 6},
    "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.5},
    "model": {"name": "mlp-exits", "hidden": [64, 64]},
    "train": {"batch_size": 8, "local_steps": 3, "lr": 0.1},
    "system": {"model": "per-step", "time_per_sample_step": 0.01, "capability_profile": "list",
               "capabilities": [3.0, 2.0, 1.0, 0.6, 0.3, 0.05], "deadline": 0.3},
    "algorithm": {"name": "depthfl"},
}  # fmt: skip


def _config(**sections):
    return config_from(BASE, **sections)


def test_the_ensemble_is_the_mean_of_the_exits_and_exits_stop_where_asked():
    torch.manual_seed(0)
    model = with_exits(mlp((10,), 4, hidden=[8, 6]), (10,), 4)
    x = torch.randn(5, 10)
    exits = model.exits(x)
    assert len(exits) == 3 and len(model.exits(x, 1)) == 1
    assert torch.allclose(model(x), torch.stack(exits).mean(0))
    assert FlatModel(model).layout.exit_levels == (1, 1, 2, 2, 3)


@pytest.mark.parametrize("k", [1, 2])
def test_a_client_of_depth_k_updates_only_blocks_up_to_k_and_their_classifiers(k):
    """Layers of level > k (deeper blocks, their classifiers and the final one) do not move."""
    world = build_world(_config())
    rule = world.algorithm
    task = ClientTask(round=400, client=1, lr=0.1, batch_size=8, local_steps=3, payload={EXITS: k})
    update = world.worker.execute(task, world.initial_params, world.initial_buffers, world.client_data(1), {},
                                  np.random.default_rng(0), rule)  # fmt: skip
    layout = world.flat.layout
    for layer, level in enumerate(layout.exit_levels, start=1):
        moved = update.delta[layout.param_slices.of(layer)].abs().sum() > 0
        assert moved == (level <= k), (layer, level)
    assert update.payload[EXITS] == k


def test_depth_follows_speed_under_the_deadline():
    world = build_world(_config())
    rule = world.algorithm
    costs = rule.init_state(world.setting())["level_cost"]
    assert costs == sorted(costs) and costs[-1] == pytest.approx(1.0)
    # levels 1 and 2 each hold about half of this MLP's multiply-adds, the last classifier 6%
    assert [rule.depth_for(t, 0.3, costs) for t in (0.2, 0.31, 0.4, 100.0)] == [3, 2, 1, None]


def test_each_layer_is_averaged_over_the_clients_holding_it():
    world = build_world(_config())
    rule, layout = world.algorithm, world.flat.layout
    state = rule.init_state(world.setting())
    n = layout.num_params
    updates = [ClientUpdate(0, Coverage(), 1, 5, 0.0, torch.full((n,), 3.0), payload={EXITS: 3}),
               ClientUpdate(1, Coverage(), 1, 5, 0.0, torch.full((n,), 1.0), payload={EXITS: 1})]  # fmt: skip
    new, _ = rule.aggregate(torch.zeros(n), world.initial_buffers, updates, state, None, layout)
    for layer, level in enumerate(layout.exit_levels, start=1):
        expected = 2.0 if level <= 1 else 3.0  # both hold level 1, only client 0 deeper
        assert torch.allclose(new[layout.param_slices.of(layer)], torch.tensor(expected)), layer


def test_the_consistency_weight_ramps_up_as_the_authors():
    assert consistency_weight(1.0, 0, 300) == pytest.approx(np.exp(-5.0))
    assert consistency_weight(2.0, 300, 300) == 2.0 and consistency_weight(2.0, 9, 0) == 2.0


def test_a_depthfl_run_resumes_bit_identically_and_needs_exits(tmp_path):
    config = _config(run={"rounds": 5})
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=2)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    # full times 0.09, 0.14, 0.28, 0.46, 0.92, 5.6 s against 0.3 s: three whole models, one of
    # depth 1 (0.47 x 0.46 s fits), two that fit no depth
    assert [r["participants"] for r in whole.metrics] == [4] * 5
    with pytest.raises(ConfigError, match="needs a model with a classifier after each block"):
        RunLoop(_config(model={"name": "mlp"}), tmp_path / "plain").run()
