"""Arithmetic cost of a model's layers: multiply-adds per example, counted once by running
one example through the model with hooks on its convolutions and linear maps.

Used to price host work: the FLOPs of a training step truncated at depth d (for the
hardware-efficiency benchmark and truncated back-propagation's ideal savings) and the size
of a run's work when ``run.threads = "auto"`` picks a thread count.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedhet.models.layers import LayeredModel


def multiply_adds(model: LayeredModel, input_shape: Sequence[int]) -> list[int]:
    """Multiply-adds per example of each layer (input to output) of ``model``: for a
    convolution out_channels x out_height x out_width x in_channels/groups x kernel area, for a
    linear map in x out (BatchNorm, ReLU and pooling are element-wise and not counted)."""
    counts = [0] * model.num_layers
    hooks = []

    def counter(layer: int):
        def hook(module: nn.Module, inputs, output: torch.Tensor) -> None:
            if isinstance(module, nn.Conv2d):
                kernel = module.kernel_size[0] * module.kernel_size[1]
                counts[layer] += output[0].numel() * (module.in_channels // module.groups) * kernel
            elif isinstance(module, nn.Linear):
                counts[layer] += module.in_features * module.out_features

        return hook

    for layer, block in enumerate(model.blocks):
        for module in block.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                hooks.append(module.register_forward_hook(counter(layer)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return counts


def training_step_flops(layer_multiply_adds: Sequence[float], batch: int, depth: int = 1) -> float:
    """FLOPs (2 per multiply-add) of one SGD step on ``batch`` examples that back-propagates
    layers ``depth``..L: the forward pass through every layer, the weight gradients of the
    reached layers, and the input gradients of every reached layer but the lowest one (nothing
    below it needs them)."""
    layers = list(layer_multiply_adds)
    reached = layers[depth - 1 :]
    forward = sum(layers)
    weight_grads = sum(reached)
    input_grads = sum(reached[1:])
    return 2 * batch * (forward + weight_grads + input_grads)


def sub_model_step_share(
    layout,
    layer_multiply_adds: Sequence[int],
    rate: float,
    full_layers: int = 0,
    depth: int = 1,
    layers: int = 0,
) -> float:
    """The FLOPs of one training step of HeteroFL's width-``rate`` sub-model as a share of
    the full model's step (:func:`training_step_flops`, the full model's at depth 1); with
    ``full_layers`` k and ``depth`` d, SLT's configuration: layers 1..k whole, the layers
    above at ``rate``, back-propagation down to layer d only (the frozen layers below d
    cost their forward pass).

    A convolution's or linear map's multiply-adds are its weight elements times its output
    positions, and a sub-model keeps the positions, so layer l of the sub-model costs
    ``layer_multiply_adds[l]`` times the share of layer l's weight elements it holds
    (:func:`fedhet.models.width.width_mask`): about r for the first and last layers (their
    inputs / classes stay whole), about r^2 in between. That is why r^2 understates the cost
    of shallow models (MLP 784-32-16-10 at r = 0.5: 0.49, not 0.25)."""
    from fedhet.models.width import width_mask

    if layers:  # FedRA's layer set: the layers outside it are not run at all
        kept = [m if layers >> i & 1 else 0 for i, m in enumerate(layer_multiply_adds)]
        first = next((i + 1 for i in range(len(kept)) if layers >> i & 1 and i + 1 >= depth), depth)
        full = training_step_flops(layer_multiply_adds, batch=1)
        return float(training_step_flops(kept, batch=1, depth=first)) / full if full else 1.0
    if layout.rank_axes:
        # adapters' ranks: the base's arithmetic (every Linear counted) is the step's, the
        # adapters' few multiply-adds are not counted: a truncated rank costs the same
        return 1.0
    if len(layer_multiply_adds) != layout.num_layers:
        raise ValueError(
            f"{len(layer_multiply_adds)} per-layer multiply-add counts for {layout.num_layers} layers"
        )
    mask = width_mask(layout, rate, 0, full_layers)
    scaled = []
    for layer, (shapes, count) in enumerate(zip(layout.param_shapes, layer_multiply_adds, strict=True)):
        offset = layout.param_slices.start(layer + 1)
        held = total = 0
        for shape in shapes:
            size = int(torch.Size(shape).numel())
            if len(shape) >= 2:  # a weight: what multiply-adds scale with
                held += int(mask[offset : offset + size].sum())
                total += size
            offset += size
        scaled.append(count * held / total if total else 0.0)
    full = training_step_flops(layer_multiply_adds, batch=1)
    return float(training_step_flops(scaled, batch=1, depth=depth)) / full if full else rate * rate
