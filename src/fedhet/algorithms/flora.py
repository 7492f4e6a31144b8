"""FLoRA (Ziyao Wang, Zheyu Shen, Yexiao He, Guoheng Sun, Hongyi Wang, Lingjuan Lyu, Ang Li,
"FLoRA: Federated Fine-Tuning Large Language Models with Heterogeneous Low-Rank
Adaptations", NeurIPS 2024, arXiv 2409.05976): the server stacks the clients' LoRA adapters
instead of averaging them, merges the stack into the base weights, and every round the
clients start new adapters on the merged model.

Averaging A and B apart gives (sum_k p_k B_k)(sum_k p_k A_k), which is not the mean of the
clients' updates sum_k p_k B_k A_k. FLoRA stacks A = [p_1 A_1; ...; p_K A_K] (ranks on top of
each other) and B = [B_1, ..., B_K] (side by side), whose product is that mean exactly, at
any ranks r_k; the server sends the stack, each client adds it to its base and starts a new
adapter. For every adapted projection, with p_k = n_k / sum_j n_j over the K clients that
delivered and s = alpha / r the adapter's scale:

    W <- W + s sum_k p_k B_k A_k,    then B <- 0 and A <- a new draw,

the new A drawn as a Linear's weight (uniform in +-1/sqrt(in)) from a stream of (``seed``,
round), so the next round's adapters start at the merged model (B = 0) in a fresh direction.
The base's weights must be part of the global model: ``model.lora_base = "global"``
(:mod:`fedhet.models.lora`). Parameters outside the adapters, if any are trainable, take the
weighted mean of the clients' deltas. A round where no client delivers leaves the model as
it is.

Ranks: as HetLoRA's (:mod:`fedhet.algorithms.hetlora`), client k trains the leading
r_k = ceil(rate_k r) rank components of every adapter, its rate by its speed tier
(``rank_rule = "tiers"``) or by the deadline (``"cost"``); its B_k is zero beyond r_k, so
B_k A_k over the full rank is its own adapter's product. Each truncated adapter keeps the
scale alpha / r of the full rank (the paper's clients scale by their own rank). A client
whose work misses the deadline by its drawn time delivers nothing; FLoRA has no partial
work.

The ``[server]`` step acts on the parameters, here the adapters the next round starts from:
with a server learning rate eta the new A is A + eta (A_new - A), B stays zero, and the
merge into W is the paper's, untouched (the bench's shared ``server.lr`` knob therefore only
blends successive draws of A for this rule).

Bytes down: the server's model with its merged base weights (the module's traffic counts
them every round; FLoRA sends the stack, sum_k r_k (in + out) numbers per projection, which
is fewer while sum_k r_k < in out / (in + out)); bytes up: the client's adapters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from fedhet import seeding
from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.heterofl import check_rates
from fedhet.algorithms.hetlora import RANK_RULES, HetLoRAPlanner
from fedhet.algorithms.parts import Aggregation
from fedhet.algorithms.sub_models import (
    KNOWLEDGE,
    LateSubModelsReporting,
    PlansFromKnowledge,
    knowledge_state,
)
from fedhet.checks import one_of
from fedhet.errors import ConfigError


@dataclass
class FLoRAOptions:
    """``rates``: the rank shares a client may get (1 = the model's ``lora_rank``);
    ``rank_rule``: ``"tiers"`` (by the clients' estimated speed) or ``"cost"`` (the full rank
    when the work fits the deadline, else the client is not asked); ``planner_knowledge``:
    what the server knows of a client's time; ``seed``: the stream of each round's new A."""

    rates: list = field(default_factory=lambda: [1.0, 0.5, 0.25])
    rank_rule: str = "tiers"
    planner_knowledge: str = "history"
    seed: int = 0

    width_rule = "cost"  # HeteroFL's planner under rank_rule "cost": every rank priced alike

    def validate(self) -> None:
        check_rates(self.rates)
        one_of("algorithm.rank_rule", self.rank_rule, RANK_RULES)
        one_of("algorithm.planner_knowledge", self.planner_knowledge, KNOWLEDGE)


def data_weights(updates) -> np.ndarray:
    """p_k = n_k / sum_j n_j over the delivered updates (FLoRA's weights)."""
    sizes = np.array([max(0, int(u.num_samples)) for u in updates], dtype=float)
    return sizes / sizes.sum() if sizes.sum() > 0 else np.full(len(updates), 1.0 / len(updates))


def fresh_adapter_a(shape: tuple[int, int], seed: int, round_index: int, position: int) -> torch.Tensor:
    """A new A (rank x in) drawn as a Linear's weight, uniform in +-1/sqrt(in), from the
    stream of (``seed``, round, the adapter's ``position``)."""
    rng = seeding.round_stream(seed, f"flora-a-{position}", round_index)
    bound = 1.0 / math.sqrt(shape[1])
    return torch.from_numpy(rng.uniform(-bound, bound, size=shape)).float()


class FLoRAAggregation(Aggregation):
    """FLoRA's stacking: the clients' products B_k A_k merged into the base (the module's
    recurrence), new adapters for the next round."""

    def init_state(self, setting) -> dict:
        if not setting.layout.adapters or any(a.weight < 0 for a in setting.layout.adapters):
            raise ConfigError(
                "algorithm 'flora' merges LoRA adapters into the base weights: it needs a model with "
                "adapters whose base is part of the global model (model.name = 'transformer', "
                "model.lora_rank > 0, model.lora_base = 'global')"
            )
        # a smaller rank costs the same arithmetic (the frozen base's): every rate priced 1
        return {"rate_cost": {str(float(r)): 1.0 for r in self.options.rates}, **knowledge_state(setting)}

    def aggregate(self, params, buffers, updates, state, context, layout):
        """W <- W + s sum_k p_k B_k A_k for every adapter; B <- 0, A <- a new draw (the
        module's recurrence; FLoRA Sec. 3, the stacked A and B)."""
        if not updates:
            return params, buffers
        weights = data_weights(updates)
        ends = [params.clone() for _ in updates]  # each client's adapters where it finished
        new_params, new_buffers = params.clone(), buffers.clone()
        for end, u, p in zip(ends, updates, weights, strict=True):
            region = u.coverage.region(layout)
            end[region] += u.delta
            new_params[region] += float(p) * u.delta  # parameters outside the adapters: the mean
            if buffers.numel():
                new_buffers[u.coverage.buffer_region(layout)] += float(p) * u.delta_buffers
        round_index = int(context.plan.round)
        for position, adapter in enumerate(layout.adapters):
            a_size, b_size = math.prod(adapter.a_shape), math.prod(adapter.b_shape)
            merged = sum(
                float(p)
                * end[adapter.b : adapter.b + b_size].view(adapter.b_shape)
                @ end[adapter.a : adapter.a + a_size].view(adapter.a_shape)
                for end, p in zip(ends, weights, strict=True)
            )
            weight = slice(adapter.weight, adapter.weight + adapter.b_shape[0] * adapter.a_shape[1])
            new_buffers[weight] += adapter.scale * merged.reshape(-1)
            new_params[adapter.b : adapter.b + b_size] = 0.0
            new_params[adapter.a : adapter.a + a_size] = fresh_adapter_a(
                adapter.a_shape, self.options.seed, round_index, position
            ).reshape(-1)
        return new_params, new_buffers


@register
class FLoRA(PlansFromKnowledge, Algorithm):
    """Clients train LoRA adapters of their tier's rank on the merged model; the server
    stacks them, merges the stack into the base and starts new adapters (the module's
    recurrence)."""

    name = "flora"
    summary = "FLoRA: stacked heterogeneous LoRA adapters merged into the base each round"
    Options = FLoRAOptions
    supports_channels_last = False
    Planner = HetLoRAPlanner
    Aggregation = FLoRAAggregation
    Reporting = LateSubModelsReporting
