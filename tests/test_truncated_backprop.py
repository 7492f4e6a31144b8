"""Truncated back-propagation: reached layers get exactly the full backward pass's
gradients; unreached layers get no gradient, are not computed and do not move."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhet.client import SGD, ClientData, LocalTrainer
from fedhet.messages import ClientTask, Coverage
from fedhet.models import FlatModel, build_model

SHAPES = {"mlp": (1, 28, 28), "cnn2": (1, 28, 28), "cnn-fedstale": (1, 28, 28), "vgg11": (1, 28, 28)}


def _flat(name, seed=0):
    torch.manual_seed(seed)
    return FlatModel(build_model(name, SHAPES[name], 10))


def _batch(n=8, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)


@pytest.mark.parametrize("name", list(SHAPES))
def test_reached_layer_gradients_equal_full_backward(name):
    flat = _flat(name)
    x, y = _batch()
    model = flat.model
    model.train()
    full = torch.autograd.grad(F.cross_entropy(model(x), y), flat.parameters_from_depth(1))
    L = flat.num_layers
    for depth in sorted({2, (L + 1) // 2, L}):
        flat.load(flat.params.clone(), flat.buffers.clone())
        reached = flat.parameters_from_depth(depth)
        fired = []
        hooks = [
            p.register_hook(lambda g, fired=fired: fired.append(1))
            for p in flat.parameters_from_depth(1)[: -len(reached)]
        ]
        grads = torch.autograd.grad(F.cross_entropy(model(x, depth), y), reached)
        for h in hooks:
            h.remove()
        assert not fired, "a gradient was computed for an unreached layer"
        for g_trunc, g_full in zip(grads, full[-len(reached) :], strict=True):
            assert torch.allclose(g_trunc, g_full, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_local_training_moves_only_reached_layers_like_full_sgd_restricted(steps, momentum):
    name = "cnn2"
    flat = _flat(name)
    x, y = _batch(40)
    indices = [np.arange(40)]
    worker = LocalTrainer(flat, SGD(momentum=momentum, weight_decay=1e-3))
    params, buffers = flat.params.clone(), flat.buffers.clone()
    depth, lr, batch = 3, 0.1, 8
    task = ClientTask(0, 0, lr, batch, steps, Coverage(depth))
    result = worker.train(task, params, buffers, ClientData(x, y, indices[0]), {}, np.random.default_rng(7))
    trained = flat.params.clone()
    start = flat.param_slices.start(depth)
    assert torch.equal(trained[:start], params[:start])  # unreached layers untouched
    assert not torch.equal(trained[start:], params[start:])
    assert torch.allclose(result.delta, trained[start:] - params[start:])

    # Reference: full forward/backward, then SGD restricted to the reached layers.
    ref = _flat(name)
    ref.load(params, buffers)
    rng = np.random.default_rng(7)
    buf = None
    for _ in range(steps):
        b = rng.choice(40, size=batch, replace=False)
        grads = torch.autograd.grad(F.cross_entropy(ref.model(x[b]), y[b]), ref.parameters_from_depth(1))
        g = torch.cat([t.reshape(-1) for t in grads])[start:] + 1e-3 * ref.params[start:]
        buf = g.clone() if buf is None else buf * momentum + g
        with torch.no_grad():
            ref.params[start:] -= lr * (buf if momentum else g)
    assert torch.allclose(ref.params, trained, atol=1e-5)


def test_depth_beyond_last_layer_does_nothing():
    flat = _flat("mlp")
    x, y = _batch(10)
    worker = LocalTrainer(flat)
    before = flat.params.clone()
    task = ClientTask(0, 0, 0.1, 4, 2, Coverage(flat.num_layers + 1))
    res = worker.train(
        task, before, flat.buffers, ClientData(x, y, np.arange(10)), {}, np.random.default_rng(0)
    )
    assert res.steps == 0 and res.delta.numel() == 0 and torch.equal(flat.params, before)


def test_flat_vector_is_the_model_parameters():
    flat = _flat("vgg11")
    with torch.no_grad():
        flat.params.zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in flat.model.parameters())
    assert flat.buffers.numel() == sum(b.numel() for b in flat.model.buffers() if b.is_floating_point())
    assert flat.num_layers == 9  # eight 3x3 convs + the classifier
