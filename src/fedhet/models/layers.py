"""Explicit layers and one flat parameter vector per model.

A :class:`LayeredModel` is an ordered list of *layer groups* (blocks), input to output; a
block is one Linear or Conv with its bias, any BatchNorm after it, and its parameter-free
activation/pooling. Layers are numbered 1..L from input to output. Back-propagation visits
L, L-1, ..., 1; a client with depth d computed layers d..L (d = L + 1: nothing).

:class:`FlatModel` makes every parameter a view into one contiguous vector ordered by layer,
so layer l is the slice ``params[start_l:end_l]`` and reloading the global model into the
working model is a single in-place copy (as pfl-research does). Float buffers (BatchNorm
running statistics) live in a second flat vector with the same per-layer slices.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn


class LayeredModel(nn.Module):
    """A feed-forward network made of ``blocks``, each one declared layer."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.channels_last = False  # images enter in channels-last memory order (FlatModel)
        self.skipped: frozenset[int] = frozenset()  # layers (1-based) a task runs without (FedRA)

    @property
    def num_layers(self) -> int:
        """L, the number of declared layers."""
        return len(self.blocks)

    def forward(self, x: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """Forward pass that lets back-propagation reach only layers ``depth..L``.

        Layers below ``depth`` run without building an autograd graph and their output is
        detached, so a backward pass truly stops at layer ``depth``: the lower layers'
        gradients are neither computed nor paid for (SALF Sec. III-A, truncated backprop).
        """
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        blocks: Iterable[nn.Module] = (
            self.blocks._modules.values()
        )  # iterated: slicing a ModuleList builds a new one
        if self.skipped:  # layers a task runs without: each must keep its input's shape
            blocks = [b for layer, b in enumerate(blocks, start=1) if layer not in self.skipped]
            depth -= sum(1 for layer in self.skipped if layer < depth)
        if depth > 1:
            with torch.no_grad():
                for block in itertools.islice(blocks, depth - 1):
                    x = block(x)
            x = x.detach()
        for block in itertools.islice(blocks, depth - 1, None):
            x = block(x)
        return x


@dataclass(frozen=True)
class LayerSlices:
    """Per-layer ``(start, end)`` bounds into a flat vector, layers 1..L at index 0..L-1."""

    bounds: tuple[tuple[int, int], ...]

    def start(self, layer: int) -> int:
        """First flat index of layer ``layer`` (1-based); ``L + 1`` gives the total size."""
        if layer == len(self.bounds) + 1:
            return self.bounds[-1][1] if self.bounds else 0
        return self.bounds[layer - 1][0]

    def of(self, layer: int) -> slice:
        """Slice of layer ``layer`` (1-based)."""
        start, end = self.bounds[layer - 1]
        return slice(start, end)

    def from_depth(self, depth: int) -> slice:
        """Slice covering layers ``depth..L`` (empty when depth = L + 1)."""
        return slice(self.start(depth), self.start(len(self.bounds) + 1))


@dataclass(frozen=True)
class Adapter:
    """Where one LoRA projection lives in the flat vectors: its A (rank x in) at parameter
    index ``a``, its B (out x rank) at ``b``, its base weight (out x in) at buffer index
    ``weight`` (-1: a frozen base outside the global model), and its scale alpha / r."""

    a: int
    a_shape: tuple[int, int]
    b: int
    b_shape: tuple[int, int]
    weight: int
    scale: float


@dataclass(frozen=True)
class ModelLayout:
    """Where each layer lives in the flat parameter and buffer vectors."""

    param_slices: LayerSlices
    buffer_slices: LayerSlices
    param_shapes: tuple = ()  # per layer, the shapes of its parameters in flat order
    exit_levels: tuple = ()  # a multi-exit model's depth level of each layer (DepthFL); () otherwise
    # whether every layer is a chain of units (Linear, Conv with their BatchNorm): what the
    # width masks of sub-models (HeteroFL's, FjORD's, SLT's heads) cut; False for a
    # transformer (embeddings, attention heads, LayerNorm)
    unit_layers: bool = True
    # parameters with a rank axis (LoRA's A: rows, B: columns): (flat start, shape, axis)
    # each; a sub-model of rate r keeps the leading ranks of each (HetLoRA's truncation)
    rank_axes: tuple = ()
    # per layer, whether a task may run without it (a residual block that keeps its input's
    # shape: a transformer block; FedRA's allocation)
    skippable: tuple = ()
    # every LoRA projection, in flat order (FLoRA merges B A into the weight)
    adapters: tuple[Adapter, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.param_slices.bounds)

    @property
    def num_params(self) -> int:
        return self.param_slices.start(self.num_layers + 1)

    @property
    def num_buffers(self) -> int:
        return self.buffer_slices.start(self.num_layers + 1)


UNIT_MODULES = (nn.Linear, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d)


def _unit_layers(model: LayeredModel) -> bool:
    """Whether every module holding parameters is a Linear, a Conv or a BatchNorm."""
    return all(
        isinstance(module, UNIT_MODULES)
        for module in model.modules()
        if any(True for _ in module.parameters(recurse=False))
    )


class FlatModel:
    """A :class:`LayeredModel` whose parameters and float buffers are views of flat vectors.

    ``params`` and ``buffers`` are 1-D tensors; ``param_slices``/``buffer_slices`` give each
    layer's region. ``layer_params[l-1]`` lists layer l's ``nn.Parameter`` objects (for
    ``torch.autograd.grad`` over reached layers only).

    ``channels_last``: convolution weights are stored out x height x width x in (PyTorch's
    channels-last order) and images enter the model in that order, which lets oneDNN use its
    faster convolutions on the CPU (1.1-1.9x per training step, benchmarks/hardware.py). The
    flat vectors then hold conv weights in that order; everything that treats them element
    by element or layer by layer is unaffected.
    """

    def __init__(self, model: LayeredModel, channels_last: bool = False):
        self.model = model
        self.channels_last = channels_last
        model.channels_last = channels_last
        self.layer_params: list[list[nn.Parameter]] = []
        param_bounds: list[tuple[int, int]] = []
        buffer_bounds: list[tuple[int, int]] = []
        param_chunks: list[torch.Tensor] = []
        buffer_chunks: list[torch.Tensor] = []
        buffer_owners: list = []
        p_off = b_off = 0
        for block in model.blocks:
            params = [p for p in block.parameters() if p.requires_grad]
            self.layer_params.append(params)
            n = sum(p.numel() for p in params)
            param_bounds.append((p_off, p_off + n))
            p_off += n
            param_chunks.extend(self._ordered(p.detach()).reshape(-1) for p in params)
            m = 0
            for module in block.modules():
                for name, buf in module.named_buffers(recurse=False):
                    if buf is not None and buf.is_floating_point():
                        buffer_owners.append((module, name, buf.shape))
                        buffer_chunks.append(buf.detach().reshape(-1))
                        m += buf.numel()
            buffer_bounds.append((b_off, b_off + m))
            b_off += m
        self.param_slices = LayerSlices(tuple(param_bounds))
        self.buffer_slices = LayerSlices(tuple(buffer_bounds))
        shapes = tuple(tuple(tuple(p.shape) for p in params) for params in self.layer_params)
        levels = tuple(getattr(model, "exit_levels", ()))  # models/exits.py
        skippable = tuple(bool(getattr(block, "skippable", False)) for block in model.blocks)
        self.layout = ModelLayout(
            self.param_slices,
            self.buffer_slices,
            shapes,
            levels,
            _unit_layers(model),
            self._rank_axes(),
            skippable,
            self._adapters(buffer_owners),
        )
        device = next(model.parameters()).device if param_chunks else torch.device("cpu")
        self.params = torch.cat(param_chunks).clone() if param_chunks else torch.zeros(0)
        self.buffers = torch.cat(buffer_chunks).clone() if buffer_chunks else torch.zeros(0, device=device)
        self._point_into_flat(buffer_owners)

    def _rank_axes(self) -> tuple:
        """(flat start, shape, axis) of each parameter that declares a rank axis
        (``rank_axis``: a LoRA adapter's), in flat order."""
        out, start = [], 0
        for params in self.layer_params:
            for p in params:
                axis = getattr(p, "rank_axis", None)
                if axis is not None:
                    out.append((start, tuple(p.shape), int(axis)))
                start += p.numel()
        return tuple(out)

    def _adapters(self, buffer_owners: list) -> tuple[Adapter, ...]:
        """Each LoRA projection's :class:`Adapter` (modules holding ``lora_a``, ``lora_b``, a
        ``base`` and a ``scale``), in module order."""
        starts, off = {}, 0
        for p in itertools.chain.from_iterable(self.layer_params):
            starts[id(p)] = off
            off += p.numel()
        buffer_starts, off = {}, 0
        for module, name, shape in buffer_owners:
            buffer_starts[(id(module), name)] = off
            off += int(torch.Size(shape).numel())
        found = []
        for module in self.model.modules():
            a, b = getattr(module, "lora_a", None), getattr(module, "lora_b", None)
            if a is None or b is None or id(a) not in starts or id(b) not in starts:
                continue
            weight = buffer_starts.get((id(module.base), "weight"), -1)
            found.append(Adapter(starts[id(a)], tuple(a.shape), starts[id(b)], tuple(b.shape), weight,
                                 float(module.scale)))  # type: ignore[arg-type]  # fmt: skip
        return tuple(sorted(found, key=lambda adapter: adapter.a))

    def _point_into_flat(self, buffer_owners: list) -> None:
        """Make every parameter and float buffer of the model a view of its region of the
        flat vectors (conv weights under channels-last: a permuted view)."""
        with torch.no_grad():
            off = 0
            for params in self.layer_params:
                for p in params:
                    region = self.params[off : off + p.numel()]
                    if self.channels_last and p.dim() == 4:
                        out, inp, height, width = p.shape
                        p.data = region.view(out, height, width, inp).permute(0, 3, 1, 2)
                    else:
                        p.data = region.view_as(p)
                    off += p.numel()
            off = 0
            for module, name, shape in buffer_owners:
                n = int(torch.Size(shape).numel())
                module._buffers[name] = self.buffers[off : off + n].view(shape)
                off += n

    def _ordered(self, p: torch.Tensor) -> torch.Tensor:
        """A parameter's values in flat order: out x height x width x in for conv weights
        under channels-last, else as stored."""
        return p.permute(0, 2, 3, 1) if self.channels_last and p.dim() == 4 else p

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Per-parameter tensors (gradients of layers ``d..L``) as one vector in the flat
        order of their region (channels-last conv weights included)."""
        if not self.channels_last:
            return torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([self._ordered(t).reshape(-1) for t in tensors])

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def device(self) -> torch.device:
        """Where the working model's tensors live (``run.device``)."""
        return self.params.device

    def parameters_from_depth(self, depth: int) -> list[nn.Parameter]:
        """The parameters of layers ``depth..L``, in flat order."""
        return [p for params in self.layer_params[depth - 1 :] for p in params]

    def load(self, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        """Copy global ``params`` (and ``buffers``) into the working model, in place."""
        with torch.no_grad():
            self.params.copy_(params)
            if buffers is not None and buffers.numel():
                self.buffers.copy_(buffers)
