"""A causal transformer built from configuration (no download): character- or token-level
next-token prediction on the text datasets (``data.dataset = "text"``, LEAF's Shakespeare
with ``target = "sequence"``).

Declared as ordered layer groups, input to output: the embedding (tokens and learned
positions), one group per transformer block (pre-norm causal self-attention and an MLP, each
with its residual), and the head (a final LayerNorm and the projection to the vocabulary).
Truncated back-propagation therefore stops between blocks (SALF's depth, ADEL-FL's: a
straggler trains the blocks nearest the output first), exactly as for the other models.

The input is a (batch, context) tensor of token indices (float, as datasets hold features);
the output (batch, context, vocabulary) logits; the dataset's task (:class:`fedhet.data.task.
NextToken`) scores every position's next token. Sizes go from a tiny CPU model (two blocks,
width 64) upward (``model.width``, ``blocks``, ``heads``, ``mlp_ratio``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.layers import LayeredModel
from fedhet.models.zoo import ZooModel
from fedhet.registry import register


class TokenEmbedding(nn.Module):
    """Token indices -> token vectors plus learned position vectors (layer 1)."""

    def __init__(self, vocabulary: int, width: int, context: int):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(context, width)
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = x.long().clamp(0, self.tokens.num_embeddings - 1)
        where = torch.arange(index.shape[-1], device=index.device)
        return self.tokens(index) + self.positions(where)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where a position sees itself and those before it."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        shape = (*lead, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(-3, -2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        attended = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.out(attended.transpose(-3, -2).reshape(*lead, length, width))


class TransformerBlock(nn.Module):
    """x + attention(LayerNorm(x)), then + MLP(LayerNorm(.)) (pre-norm, GELU)."""

    def __init__(self, width: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LMHead(nn.Module):
    """The final LayerNorm and the projection to the vocabulary (the last layer)."""

    def __init__(self, width: int, vocabulary: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.projection = nn.Linear(width, vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.norm(x))


def causal_transformer(input_shape: Sequence[int], vocabulary: int, width: int = 64, blocks: int = 2,
                       heads: int = 4, mlp_ratio: int = 4) -> LayeredModel:  # fmt: skip
    """The embedding, ``blocks`` transformer blocks and the head as L = blocks + 2 layer
    groups, for sequences of ``input_shape = (context,)`` token indices."""
    if len(input_shape) != 1:
        raise ConfigError(
            f"model.name = 'transformer' needs sequences of token indices, got {tuple(input_shape)}"
        )
    if width % heads:
        raise ConfigError(f"model.width = {width}: must be a multiple of model.heads = {heads}")
    layers: list[nn.Module] = [TokenEmbedding(vocabulary, width, int(input_shape[0]))]
    layers += [TransformerBlock(width, heads, mlp_ratio) for _ in range(blocks)]
    layers.append(LMHead(width, vocabulary))
    return LayeredModel(layers)


@dataclass
class TransformerOptions:
    """``width``: the model's width (64); ``blocks``: transformer blocks (2); ``heads``:
    attention heads (4, dividing the width); ``mlp_ratio``: the MLP's width over the
    model's (4)."""

    width: int = 64
    blocks: int = 2
    heads: int = 4
    mlp_ratio: int = 4

    def validate(self) -> None:
        for key in ("width", "blocks", "heads", "mlp_ratio"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65_536:
                raise ConfigError(f"model.{key} = {value!r}: must be an integer in 1..65536")
        if self.width % self.heads:
            raise ConfigError(f"model.width = {self.width}: must be a multiple of model.heads = {self.heads}")


@register("model")
class Transformer(ZooModel):
    """A causal transformer: embedding, blocks, head as layer groups (the module's)."""

    name = "transformer"
    Options = TransformerOptions

    @classmethod
    def build(cls, options: TransformerOptions, ctx) -> LayeredModel:
        return causal_transformer(ctx.input_shape, ctx.num_classes, options.width, options.blocks,
                                  options.heads, options.mlp_ratio)  # fmt: skip
