"""FedRolex (Alam et al., NeurIPS 2022): HeteroFL's sub-models with a window of units that
rolls one unit per round; the window's mask by hand, the masked full model computing the
rolled small network, each client training exactly its round's window, and a bit-identical
resume."""

from __future__ import annotations

import torch
from test_heterofl import _mask_blocks, _run_recording_tasks, _straggler_config, assert_same_scaled_forward

from fedhet.engine.loop import RunLoop
from fedhet.models import FlatModel, build_model
from fedhet.models.width import kept_indices, width_mask


def test_the_window_of_round_t_holds_units_t_to_t_plus_k_mod_k_of_every_hidden_layer():
    flat = FlatModel(build_model("mlp", (6,), 3, [8, 4]))
    assert kept_indices(8, 0.5, 6).tolist() == [6, 7, 0, 1] and kept_indices(4, 0.5, 6).tolist() == [2, 3]
    w1, b1, w2, b2, w3, b3 = _mask_blocks(flat, width_mask(flat.layout, 0.5, offset=6))
    rows1, rows2 = [6, 7, 0, 1], [2, 3]
    assert w1[rows1].all() and int(w1.sum()) == 4 * 6 and b1[rows1].all() and int(b1.sum()) == 4
    assert w2[rows2][:, rows1].all() and int(w2.sum()) == 2 * 4 and int(b2.sum()) == 2
    assert w3[:, rows2].all() and int(w3.sum()) == 3 * 2 and b3.all()  # classes stay whole
    assert torch.equal(width_mask(flat.layout, 0.5, offset=0), width_mask(flat.layout, 0.5))  # HeteroFL's
    assert torch.equal(width_mask(flat.layout, 0.5, offset=8), width_mask(flat.layout, 0.5))  # a full turn


def test_a_cnn_window_keeps_its_channels_spatial_features_after_the_flatten():
    flat = FlatModel(build_model("cnn2", (1, 28, 28), 10))
    c1, _, c2, _, f1, _, f2, _ = _mask_blocks(flat, width_mask(flat.layout, 0.5, offset=4))
    channels = kept_indices(6, 0.5, 4).tolist()  # [4, 5, 0], of both conv layers' 6
    assert c1[channels].all() and int(c1.sum()) == 3 * c1[0].numel()
    assert c2[channels][:, channels].all() and int(c2.sum()) == 3 * 3 * c2[0, 0].numel()
    spatial = f1.shape[1] // 6
    columns = [c * spatial + s for c in channels for s in range(spatial)]
    units = kept_indices(f1.shape[0], 0.5, 4).tolist()
    assert f1[units][:, columns].all() and int(f1.sum()) == len(units) * len(columns)
    assert f2[:, units].all() and int(f2.sum()) == f2.shape[0] * len(units)


def test_the_masked_full_model_computes_the_rolled_small_network():
    torch.manual_seed(0)
    big = FlatModel(build_model("mlp", (64,), 10, [32, 16]))
    small = FlatModel(build_model("mlp", (64,), 10, [16, 8]))
    first, second = kept_indices(32, 0.5, 21), kept_indices(16, 0.5, 21)
    with torch.no_grad():
        big.params.mul_(width_mask(big.layout, 0.5, offset=21))
        w1, b1, w2, b2, w3, b3 = big.parameters_from_depth(1)
        picked = [w1[first], b1[first], w2[second][:, first], b2[second], w3[:, second], b3]
        for p_small, p_big in zip(small.parameters_from_depth(1), picked, strict=True):
            p_small.copy_(p_big)
    assert_same_scaled_forward(big, small, 0.5)


def test_each_straggler_trains_its_rounds_window_and_a_run_resumes_bit_identically(tmp_path):
    from fedhet.world import build_world

    config = _straggler_config(4, name="fedrolex")
    layout = build_world(config).flat.layout
    _, seen = _run_recording_tasks(config, tmp_path / "r")
    rolled = [(task, update) for task, update in seen if task.coverage.width < 1.0]
    assert rolled and {task.coverage.offset for task, _ in rolled} <= set(range(4))  # offset = round
    for task, update in rolled:
        assert update.coverage.offset == task.coverage.offset
        outside = ~width_mask(layout, task.coverage.width, task.coverage.offset)
        assert not update.delta[outside].any() and update.delta.abs().sum() > 0
    assert len({task.coverage.offset for task, _ in rolled}) > 1  # the window moved between rounds
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=2)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    heterofl = RunLoop(_straggler_config(4), tmp_path / "heterofl").run()
    assert heterofl.metrics != whole.metrics
