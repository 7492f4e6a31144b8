"""Width-reduced sub-models (HeteroFL): which parameter elements a sub-model of rate r holds.

HeteroFL ("HeteroFL: Computation and Communication Efficient Federated Learning for
Heterogeneous Clients", Diao et al., ICLR 2021) gives a client of rate r the leading
ceil(r * width) units (Linear outputs) or channels (Conv outputs, with their BatchNorm
entries) of every hidden layer; the model's input and its output classes stay whole. A
weight [out, in, ...] keeps [:kept_out, :kept_in]; a 1-D tensor (bias, BatchNorm) keeps
[:kept_out]; after a flatten, a kept channel keeps all of its spatial positions (the input
features of a Linear come in blocks of in / out_prev per unit of the layer before).
"""

from __future__ import annotations

import math

import torch

from fedhet.models.layers import ModelLayout


def kept_units(units: int, rate: float) -> int:
    """ceil(rate * units), at least 1."""
    return max(1, math.ceil(rate * units - 1e-9))


def kept_indices(units: int, rate: float, offset: int = 0) -> torch.Tensor:
    """The units a sub-model of ``rate`` keeps of a layer of ``units``: ceil(rate * units) of
    them from unit ``offset`` mod units on, wrapping around (FedRolex's rolling window; 0:
    the leading ones, HeteroFL's)."""
    return (torch.arange(kept_units(units, rate)) + offset) % units


def width_mask(
    layout: ModelLayout, rate: float, offset: int = 0, full_layers: int = 0, layers: int = 0
) -> torch.Tensor:
    """Boolean mask over the flat parameters: the elements a sub-model of ``rate`` holds,
    its hidden units chosen by :func:`kept_indices` (``offset``); layers 1..``full_layers``
    keep all their units (SLT's frozen layers and the one it trains whole), so the first
    layer above them reads every input."""
    if not layout.param_shapes:
        raise ValueError("the model layout has no parameter shapes")
    if layers:
        return layer_mask(layout, layers) & width_mask(layout, rate, offset, full_layers)
    if layout.rank_axes and rate < 1.0:
        return rank_mask(layout, rate, offset)
    mask = torch.zeros(layout.num_params, dtype=torch.bool)
    if rate >= 1.0 or full_layers >= len(layout.param_shapes) - 1:
        return mask.fill_(True)
    last = len(layout.param_shapes) - 1
    previous: torch.Tensor | None = None  # the kept units of the layer before
    previous_units = 0
    for layer, shapes in enumerate(layout.param_shapes):
        units = next(s[0] for s in shapes if len(s) >= 2)
        whole = layer == last or layer < full_layers
        kept = torch.arange(units) if whole else kept_indices(units, rate, offset)
        start = layout.param_slices.start(layer + 1)
        for shape in shapes:
            block = torch.zeros(shape, dtype=torch.bool)
            if len(shape) >= 2:
                inputs = (
                    torch.arange(shape[1])
                    if previous is None
                    else _input_columns(previous, previous_units, shape[1])
                )
                block[kept.unsqueeze(1), inputs.unsqueeze(0)] = True
            else:
                block[kept] = True
            mask[start : start + block.numel()] = block.reshape(-1)
            start += block.numel()
        previous, previous_units = kept, units
    return mask


def layer_mask(layout: ModelLayout, layers: int) -> torch.Tensor:
    """The parameters of the layers in the bit set ``layers`` (bit l - 1 for layer l)."""
    mask = torch.zeros(layout.num_params, dtype=torch.bool)
    for layer in range(1, layout.num_layers + 1):
        if layers >> (layer - 1) & 1:
            mask[layout.param_slices.of(layer)] = True
    return mask


def rank_mask(layout: ModelLayout, rate: float, offset: int = 0) -> torch.Tensor:
    """The elements a sub-model of ``rate`` holds in a model whose parameters have a rank
    axis (LoRA's adapters, ``layout.rank_axes``): of each, the ranks :func:`kept_indices`
    chooses along that axis (HetLoRA's truncation: A's leading rows, B's leading columns);
    every other parameter whole."""
    mask = torch.ones(layout.num_params, dtype=torch.bool)
    for start, shape, axis in layout.rank_axes:
        block = torch.zeros(shape, dtype=torch.bool)
        kept = kept_indices(shape[axis], rate, offset)
        block.index_fill_(axis, kept, True)
        size = block.numel()
        mask[start : start + size] = block.reshape(-1)
    return mask


def _input_columns(kept: torch.Tensor, units: int, columns: int) -> torch.Tensor:
    """The input columns of a layer read from the kept units of the layer before: each unit
    feeds ``columns // units`` consecutive inputs (after a flatten, a channel's positions)."""
    per_unit = columns // units
    return (kept.unsqueeze(1) * per_unit + torch.arange(per_unit).unsqueeze(0)).reshape(-1)


def scaler_hooks(model, rate: float, full_layers: int = 0) -> list:
    """HeteroFL's scaler: during a sub-model's training, every hidden Linear/Conv output is
    divided by ``rate`` (the output layer's is not, nor those of layers 1..``full_layers``,
    which keep their width). Returns the hook handles to remove."""
    from torch import nn

    handles = []
    for block in model.blocks[full_layers:-1]:
        for module in block.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                handles.append(module.register_forward_hook(lambda mod, inp, out: out / rate))
    return handles


def ordered_dropout_hooks(model, rate: float) -> list:
    """FjORD's ordered dropout at width ``rate``: every hidden block keeps the outputs of
    its leading ceil(rate * units) units (channels) and drops the rest (zeroes them, so
    neither they nor the weights that read them learn on this batch); the output block is
    whole. Nested: the sub-model of a smaller rate is a prefix of every larger one. No
    rescaling (unlike HeteroFL's scaler). Returns the hook handles to remove."""
    handles = []

    def hook(module, inputs, output):
        kept = kept_units(output.shape[1], rate)
        if kept >= output.shape[1]:
            return output
        mask = torch.zeros(output.shape[1], dtype=output.dtype, device=output.device)
        mask[:kept] = 1.0
        return output * mask.view(1, -1, *([1] * (output.dim() - 2)))

    for block in model.blocks[:-1]:
        handles.append(block.register_forward_hook(hook))
    return handles
