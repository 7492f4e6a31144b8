"""The fast paths must compute exactly what the plain ones do: graph-free 2x2 pooling,
evaluation in small batches, the per-layer cost count, and the thread choice of
``run.threads = "auto"``."""

import pytest
import torch
import torch.nn.functional as F

from fedhet.client import evaluate
from fedhet.config import from_dict
from fedhet.errors import ConfigError
from fedhet.models import FlatModel, build_model
from fedhet.models.cost import multiply_adds, training_step_flops
from fedhet.models.pooling import MaxPool2x2, max_pool_2x2
from fedhet.threads import PARALLEL_STEP_FLOPS, auto_threads, choose_threads, free_cores, set_core_budget


@pytest.mark.parametrize("shape", [(3, 4, 24, 24), (2, 6, 7, 9), (1, 1, 2, 2), (5, 3, 3, 4)])
def test_graph_free_pooling_equals_max_pool2d_including_odd_sizes(shape):
    x = torch.randn(shape)
    assert torch.equal(max_pool_2x2(x), F.max_pool2d(x, 2))
    with torch.no_grad():
        assert torch.equal(MaxPool2x2()(x), F.max_pool2d(x, 2))


def test_pooling_with_autograd_has_max_pool2ds_gradient():
    x = torch.randn(4, 3, 10, 10).relu().requires_grad_()  # ties at zero, as after a ReLU
    g = torch.randn(4, 3, 5, 5)
    (expected,) = torch.autograd.grad(F.max_pool2d(x, 2), x, g)
    (got,) = torch.autograd.grad(MaxPool2x2()(x), x, g)
    assert torch.equal(got, expected)


def test_evaluation_in_batches_matches_one_pass():
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn2", (1, 28, 28), 10))
    x, y = torch.randn(700, 1, 28, 28), torch.randint(0, 10, (700,))
    loss, accuracy = evaluate(flat, flat.params, flat.buffers, x, y).values()
    with torch.no_grad():
        out = torch.nn.Sequential(*flat.model.blocks)(x)
    assert accuracy == pytest.approx(float((out.argmax(1) == y).float().mean()), abs=1e-6)
    assert loss == pytest.approx(float(F.cross_entropy(out, y)), rel=1e-5)


def test_multiply_adds_count_each_layers_convolutions_and_linear_maps():
    model = build_model("cnn2", (1, 28, 28), 10)
    # conv 1->6 5x5 on 28x28 -> 24x24; conv 6->6 5x5 on 12x12 -> 8x8; fc 96->50; fc 50->10
    assert multiply_adds(model, (1, 28, 28)) == [24 * 24 * 6 * 25, 8 * 8 * 6 * 6 * 25, 96 * 50, 50 * 10]
    assert multiply_adds(build_model("mlp", (64,), 10, (32, 16)), (64,)) == [64 * 32, 32 * 16, 16 * 10]


def test_training_step_flops_shrink_with_truncation():
    layers = [100, 200, 300]
    # full: forward 600, weight grads 600, input grads of layers 2 and 3 (500); x2 FLOPs
    assert training_step_flops(layers, batch=2) == 2 * 2 * (600 + 600 + 500)
    # depth 3: forward 600, weight grad of layer 3 only
    assert training_step_flops(layers, batch=1, depth=3) == 2 * (600 + 300)


def test_auto_gives_small_work_one_thread_and_large_work_the_cores_within_a_budget():
    assert auto_threads(PARALLEL_STEP_FLOPS / 10, cores=8) == 1
    assert auto_threads(PARALLEL_STEP_FLOPS * 10, cores=2) == 2
    set_core_budget(1)
    try:
        assert auto_threads(PARALLEL_STEP_FLOPS * 10, cores=2) == 1
    finally:
        set_core_budget(None)
    assert 1 <= free_cores(0.05) <= 10_000


def test_choose_threads_sets_torch():
    before = torch.get_num_threads()
    try:
        assert choose_threads("auto", 1e3) == 1 == torch.get_num_threads()
        assert choose_threads(2, 1e3) == 2 == torch.get_num_threads()
        assert choose_threads(0, 1e9) == 2  # 0 leaves torch as it is
    finally:
        torch.set_num_threads(before)


def test_threads_setting_is_validated():
    assert from_dict({"run": {}}).run.threads == "auto"
    assert from_dict({"run": {"threads": 3}}).run.threads == 3
    for bad in ("many", -1, 1.5, True):
        with pytest.raises(ConfigError, match="run.threads"):
            from_dict({"run": {"threads": bad}})


def test_a_dataset_is_decoded_once_per_process_until_its_files_change(tmp_path):
    import os

    from conftest import write_idx_dataset

    from fedhet.data import load_dataset

    folder = write_idx_dataset(tmp_path / "d", n_train=40, n_test=10, seed=0)
    first = load_dataset("mnist", str(folder))
    assert load_dataset("mnist", str(folder)) is first
    assert load_dataset("mnist", str(folder), normalize="none") is not first
    write_idx_dataset(folder, n_train=40, n_test=10, seed=1)  # new content, same names
    for path in folder.iterdir():  # a different modification time even on coarse clocks
        os.utime(path, ns=(1, 1))
    again = load_dataset("mnist", str(folder))
    assert again is not first and not torch.equal(again.x_train.decoded(), first.x_train.decoded())


def test_finiteness_check_by_sum_agrees_with_the_elementwise_test():
    from fedhet.engine.faults import all_finite

    cases = {
        "finite": torch.randn(1000),
        "nan": torch.tensor([1.0, float("nan"), 2.0]),
        "inf": torch.tensor([1.0, float("inf")]),
        "both infinities": torch.tensor([float("inf"), float("-inf")]),
        "finite but the sum overflows": torch.full((10,), 3e38),
        "empty": torch.zeros(0),
    }
    for name, values in cases.items():
        assert all_finite(values) == bool(torch.isfinite(values).all()), name


def test_evaluation_builds_no_autograd_graph():
    flat = FlatModel(build_model("cnn2", (1, 28, 28), 10))
    seen = []
    handle = flat.model.register_forward_hook(
        lambda module, inputs, output: seen.append(output.requires_grad)
    )
    try:
        evaluate(flat, flat.params, flat.buffers, torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,)))
    finally:
        handle.remove()
    assert seen and not any(seen)


@pytest.mark.parametrize("name", ["cnn2", "cnn-fedstale", "vgg11"])
def test_channels_last_model_computes_the_same_function_and_gradients(name):
    """memory_format = channels_last only reorders conv weights in the flat vector: the same
    initial weights give the same outputs and gradients (up to float rounding)."""
    torch.manual_seed(0)
    plain = FlatModel(build_model(name, (1, 28, 28), 10))
    torch.manual_seed(0)
    fast = FlatModel(build_model(name, (1, 28, 28), 10), channels_last=True)
    conv = next(p for p in fast.model.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(plain.model.parameters(), fast.model.parameters(), strict=True):
        assert torch.equal(a, b)  # same values, another order in memory
    assert torch.equal(torch.sort(plain.params).values, torch.sort(fast.params).values)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    for model in (plain.model, fast.model):
        model.eval()
    out_plain, out_fast = plain.model(x), fast.model(x)
    assert torch.allclose(out_plain, out_fast, atol=1e-4)
    g_plain = torch.autograd.grad(F.cross_entropy(out_plain, y), list(plain.model.parameters()))
    g_fast = torch.autograd.grad(F.cross_entropy(out_fast, y), list(fast.model.parameters()))
    for a, b in zip(g_plain, g_fast, strict=True):
        assert torch.allclose(a, b, atol=1e-4)


def test_channels_last_run_learns_like_the_contiguous_one_and_refuses_heterofl(tmp_path):
    from conftest import make_config

    from fedhet.engine.launch import run
    from fedhet.engine.loop import RunLoop
    from fedhet.world import build_world

    base = {"model.name": "cnn-fedstale", "run.rounds": 12, "run.eval_every": 12, "train.lr": 0.05}
    plain = run(make_config(base), tmp_path / "plain")
    fast_config = make_config({**base, "run.memory_format": "channels_last"})
    fast = run(fast_config, tmp_path / "fast")
    assert abs(fast.summary["final_test_accuracy"] - plain.summary["final_test_accuracy"]) < 0.05
    RunLoop(fast_config, tmp_path / "cut").run(stop_after=5)
    assert RunLoop(fast_config, tmp_path / "cut").run(resume=True).metrics == fast.metrics
    with pytest.raises(ConfigError, match="memory_format"):
        from_dict({"run": {"memory_format": "nhwc"}})
    with pytest.raises(ConfigError, match="heterofl"):
        build_world(make_config({"run.memory_format": "channels_last", "algorithm.name": "heterofl"}))
