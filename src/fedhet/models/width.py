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


def width_mask(layout: ModelLayout, rate: float) -> torch.Tensor:
    """Boolean mask over the flat parameters: the elements a sub-model of ``rate`` holds."""
    if not layout.param_shapes:
        raise ValueError("the model layout has no parameter shapes")
    mask = torch.zeros(layout.num_params, dtype=torch.bool)
    if rate >= 1.0:
        return mask.fill_(True)
    last = len(layout.param_shapes) - 1
    previous_units = previous_kept = None
    for layer, shapes in enumerate(layout.param_shapes):
        units = next(s[0] for s in shapes if len(s) >= 2)
        kept = units if layer == last else kept_units(units, rate)
        offset = layout.param_slices.start(layer + 1)
        for shape in shapes:
            block = torch.zeros(shape, dtype=torch.bool)
            if len(shape) >= 2:
                inputs = shape[1] if previous_units is None else previous_kept * (shape[1] // previous_units)
                block[:kept, :inputs] = True
            else:
                block[:kept] = True
            size = block.numel()
            mask[offset : offset + size] = block.reshape(-1)
            offset += size
        previous_units, previous_kept = units, kept
    return mask


def scaler_hooks(model, rate: float) -> list:
    """HeteroFL's scaler: during a sub-model's training, every hidden Linear/Conv output is
    divided by ``rate`` (the output layer's is not). Returns the hook handles to remove."""
    from torch import nn

    handles = []
    for block in model.blocks[:-1]:
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
