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


def training_step_flops(layer_multiply_adds: Sequence[int], batch: int, depth: int = 1) -> int:
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
