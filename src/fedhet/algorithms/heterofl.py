"""HeteroFL (Diao et al., "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021), the width-scaling baseline of SALF and
ADEL-FL: a client too slow for the full model by the deadline trains a sub-model of width
rate r instead (:mod:`fedhet.models.width`), and the server averages each parameter element
over the clients whose sub-models hold it.

Two choices the papers leave to the reader are options:

- which width a straggler gets: ``width_rule = "cost"`` (the widest rate whose step cost fits
  the deadline, the cost priced by ``sub_model_cost``) or ``"fixed"`` (every straggler trains
  ``fixed_rate``, 0.5 by default: SALF Sec. IV's setting, "stragglers train width 0.5");
- how sub-models are averaged: ``aggregate = "held"`` (HeteroFL Sec. 3.1: each element over
  the clients holding it) or ``"padded"`` (a sub-model is padded with zeros to the full
  shape and all models are averaged, the sum divided by the number of updates U — a reading
  found in public HeteroFL code, under which weights outside a sub-model shrink by the share
  of clients holding them, every round).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.parts import Aggregation
from fedhet.algorithms.sub_models import (
    KNOWLEDGE,
    KnowledgePlanner,
    LateSubModelsReporting,
    PlansFromKnowledge,
    fitting_level,
    knowledge_state,
    largest_fitting,
    require_unit_layers,
)
from fedhet.checks import one_of
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage
from fedhet.models.cost import sub_model_step_share
from fedhet.models.width import width_mask

DEFAULT_RATES = [1.0, 0.5, 0.25, 0.125, 0.0625]  # HeteroFL's levels a..e
WIDTH_RULES = ("cost", "fixed")
SUB_MODEL_COSTS = ("multiply-adds", "rate-squared")
AGGREGATIONS = ("held", "padded")


@dataclass
class HeteroFLOptions:
    """``rates``: the sub-model widths a client may get, largest first (HeteroFL's levels);
    ``width_rule``: ``"cost"`` (the widest rate that fits the deadline) or ``"fixed"`` (every
    client that cannot finish the full model trains ``fixed_rate``); ``sub_model_cost``: how a
    rate's cost is priced, ``"multiply-adds"`` (default: the sub-model's training-step FLOPs
    from the model's layers, :func:`fedhet.models.cost.sub_model_step_share`) or
    ``"rate-squared"`` (r^2, HeteroFL Sec. 3.1's estimate, exact only for layers whose inputs
    and outputs both shrink); ``aggregate``: ``"held"`` or ``"padded"``; ``planner_knowledge``:
    what the server knows of a client's time when it sizes its sub-model
    (:mod:`fedhet.algorithms.sub_models`)."""

    rates: list = field(default_factory=lambda: list(DEFAULT_RATES))
    width_rule: str = "cost"
    fixed_rate: float = 0.5
    sub_model_cost: str = "multiply-adds"
    aggregate: str = "held"
    bn_examples: int = 0  # static BatchNorm: training examples to recompute statistics on (0 = all)
    planner_knowledge: str = "history"  # history | profile | oracle: what sizes a client's sub-model

    def validate(self) -> None:
        one_of("algorithm.planner_knowledge", self.planner_knowledge, KNOWLEDGE)
        if self.bn_examples < 0:
            raise ConfigError(f"algorithm.bn_examples = {self.bn_examples}: must be >= 0 (0 = all)")
        check_rates(self.rates)
        one_of("algorithm.width_rule", self.width_rule, WIDTH_RULES)
        one_of("algorithm.sub_model_cost", self.sub_model_cost, SUB_MODEL_COSTS)
        one_of("algorithm.aggregate", self.aggregate, AGGREGATIONS)
        rate = self.fixed_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            raise ConfigError(f"algorithm.fixed_rate = {rate!r}: must be in (0, 1]")


def check_rates(rates) -> None:
    """Refuse, in one line, rates that are not numbers in (0, 1] including 1."""
    if (
        not isinstance(rates, list)
        or not rates
        or not all(isinstance(r, int | float) and not isinstance(r, bool) and 0 < r <= 1 for r in rates)
    ):
        raise ConfigError(f"algorithm.rates = {rates!r}: need rates in (0, 1]")
    if 1 not in rates:
        raise ConfigError(f"algorithm.rates = {rates!r}: must include 1 (the full model)")


class HeteroFLPlanner(KnowledgePlanner):
    """HeteroFL's planner: each client's width rate sized to fit the deadline from the
    planner's estimate of its time; the task carries the width."""

    def rate_for(
        self, full_time: float, deadline: float | None, rate_cost: dict | None = None
    ) -> float | None:
        """The width client u trains: 1 without a deadline or when T_u fits it; else
        ``fixed_rate`` (``width_rule = "fixed"``) or the largest rate r with
        cost(r) T_u <= deadline (None when none fits); cost(r) = ``rate_cost[str(r)]``,
        r^2 where not given."""
        if deadline is None or full_time <= deadline * (1 + 1e-12):
            return 1.0
        if self.options.width_rule == "fixed":
            return float(self.options.fixed_rate)
        rate_cost = rate_cost or {}
        costs = {float(r): rate_cost.get(str(float(r)), float(r) ** 2) for r in self.options.rates}
        return largest_fitting(costs, full_time, deadline)

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        rate_cost = state.get("rate_cost") or {}

        def cost(r: float) -> float:
            return 1.0 if r >= 1 else rate_cost.get(str(float(r)), float(r) ** 2)

        rate = fitting_level(
            context, client,
            lambda full_time, deadline: self.rate_for(full_time, deadline, state.get("rate_cost")),
            cost, state,
        )  # fmt: skip
        if rate is None:
            return None
        plan = context.plan
        task = self.make_task(
            plan, client, plan.assignments[client].local_steps, Coverage(1, float(rate)), state
        )
        return replace(task, work_share=float(cost(rate)))


class HeteroFLAggregation(Aggregation):
    """HeteroFL's aggregation: each parameter element averaged over the clients whose
    sub-model holds it."""

    def init_state(self, setting) -> dict:
        """Prices every rate once: {rate: cost share of a full step} (kept in the state, so a
        resumed run uses the prices it started with)."""
        require_unit_layers(setting.layout, self.rule.name)
        return {"rate_cost": self.rate_costs(setting.layout, setting.layer_multiply_adds),
                **knowledge_state(setting)}  # fmt: skip

    def rate_costs(self, layout, layer_multiply_adds) -> dict[str, float]:
        """Each rate's cost as a share of the full model's training step: r^2, or the share
        of the step's FLOPs (``multiply-adds``; r^2 when the model's counts are unknown)."""
        costs = {}
        for rate in self.options.rates:
            r = float(rate)
            if self.options.sub_model_cost == "multiply-adds" and layer_multiply_adds and r < 1:
                costs[str(r)] = sub_model_step_share(layout, layer_multiply_adds, r)
            else:
                costs[str(r)] = r * r
        return costs

    def aggregate(self, params, buffers, updates, state, context, layout):
        """``held``: element-wise mean of the deltas over the clients whose sub-model holds
        the element (HeteroFL Sec. 3.1); with every client at rate 1 this is FedAvg's uniform
        mean. ``padded``: the mean over all U updates of the zero-padded models,
        w + (sum_u Delta_u - (U - h) w) / U with h the number of holders of each element."""
        if not updates:
            return params, buffers
        total = torch.zeros_like(params)
        holders = torch.zeros_like(params)
        masks: dict[tuple[float, int, int], torch.Tensor] = {}
        for u in updates:
            key = u.coverage.width_key()
            if key not in masks:
                masks[key] = width_mask(layout, *key).to(params.dtype)
            region = u.coverage.region(layout)  # layers depth..L (SLT freezes those below)
            total[region].add_(u.delta)
            holders[region].add_(masks[key][region])
        if self.options.aggregate == "padded":
            count = float(len(updates))
            return params * (holders / count) + total / count, buffers
        step = torch.where(holders > 0, total / holders.clamp(min=1.0), torch.zeros_like(total))
        return params + step, buffers  # static BatchNorm: clients' running statistics are not used


@register
class HeteroFL(PlansFromKnowledge, Algorithm):
    """Client u, whose full local work would take T_u (the system model's ``full_time``),
    trains every layer for all its local steps on a sub-model of rate r (hidden outputs
    divided by r). With ``width_rule = "cost"`` r is the largest rate with c(r) T_u <=
    deadline, c(r) the rate's cost share (``sub_model_cost``), and a client for which not even
    the smallest fits is not asked; with ``"fixed"`` a client with T_u > deadline trains
    ``fixed_rate`` whatever it costs. Aggregation ``held``: w_{t+1}[e] = w_t[e] + mean over
    the clients holding e of Delta_u[e], elements nobody held keep their value; ``padded``:
    w_{t+1}[e] = (1/U) sum_u w_u[e] with w_u[e] = 0 outside u's sub-model. BatchNorm is static
    (HeteroFL Sec. 3.1): clients normalise with their batches' statistics and send none; the
    server ignores running statistics in aggregation and recomputes them on the full model
    from training data before each evaluation (``bn_examples``;
    :mod:`fedhet.models.batchnorm`). A sub-model's BatchNorm entries outside it are zero, so
    its dropped channels stay zero."""

    name = "heterofl"
    supports_channels_last = False  # width masks index the contiguous weight order
    summary = "HeteroFL: slow clients train width-reduced sub-models"
    Options = HeteroFLOptions

    def __init__(self, options, train):
        super().__init__(options, train)
        self.static_batchnorm_examples = int(options.bn_examples)

    Planner = HeteroFLPlanner
    Reporting = LateSubModelsReporting
    Aggregation = HeteroFLAggregation


class FedRolexPlanner(HeteroFLPlanner):
    """FedRolex's planner: HeteroFL's widths, with the kept channels rolling by one each round."""

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        task = super().client_task(context, client, state)
        if task is None or task.coverage.width >= 1.0:
            return task
        return replace(task, coverage=replace(task.coverage, offset=int(context.plan.round)))


@register
class FedRolex(HeteroFL):
    """FedRolex (Alam, Liu, Yan, Zhang, "FedRolex: Model-Heterogeneous Federated Learning with
    Rolling Sub-Model Extraction", NeurIPS 2022, arXiv:2212.01548): HeteroFL's widths and
    aggregation, but in round t a client of rate r < 1 trains the units (t + j) mod K,
    j < ceil(r K), of each hidden layer of K units: a window that rolls one unit per round,
    so that the slow clients train every part of the global model in turn, where HeteroFL's
    always train the leading units (Coverage's ``offset`` = t; :func:`fedhet.models.width.
    kept_indices`). Options, widths per client and the ``held`` or ``padded`` averaging are
    HeteroFL's."""

    name = "fedrolex"
    summary = "FedRolex: HeteroFL's widths with a sub-model window rolling one unit per round"
    Planner = FedRolexPlanner
