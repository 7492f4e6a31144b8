"""A group's forward pass with batched kernels, one client per row of a parameter matrix.

For the layer types the zoo is made of, a group of k clients' forward pass is a few large
kernels instead of k small ones or a ``torch.func.vmap`` trace: a Linear layer is one
``baddbmm`` of the k clients' batches by their k weight matrices; a convolution is one
grouped convolution (the clients' channels side by side, ``groups = k``); a BatchNorm is one
``batch_norm`` over the clients' channels side by side, so that each client's batch
statistics and running statistics are its own; parameter-free layers (activations, pooling,
padding, flattening) run once on the k batches merged. Autograd differentiates the sum of
the clients' losses with respect to the rows: row i's gradient is client i's own, since no
row's output depends on another's.

A model with any other layer, or a module with hooks (a sub-model's activation scaler), is
not run here: :meth:`GroupedForward.reason` says why, and the group is computed with
``vmap`` or row by row (:mod:`fedhet.client.group`). Which groups use these kernels is
:meth:`~fedhet.client.group.GroupGradients.kernels_pay`'s: dense models on the CPU, where
they were measured faster than ``vmap`` and than one client at a time
(benchmarks/overhead.py); grouped convolutions measured slower than one client at a time
on the CPU (1.45-1.9x the time on cnn2), and no GPU has measured them yet.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.models.layers import FlatModel, LayeredModel
from fedhet.models.pooling import MaxPool2x2

# layers with no parameters or buffers whose output for an example depends on that example
# alone: run once on the group's batches merged into one
PER_EXAMPLE = (
    nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Flatten,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.ZeroPad2d, MaxPool2x2,
)  # fmt: skip
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class GroupedForward:
    """The forward pass of a group of clients over a :class:`~fedhet.models.FlatModel`'s
    layers, from stacked parameter rows and stacked batches."""

    def __init__(self, flat: FlatModel):
        self.flat = flat
        self.blocks = list(flat.model.blocks) if isinstance(flat.model, LayeredModel) else []
        self.params = _offsets(flat.model, flat.params)
        self.buffers = _offsets(flat.model, flat.buffers) if flat.buffers.numel() else {}
        self._reason: str | None | bool = False  # False: not looked at yet

    def reason(self) -> str | None:
        """Why the model's groups cannot use these kernels (None: they can)."""
        if self._reason is False:
            self._reason = self._find_reason()
        return self._reason  # type: ignore[return-value]

    def _find_reason(self) -> str | None:
        model = self.flat.model
        if type(model) is not LayeredModel:
            return f"{type(model).__name__} is not a plain stack of layers"
        for block in self.blocks:
            if type(block) is not nn.Sequential:
                return f"a layer that is not a plain sequence ({type(block).__name__})"
            for module in block.modules():
                problem = None if type(module) is nn.Sequential else _unsupported(module)
                if problem is not None:
                    return problem
        return None

    def hooked(self) -> bool:
        """Whether a module has hooks now (a sub-model's scaler): those groups use vmap."""
        return any(m._forward_hooks or m._forward_pre_hooks for m in self.flat.model.modules())

    def leaves(self, rows: torch.Tensor, start: int) -> tuple[dict, list[torch.Tensor]]:
        """Each parameter of the group as a (k x numel) tensor cut from ``rows``: those from
        column ``start`` on are leaves that require gradients (returned in flat order), the
        others views without a graph."""
        tensors, leaves = {}, []
        for key, (begin, end, _) in sorted(self.params.items(), key=lambda item: item[1][0]):
            piece = rows[:, begin:end].detach()
            if begin >= start:
                piece.requires_grad_()
                leaves.append(piece)
            tensors[key] = piece
        return tensors, leaves

    def __call__(self, tensors: dict, buffer_rows: torch.Tensor, x: torch.Tensor, depth: int):
        """The group's outputs (k x batch x ...) for its parameters ``tensors`` (from
        :meth:`leaves`) on batches ``x`` (k x batch x ...); the layers below ``depth`` run
        without a graph. ``buffer_rows`` (k x B) take each client's new running statistics
        in place."""
        with torch.no_grad():
            for block in self.blocks[: depth - 1]:
                x = self._block(block, tensors, buffer_rows, x)
        for block in self.blocks[depth - 1 :]:
            x = self._block(block, tensors, buffer_rows, x)
        return x

    def _block(self, block: nn.Module, rows, buffer_rows, x):
        # reason() admitted these exact types only (a subclass may compute otherwise)
        for module in block.children():
            if isinstance(module, nn.Sequential):
                x = self._block(module, rows, buffer_rows, x)
            elif isinstance(module, nn.Linear):
                x = self._linear(module, rows, x)
            elif isinstance(module, nn.Conv2d):
                x = self._conv(module, rows, x)
            elif isinstance(module, NORMS):
                x = self._norm(module, rows, buffer_rows, x)
            else:
                k, b = x.shape[:2]
                out = module(x.reshape(k * b, *x.shape[2:]))
                x = out.reshape(k, b, *out.shape[1:])
        return x

    def _tensor(self, rows, module: nn.Module, name: str) -> torch.Tensor | None:
        piece = rows.get((module, name))
        if piece is None:
            return None
        return piece.view(len(piece), *self.params[(module, name)][2])

    def _weight(self, rows, module: nn.Module) -> torch.Tensor:
        weight = self._tensor(rows, module, "weight")
        assert weight is not None, "a known layer's weight is in the flat vector"
        return weight

    def _linear(self, module: nn.Linear, rows, x):
        """out^T = W x^T + b, one ``baddbmm`` for the group: written this way round, the
        weights' gradient comes out in their own (out x in) layout, with no copy."""
        k, b = x.shape[:2]
        weight = self._weight(rows, module)
        bias = self._tensor(rows, module, "bias")
        inputs = x.reshape(k, -1, module.in_features).transpose(1, 2)
        if bias is None:
            out = torch.bmm(weight, inputs)
        else:
            out = torch.baddbmm(bias.unsqueeze(2), weight, inputs)
        return out.transpose(1, 2).reshape(k, b, *x.shape[2:-1], module.out_features)

    def _conv(self, module: nn.Conv2d, rows, x):
        k, b = x.shape[:2]
        weight = self._conv_weight(rows, module)
        bias = self._tensor(rows, module, "bias")
        merged = x.transpose(0, 1).reshape(b, k * x.shape[2], *x.shape[3:])
        out = F.conv2d(
            merged, weight.reshape(k * module.out_channels, *weight.shape[2:]),
            None if bias is None else bias.reshape(-1), module.stride, module.padding, module.dilation,
            module.groups * k,
        )  # fmt: skip
        return out.reshape(b, k, module.out_channels, *out.shape[2:]).transpose(0, 1)

    def _conv_weight(self, rows, module: nn.Conv2d) -> torch.Tensor:
        values, shape = rows[(module, "weight")], self.params[(module, "weight")][2]
        if self.flat.channels_last:
            out, inp, height, width = shape
            return values.view(len(values), out, height, width, inp).permute(0, 1, 4, 2, 3)
        return values.view(len(values), *shape)

    def _norm(self, module, rows, buffer_rows, x):
        k, b, channels = x.shape[0], x.shape[1], x.shape[2]
        merged = x.transpose(0, 1).reshape(b, k * channels, *x.shape[3:])
        weight, bias = self._tensor(rows, module, "weight"), self._tensor(rows, module, "bias")
        mean, var = (
            self._running(buffer_rows, module, "running_mean"),
            self._running(buffer_rows, module, "running_var"),
        )
        out = F.batch_norm(
            merged, mean, var, None if weight is None else weight.reshape(-1),
            None if bias is None else bias.reshape(-1), True, module.momentum, module.eps,
        )  # fmt: skip
        if mean is not None:
            self._keep(buffer_rows, module, "running_mean", mean)
            self._keep(buffer_rows, module, "running_var", var)
        return out.reshape(b, k, channels, *x.shape[3:]).transpose(0, 1)

    def _running(self, buffer_rows, module, name: str) -> torch.Tensor | None:
        span = self.buffers.get((module, name))
        if span is None:
            return None
        start, stop, _ = span
        return buffer_rows[:, start:stop].reshape(-1).clone()  # batch_norm updates it in place

    def _keep(self, buffer_rows, module, name: str, values: torch.Tensor) -> None:
        start, stop, _ = self.buffers[(module, name)]
        buffer_rows[:, start:stop].copy_(values.view(len(buffer_rows), -1))


def _unsupported(module: nn.Module) -> str | None:
    """Why the grouped kernels cannot run ``module`` (None: they can). Types are matched
    exactly: a subclass may compute otherwise (an adapter on a Linear)."""
    kind = type(module)
    if kind is nn.Linear:
        return None
    if isinstance(module, nn.Conv2d) and kind is nn.Conv2d:
        return (
            None if module.padding_mode == "zeros" else f"a Conv2d with padding_mode {module.padding_mode!r}"
        )
    if isinstance(module, NORMS) and kind in NORMS:
        if module.momentum is None or not module.track_running_stats:
            return f"a {kind.__name__} with a cumulative or no running average"
        return None
    if kind in PER_EXAMPLE:
        return None
    return f"a layer the grouped kernels do not know ({kind.__name__})"


def _offsets(model: nn.Module, flat: torch.Tensor) -> dict:
    """(module, tensor name) -> (start, stop, shape) of each float tensor that is a view into
    the flat vector ``flat``."""
    out = {}
    base, size = flat.data_ptr(), flat.element_size()
    storage = flat.untyped_storage().data_ptr()
    for module in model.modules():
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, tensor in tensors:
            if tensor.is_floating_point() and tensor.untyped_storage().data_ptr() == storage:
                start = (tensor.data_ptr() - base) // size
                out[(module, name)] = (start, start + tensor.numel(), tuple(tensor.shape))
    return out
