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
from typing import cast

import torch
from torch import nn

from fedhet.checks import one_of
from fedhet.errors import ConfigError
from fedhet.models.layers import LayeredModel
from fedhet.models.zoo import ZooModel
from fedhet.registry import register

LORA_BASES = ("frozen", "global")


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

    skippable = True  # residual, the input's shape kept: a task may run without it (FedRA)

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


def with_lora(model: LayeredModel, rank: int, alpha: float, base_in_state: bool = False) -> LayeredModel:
    """``model`` with every parameter frozen and LoRA adapters (:mod:`fedhet.models.lora`) on
    each block's projections: attention's ``qkv`` and ``out``, the MLP's two layers; the
    model itself, changed in place. ``base_in_state``: those projections' weights are
    buffers of the global model (``model.lora_base = "global"``)."""
    from fedhet.models.lora import LoRALinear

    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.modules():
        if isinstance(block, TransformerBlock):
            attention, mlp = block.attention, block.mlp
            attention.qkv = LoRALinear(attention.qkv, rank, alpha, base_in_state)  # type: ignore[assignment]
            attention.out = LoRALinear(attention.out, rank, alpha, base_in_state)  # type: ignore[assignment]
            mlp[0] = LoRALinear(cast(nn.Linear, mlp[0]), rank, alpha, base_in_state)
            mlp[2] = LoRALinear(cast(nn.Linear, mlp[2]), rank, alpha, base_in_state)
    return model


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
    model's (4). ``lora_rank`` r > 0: the base is frozen and the clients train LoRA adapters
    of rank r on every block's projections, scaled by ``lora_alpha`` / r (16)
    (:mod:`fedhet.models.lora`); ``pretrain_steps`` > 0: the base is first pre-trained
    centrally for that many Adam steps (``pretrain_lr`` 0.003, batches of ``pretrain_batch``
    32) on a share ``pretrain_fraction`` (0.25) of the training examples that no client gets,
    and cached. ``lora_base``: ``"frozen"`` (the base is fixed for the whole run, outside
    the global model) or ``"global"`` (the adapted projections' weights are part of the
    global model the server sends each round and may change: FLoRA merges adapters into
    them)."""

    width: int = 64
    blocks: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_base: str = "frozen"
    pretrain_steps: int = 0
    pretrain_fraction: float = 0.25
    pretrain_lr: float = 0.003
    pretrain_batch: int = 32

    def validate(self) -> None:
        if self.lora_rank < 0 or self.pretrain_steps < 0 or self.pretrain_batch < 1:
            raise ConfigError(
                f"model.lora_rank = {self.lora_rank}, pretrain_steps = {self.pretrain_steps}, "
                f"pretrain_batch = {self.pretrain_batch}: must be >= 0, >= 0 and >= 1"
            )
        if not 0 < self.pretrain_fraction < 1 or not self.pretrain_lr > 0 or not self.lora_alpha > 0:
            raise ConfigError(
                f"model.pretrain_fraction = {self.pretrain_fraction}, pretrain_lr = {self.pretrain_lr}, "
                f"lora_alpha = {self.lora_alpha}: need a fraction in (0, 1) and positive rates"
            )
        one_of("model.lora_base", self.lora_base, LORA_BASES)
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
    def pretraining_share(cls, options: TransformerOptions) -> float:
        return float(options.pretrain_fraction) if options.pretrain_steps else 0.0

    @classmethod
    def pretrain(cls, options: TransformerOptions, ctx, x, y, task) -> LayeredModel:
        """The base pre-trained on the set-aside examples (cached: :mod:`fedhet.models.lora`)."""
        from fedhet.models.lora import pretrained_base

        shape = {k: getattr(options, k) for k in ("width", "blocks", "heads", "mlp_ratio")}
        shape.update(input=list(ctx.input_shape), vocabulary=ctx.num_classes)
        return pretrained_base(  # type: ignore[return-value]  # the base cls._base builds
            lambda: cls._base(options, ctx), shape,
            x, y, task.loss, options.pretrain_steps, options.pretrain_lr, options.pretrain_batch,
        )  # fmt: skip

    @staticmethod
    def _base(options: TransformerOptions, ctx) -> LayeredModel:
        return causal_transformer(ctx.input_shape, ctx.num_classes, options.width, options.blocks,
                                  options.heads, options.mlp_ratio)  # fmt: skip

    @classmethod
    def build(cls, options: TransformerOptions, ctx) -> LayeredModel:
        """The (pre-trained) base, with LoRA adapters where ``lora_rank`` > 0."""
        model = ctx.pretrained if ctx.pretrained is not None else cls._base(options, ctx)
        if not options.lora_rank:
            return model
        return with_lora(model, options.lora_rank, options.lora_alpha, options.lora_base == "global")
