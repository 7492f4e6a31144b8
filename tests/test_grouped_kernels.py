"""The grouped kernels (fedhet.client.grouped): a group's forward and backward pass in
batched kernels gives each client the loss, gradient and BatchNorm statistics of its own
computation on the working model, for the layer types of the zoo."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhet.client.group import GroupGradients
from fedhet.client.grouped import GroupedForward
from fedhet.data.task import Classification
from fedhet.models.layers import FlatModel
from fedhet.models.zoo import char_mlp, cnn2, mlp, vgg


def _one_at_a_time(flat: FlatModel, rows, buffer_rows, x, y, depth: int):
    """Each row loaded into the working model, its loss and covered-region gradient."""
    losses, grads, buffers = [], [], []
    for i in range(len(rows)):
        flat.load(rows[i], buffer_rows[i])
        flat.model.train()
        loss = F.cross_entropy(flat.model(x[i], depth), y[i])
        parts = torch.autograd.grad(loss, flat.parameters_from_depth(depth))
        losses.append(float(loss.detach()))
        grads.append(torch.cat([g.reshape(-1) for g in parts]))
        buffers.append(flat.buffers.clone())
    return torch.tensor(losses), torch.stack(grads), torch.stack(buffers)


@pytest.mark.parametrize(
    ("make", "shape"),
    [(mlp, (1, 28, 28)), (cnn2, (1, 28, 28)), (lambda s, c: vgg(s, c, "vgg11"), (3, 32, 32))],
    ids=["mlp", "cnn2", "vgg11-batchnorm"],
)
def test_grouped_kernels_give_each_client_its_own_gradient_loss_and_statistics(make, shape):
    torch.manual_seed(0)
    flat = FlatModel(make(shape, 10))
    engine = GroupGradients(flat, Classification())
    assert engine.kernels.reason() is None
    count, batch = 4, 6
    rows = flat.params.detach().unsqueeze(0).repeat(count, 1) + 0.05 * torch.randn(count, flat.params.numel())
    buffer_rows = flat.buffers.detach().unsqueeze(0).repeat(count, 1)
    x, y = torch.randn(count, batch, *shape), torch.randint(0, 10, (count, batch))
    for depth in (1, 2, flat.num_layers):
        start = flat.param_slices.from_depth(depth).start
        grouped_buffers = buffer_rows.clone()
        grads, losses = engine._grouped(rows, grouped_buffers, start, x, y, depth)
        want_losses, want_grads, want_buffers = _one_at_a_time(flat, rows, buffer_rows.clone(), x, y, depth)
        assert grads.shape == want_grads.shape
        # float32 sums in another order: each row within 1e-4 of its norm; in the deep
        # BatchNorm network a rounding-sized difference can flip a ReLU whose input is about
        # 0 (a row then differs by ~1e-3, as far from float64 as from the working model),
        # so there most rows must agree to 1e-4 and every row to 1e-2
        error = (grads - want_grads).norm(dim=1) / want_grads.norm(dim=1)
        tight = int((error < 1e-4).sum())
        assert tight == count or (flat.buffers.numel() and tight >= count - 1 and error.max() < 1e-2), error
        torch.testing.assert_close(torch.tensor(losses), want_losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grouped_buffers, want_buffers, rtol=1e-5, atol=1e-6)


def test_a_layer_the_kernels_do_not_know_or_a_hooked_module_goes_to_vmap():
    """An embedding is not batched by the kernels (the reason names it); a sub-model's
    scaler hook on a module sends the group to vmap while it is on."""
    embedding = GroupedForward(FlatModel(char_mlp((10,), 5)))
    assert "CharEmbedding" in (embedding.reason() or "")
    flat = FlatModel(mlp((4,), 3))
    kernels = GroupedForward(flat)
    assert kernels.reason() is None and not kernels.hooked()
    handle = flat.model.blocks[0].register_forward_hook(lambda module, args, out: out * 2)
    assert kernels.hooked()
    handle.remove()
    assert not kernels.hooked()


def test_nested_sequences_run_through_the_kernels_and_a_subclassed_layer_does_not():
    """A block that nests a sequence is computed layer by layer inside it (its Linear with
    each client's own weights); a subclass of Linear (an adapter may compute otherwise) is
    refused by name rather than run as a plain Linear."""
    from torch import nn

    from fedhet.models.layers import LayeredModel

    torch.manual_seed(1)
    nested = LayeredModel(
        [nn.Sequential(nn.Sequential(nn.Linear(5, 4), nn.ReLU())), nn.Sequential(nn.Linear(4, 3))]
    )
    flat = FlatModel(nested)
    engine = GroupGradients(flat, Classification())
    assert engine.kernels.reason() is None
    rows = flat.params.detach().unsqueeze(0).repeat(3, 1) + 0.1 * torch.randn(3, flat.params.numel())
    buffer_rows = torch.zeros(3, 0)
    x, y = torch.randn(3, 7, 5), torch.randint(0, 3, (3, 7))
    grads, losses = engine._grouped(rows, buffer_rows, 0, x, y, 1)
    want_losses, want_grads, _ = _one_at_a_time(flat, rows, buffer_rows, x, y, 1)
    torch.testing.assert_close(grads, want_grads, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(losses), want_losses, rtol=1e-5, atol=1e-6)

    class Adapted(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    adapted = GroupedForward(FlatModel(LayeredModel([nn.Sequential(Adapted(5, 3))])))
    assert "Adapted" in (adapted.reason() or "")


def test_auto_groups_on_the_cpu_exactly_where_the_kernels_compute_the_groups():
    """``run.pool = "auto"`` picks the batched pool on the CPU for a model that declares
    ``batches_on_cpu`` and a rule that trains the task's own loss; every model declaring it
    builds into layers the kernels batch there (no convolution, every layer known)."""
    from fedhet.config import from_dict
    from fedhet.engine.pool import groups_pay_on_cpu
    from fedhet.models.zoo import ModelContext
    from fedhet.registry import builtins

    def pays(rule: str, model: str) -> bool:
        return groups_pay_on_cpu(from_dict({"algorithm": {"name": rule}, "model": {"name": model}}))

    assert pays("salf", "mlp") and pays("fedprox", "mlp") and pays("scaffold", "linear")
    assert not pays("salf", "cnn2")  # convolutions: one client at a time on the CPU
    assert not pays("fjord", "mlp") and not pays("fedbalancer", "mlp")  # own loss; sample selection
    declared = [
        entry.cls for entry in builtins("model").values() if getattr(entry.cls, "batches_on_cpu", False)
    ]
    assert declared
    for cls in declared:
        flat = FlatModel(cls.build(cls.Options(), ModelContext((1, 8, 8), 10)))
        engine = GroupGradients(flat, Classification())
        assert engine.kernels_pay(), cls.name
