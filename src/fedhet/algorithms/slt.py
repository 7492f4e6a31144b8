"""SLT, successive layer training (Kilian Pfeiffer, Ramin Khalili, Jörg Henkel, "Aggregating
Capacity in FL through Successive Layer Training for Computationally-Constrained Devices",
NeurIPS 2023): a constrained device freezes the first layers, trains one layer whole and a
width-reduced head above it, and the trained layer moves from the input to the output over
the run.

The run is split into L stages (L layer groups, input to output); in stage k (round t in
stage k = min(L, 1 + t // S), S = ``stage_rounds``):

- a client that can do the full model's work by the deadline trains the full model;
- a constrained client trains configuration (K_F = k - 1, K_T = k, s): layers 1..k-1 frozen
  (forward pass only, nothing stored for back-propagation), layer k trained whole, and the
  head k+1..L at width s (HeteroFL's leading units of every hidden layer; the output layer
  keeps its classes; hidden outputs divided by s, HeteroFL's scaler), s the largest of
  ``rates`` whose configuration fits the deadline (its training step's FLOPs as a share of
  the full model's, :func:`fedhet.models.cost.sub_model_step_share`: the frozen layers cost
  their forward pass); a client no configuration fits is not asked;
- the server averages each parameter element over the clients that trained it (HeteroFL's
  ``held`` aggregation, over the layers each update covers); elements nobody trained keep
  their value.

SLT sizes s against a device's memory; fedhet's devices are limited by time, so the same
rule reads "what fits" as the work that fits the deadline, with the planner's knowledge of
the client's time (``planner_knowledge``, :mod:`fedhet.algorithms.sub_models`), as HeteroFL
does. The paper's stage lengths come from its run; here S = ``stage_rounds``, by default
the run's rounds split evenly over the L stages, the rounds being ``run.rounds``, or under a
time budget the rounds the budget holds at one deadline each (a round of a deadline rule
lasts at most its deadline: when rounds end earlier the stages run ahead and the last one
lasts longer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.heterofl import DEFAULT_RATES, HeteroFLAggregation
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
from fedhet.errors import ConfigError, FedhetError
from fedhet.messages import ClientTask, Coverage
from fedhet.models.cost import sub_model_step_share, training_step_flops

FULL = "full"  # the level of a client that trains the full model


@dataclass
class SLTOptions:
    """``rates``: the head widths s a constrained client may get, largest first (HeteroFL's
    levels 1..1/16); ``stage_rounds``: rounds per stage (0: the run split evenly over the L
    stages); ``bn_examples``: static BatchNorm as HeteroFL's; ``planner_knowledge``: what the
    server knows of a client's time when it sizes its configuration."""

    rates: list = field(default_factory=lambda: list(DEFAULT_RATES))
    stage_rounds: int = 0
    bn_examples: int = 0
    planner_knowledge: str = "history"

    aggregate = "held"  # HeteroFL's aggregation, over the layers each update covers

    def validate(self) -> None:
        one_of("algorithm.planner_knowledge", self.planner_knowledge, KNOWLEDGE)
        rates = self.rates
        if not rates or not all(
            isinstance(r, int | float) and not isinstance(r, bool) and 0 < r <= 1 for r in rates
        ):
            raise ConfigError(f"algorithm.rates = {rates!r}: need head widths in (0, 1]")
        if self.stage_rounds < 0:
            raise ConfigError(f"algorithm.stage_rounds = {self.stage_rounds}: must be >= 0 (0 = even split)")
        if self.bn_examples < 0:
            raise ConfigError(f"algorithm.bn_examples = {self.bn_examples}: must be >= 0 (0 = all)")


def stage_costs(layout, layer_multiply_adds, rates) -> dict[int, dict[float, float]]:
    """For each stage k = 1..L and head width s: the configuration's training step as a share
    of the full model's (s^2 (L - k + 1) / L where the model's counts are unknown). Where
    the head has no hidden layer (k >= L - 1) every s is the whole head: width 1 alone."""
    layers = layout.num_layers
    costs: dict[int, dict[float, float]] = {}
    full = training_step_flops(layer_multiply_adds, 1) if layer_multiply_adds else 0.0
    for k in range(1, layers + 1):
        widths = [1.0] if k >= layers - 1 else sorted({float(r) for r in rates}, reverse=True)
        if not full:
            costs[k] = {r: r * r * (layers - k + 1) / layers for r in widths}
        elif k >= layers - 1:
            costs[k] = {1.0: training_step_flops(layer_multiply_adds, 1, k) / full}
        else:
            costs[k] = {r: sub_model_step_share(layout, layer_multiply_adds, r, k, k) for r in widths}
    return costs


class SLTPlanner(KnowledgePlanner):
    """SLT's planner: the round's stage, and each client's configuration (the module's
    rules)."""

    def stage_rounds(self, state: dict, deadline: float | None) -> int:
        """S: ``stage_rounds``, or the run's rounds split evenly over the L stages."""
        if self.options.stage_rounds:
            return int(self.options.stage_rounds)
        rounds, budget, layers = state["slt_rounds"], state["slt_time_budget"], state["slt_layers"]
        if budget > 0:
            if not deadline:
                raise FedhetError("algorithm.stage_rounds = 0 splits a time budget by the deadline: "
                                  "set system.deadline or algorithm.stage_rounds")  # fmt: skip
            rounds = min(rounds, math.floor(budget / deadline + 1e-9))
        return max(1, math.ceil(rounds / layers))

    def plan(self, round_index, state, system, deadline):
        plan = super().plan(round_index, state, system, deadline)
        stage = min(state["slt_layers"], 1 + round_index // self.stage_rounds(state, deadline))
        return replace(plan, record={**plan.record, "slt_stage": stage})

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        stage = context.plan.record["slt_stage"]
        costs = state["slt_costs"][stage]

        def choose(full_time: float, deadline: float | None):
            if deadline is None or full_time <= deadline * (1 + 1e-12):
                return FULL
            return largest_fitting(costs, full_time, deadline)

        level = fitting_level(context, client, choose, lambda s: 1.0 if s == FULL else costs[s], state)
        if level is None:
            return None
        plan = context.plan
        coverage = Coverage() if level == FULL else Coverage(stage, float(level), 0, stage)
        task = self.make_task(plan, client, plan.assignments[client].local_steps, coverage, state)
        return replace(task, work_share=1.0 if level == FULL else float(costs[level]))


class SLTAggregation(HeteroFLAggregation):
    """HeteroFL's ``held`` aggregation over the layers each update covers; the stages'
    prices and the run's length kept in the state (a resumed run keeps them)."""

    def init_state(self, setting) -> dict:
        require_unit_layers(setting.layout, self.rule.name)
        return {
            "slt_costs": stage_costs(setting.layout, setting.layer_multiply_adds, self.options.rates),
            "slt_rounds": int(setting.rounds),
            "slt_time_budget": float(setting.time_budget),
            "slt_layers": int(setting.layout.num_layers),
            "slt_stage": 1,
            **knowledge_state(setting),
        }

    def aggregate(self, params, buffers, updates, state, context, layout):
        state["slt_stage"] = int(context.plan.record["slt_stage"])
        return super().aggregate(params, buffers, updates, state, context, layout)


class SLTReporting(LateSubModelsReporting):
    """SLT's metrics: the round's stage (the layer trained whole) and the late sub-models."""

    def round_metrics(self, state: dict) -> dict[str, float]:
        return {**super().round_metrics(state), "slt_stage": float(state["slt_stage"])}


@register
class SLT(PlansFromKnowledge, Algorithm):
    """Constrained clients freeze the layers below stage k's, train layer k whole and a head
    of the widest fitting width above it; the others train the full model; each element is
    averaged over the clients that trained it (the module's rules)."""

    name = "slt"
    supports_channels_last = False  # width masks index the contiguous weight order
    summary = (
        "SLT: constrained clients freeze early layers, train one whole and a narrow head, stage by stage"
    )
    Options = SLTOptions
    Planner = SLTPlanner
    Aggregation = SLTAggregation
    Reporting = SLTReporting

    def __init__(self, options, train):
        super().__init__(options, train)
        self.static_batchnorm_examples = int(options.bn_examples)
