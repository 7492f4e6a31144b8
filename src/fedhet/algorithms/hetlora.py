"""HetLoRA (Yae Jee Cho, Luyang Liu, Zheng Xu, Aldi Fahrezi, Gauri Joshi, "Heterogeneous LoRA
for Federated Fine-tuning of On-Device Foundation Models", EMNLP 2024): clients fine-tune
LoRA adapters of different ranks, each as its device allows, and the server aggregates them
zero-padded to the largest rank.

With global adapters of rank r (``model.lora_rank``) and rank shares ``rates`` (1, 1/2, 1/4:
ranks r, r/2, r/4), client k gets r_k = ceil(rate_k r): it trains A_k, the leading r_k rows
of every A, and B_k, the leading r_k columns of every B (:func:`fedhet.models.width.
rank_mask`; its B_k A_k is the global B A truncated to its first r_k rank components). The
server's step (``aggregate = "padded"``, HetLoRA's): every client's adapters zero-padded to
rank r and averaged over the U clients that delivered,

    A <- (1/U) sum_k pad(A_k),   B <- (1/U) sum_k pad(B_k);

``"held"`` averages each rank component over the clients that trained it instead.

Which rank a device gets (``rank_rule``): HetLoRA assigns ranks by device capability; here
``"tiers"`` sorts the clients by the planner's estimate of their full-work time
(``planner_knowledge``) into as many equal tiers as there are rates, the fastest tier the
largest rank; ``"cost"`` is HeteroFL's rule (the largest rank whose work fits the deadline;
with adapters a smaller rank costs about the same time, so nearly every client that fits
gets the full rank). A client whose work does not fit the deadline by its drawn time
delivers nothing (no partial work), as HeteroFL's. HetLoRA's local rank self-pruning and its
sparsity-weighted aggregation are not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.heterofl import HeteroFLAggregation, HeteroFLOptions, HeteroFLPlanner
from fedhet.algorithms.sub_models import (
    LateSubModelsReporting,
    PlansFromKnowledge,
    fitting_level,
    knowledge_state,
)
from fedhet.checks import one_of
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage

RANK_RULES = ("tiers", "cost")


@dataclass
class HetLoRAOptions(HeteroFLOptions):
    """HeteroFL's options, read as ranks: ``rates`` the rank shares (1, 1/2, 1/4),
    ``aggregate`` ``"padded"`` (HetLoRA's zero-padded mean) or ``"held"``; ``rank_rule``
    ``"tiers"`` (by the clients' estimated speed) or ``"cost"`` (HeteroFL's deadline rule)."""

    rates: list = field(default_factory=lambda: [1.0, 0.5, 0.25])
    aggregate: str = "padded"
    rank_rule: str = "tiers"

    def validate(self) -> None:
        super().validate()
        one_of("algorithm.rank_rule", self.rank_rule, RANK_RULES)


class HetLoRAPlanner(HeteroFLPlanner):
    """HetLoRA's planner: each client's rank share by its speed tier (or HeteroFL's rule)."""

    def tier_rate(self, context, client: int) -> float:
        """The rate of ``client``'s tier: clients sorted by estimated full-work time (the
        plan's estimate; the drawn one under the oracle), split into len(rates) equal tiers,
        the fastest getting the largest rate."""
        estimates = context.plan.record.get("estimated_full_time") if context.plan.record else None
        times = np.asarray(estimates if estimates is not None else context.outcomes.full_time, dtype=float)
        position = int(np.flatnonzero(np.argsort(times, kind="stable") == client)[0])
        rates = sorted((float(r) for r in self.options.rates), reverse=True)
        return rates[min(len(rates) - 1, position * len(rates) // len(times))]

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        if self.options.rank_rule == "cost":
            return super().client_task(context, client, state)
        rate = self.tier_rate(context, client)

        def choose(estimate: float, deadline: float | None):
            return rate if deadline is None or estimate <= deadline * (1 + 1e-12) else None

        level = fitting_level(context, client, choose, lambda r: 1.0, state)
        if level is None:
            return None
        plan = context.plan
        task = self.make_task(
            plan, client, plan.assignments[client].local_steps, Coverage(1, float(level)), state
        )
        return replace(task, work_share=1.0)


class HetLoRAAggregation(HeteroFLAggregation):
    """HeteroFL's ``padded`` or ``held`` aggregation over the adapters' rank components."""

    def init_state(self, setting) -> dict:
        if not setting.layout.rank_axes:
            raise ConfigError(
                "algorithm 'hetlora' truncates LoRA adapters' ranks: it needs a model with adapters "
                "(model.name = 'transformer' with model.lora_rank > 0)"
            )
        # a smaller rank costs the same arithmetic (the frozen base's): every rate priced 1
        return {"rate_cost": {str(float(r)): 1.0 for r in self.options.rates}, **knowledge_state(setting)}


@register
class HetLoRA(PlansFromKnowledge, Algorithm):
    """Clients train LoRA adapters truncated to the rank their speed tier gets; the server
    averages them zero-padded to the full rank (the module's recurrence)."""

    name = "hetlora"
    summary = "HetLoRA: heterogeneous LoRA ranks by device, zero-padded aggregation"
    Options = HetLoRAOptions
    supports_channels_last = False
    Planner = HetLoRAPlanner
    Aggregation = HetLoRAAggregation
    Reporting = LateSubModelsReporting
