"""Models with a classifier after every block (early exits), for DepthFL (Kim, Yu, Kim and
Moon, "DepthFL: Depthwise Federated Learning for Heterogeneous Clients", ICLR 2023).

A :class:`MultiExitModel` is a trunk of blocks t_1..t_K, input to output (t_K ends in the
classifier), with an exit head h_k after each t_k for k < K. Its declared layers are the
trunk blocks and the heads interleaved, [t_1, h_1, t_2, h_2, ..., t_{K-1}, h_{K-1}, t_K], so
the local model of depth k (blocks 1..k and their classifiers) is layers 1..2k - 1 (+ h_k
when k < K); ``exit_levels`` gives each layer its k. The model's output is the ensemble of
its exits (the mean of their logits, as the DepthFL authors' evaluation); :meth:`exits`
returns them one by one.

A head reads its block's output: a linear map of it (2-D outputs), or of its channels'
spatial means (4-D outputs): the lightest classifier (the paper's heads are bottleneck
convolutions; ours add about as many weights as a linear layer).

The measured and wall-clock system models time a sequential model layer by layer; a
multi-exit model is refused there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.layers import LayeredModel


class MultiExitModel(LayeredModel):
    """Trunk blocks with an exit head after each (see the module's docstring)."""

    def __init__(self, trunk: Sequence[nn.Module], heads: Sequence[nn.Module]):
        if len(heads) != len(trunk) - 1:
            raise ValueError(f"{len(trunk)} trunk blocks need {len(trunk) - 1} exit heads, got {len(heads)}")
        blocks: list[nn.Module] = []
        levels: list[int] = []
        heads_at: list[bool] = []
        for k, block in enumerate(trunk, start=1):
            blocks.append(block)
            levels.append(k)
            heads_at.append(False)
            if k < len(trunk):
                blocks.append(heads[k - 1])
                levels.append(k)
                heads_at.append(True)
        super().__init__(blocks)
        self.exit_levels = tuple(levels)  # per declared layer: its depth level k
        self.is_head = tuple(heads_at)
        self.num_exits = len(trunk)

    def exits(self, x: torch.Tensor, upto: int | None = None, depth: int = 1) -> list[torch.Tensor]:
        """The logits of exits 1..``upto`` (default all), computing only the blocks they
        need; layers below ``depth`` run without a graph (truncated back-propagation)."""
        upto = self.num_exits if upto is None else upto
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        outputs: list[torch.Tensor] = []
        trunk = x
        layers = zip(self.blocks, self.exit_levels, self.is_head, strict=True)
        for index, (block, level, is_head) in enumerate(layers, start=1):
            if level > upto:
                break
            with torch.set_grad_enabled(torch.is_grad_enabled() and index >= depth):
                if is_head:
                    outputs.append(block(trunk))
                else:
                    trunk = block(trunk)
                    if index == len(self.blocks):
                        outputs.append(trunk)  # the last block is the final classifier
            if index < depth:
                trunk = trunk.detach()
        return outputs

    def forward(self, x: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """The ensemble: the mean of every exit's logits."""
        return torch.stack(self.exits(x, depth=depth), dim=0).mean(dim=0)


def exit_head(output: torch.Tensor, num_classes: int) -> nn.Module:
    """A classifier for one example's block output ``output``: a linear map of a feature
    vector, or of the channels' spatial means of a feature map."""
    if output.dim() == 3:  # channels x height x width
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(output.shape[0], num_classes))
    return nn.Sequential(nn.Flatten(), nn.Linear(output.numel(), num_classes))


def with_exits(model: LayeredModel, input_shape: Sequence[int], num_classes: int) -> MultiExitModel:
    """``model``'s blocks as a trunk with an exit head after every block but the last."""
    blocks = list(model.blocks)
    heads = []
    with torch.no_grad():
        x = torch.zeros(1, *input_shape)
        for block in blocks[:-1]:
            x = block(x)
            heads.append(exit_head(x[0], num_classes))
    return MultiExitModel(blocks, heads)


def require_sequential(model: LayeredModel, what: str) -> None:
    """Refuse a multi-exit model where layers are timed one after the other."""
    if isinstance(model, MultiExitModel):
        raise ConfigError(f"{what} times a sequential model layer by layer; a multi-exit model has branches")
