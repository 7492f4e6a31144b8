"""FIARSE (Wu, Wang, Wang, Liu, Su, Gao, "FIARSE: Model-Heterogeneous Federated Learning via
Importance-Aware Submodel Extraction", NeurIPS 2024, arXiv:2407.19389): a slow client's
sub-model is the share r of the global model's parameters with the largest magnitudes, and
it trains it with threshold-controlled biased gradient descent (TCB-GD).

- **Sub-model.** Client u's rate r is the largest of ``rates`` whose share of the work fits
  the deadline (:func:`~fedhet.algorithms.sub_models.largest_fitting`, the rule HeteroFL,
  FedRolex, FjORD and DepthFL share); a sub-model of a share r of the parameters is priced
  as r of the full work (the paper's premise that compute follows the sub-model's size).
  Its threshold theta is the r-quantile of |x| from the top, per layer (``scope =
  "layer"``: each module's weight and bias together, the authors' layer-wise variant) or
  over the whole model (``"model"``), computed on the model the client receives.
- **TCB-GD (local steps).** The forward pass uses x * m(|x|), m(s) = 1[s >= theta]; the
  backward pass takes m'(s) = 2 theta / (s + theta)^2 on the kept elements, so a kept
  parameter's gradient is g (1 + 2 theta |x| / (|x| + theta)^2) and a dropped one's is 0
  (the gradient of the masked model, biased toward keeping large parameters large). A
  parameter that shrinks below theta during the local steps leaves the sub-model.
- **Aggregation.** x <- x + eta sum_u Delta_u / |{u : Delta_u != 0}|, element by element
  (each parameter averaged over the clients that changed it); BatchNorm statistics are
  averaged over all updates.

Defaults: HeteroFL's rates (1, 1/2, 1/4, 1/8, 1/16), layer-wise thresholds, eta = 1. At
rate 1 the thresholds are 0: nothing is masked and TCB-GD's factor is 1, so with every
client at rate 1 FIARSE is FedAvg with each element averaged over the clients that moved it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.heterofl import DEFAULT_RATES, check_rates
from fedhet.algorithms.parts import Aggregation, ClientPart
from fedhet.algorithms.sub_models import (
    KNOWLEDGE,
    KnowledgePlanner,
    LateSubModelsReporting,
    PlansFromKnowledge,
    fitting_level,
    knowledge_state,
    largest_fitting,
)
from fedhet.checks import one_of
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage


@dataclass
class FIARSEOptions:
    """``rates``: the sub-model sizes a client may get (shares of the parameters, 1 among
    them); ``scope``: thresholds per ``layer`` or over the whole ``model``; ``server_lr``
    eta; ``planner_knowledge``: what the server knows of a client's time when it sizes its
    sub-model (:mod:`fedhet.algorithms.sub_models`)."""

    rates: list = field(default_factory=lambda: list(DEFAULT_RATES))
    scope: str = "layer"  # layer (each module's parameters) | model (one threshold)
    server_lr: float = 1.0  # eta, the server's step on the element-wise mean update
    planner_knowledge: str = "history"  # history | profile | oracle: what sizes a client's sub-model

    def validate(self) -> None:
        one_of("algorithm.planner_knowledge", self.planner_knowledge, KNOWLEDGE)
        check_rates(self.rates)
        one_of("algorithm.scope", self.scope, ("layer", "model"))
        if not 0 < self.server_lr < float("inf"):
            raise ConfigError(f"algorithm.server_lr = {self.server_lr!r}: must be > 0")


class _Keep(torch.autograd.Function):
    """m(s) = 1[s >= theta] forward; 2 theta / (s + theta)^2 on the kept elements backward
    (TCB-GD's surrogate derivative of the mask)."""

    @staticmethod
    def forward(ctx, magnitude: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(magnitude, threshold)
        return (magnitude >= threshold).to(magnitude.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        magnitude, threshold = ctx.saved_tensors
        slope = torch.nan_to_num(2 * threshold / (magnitude + threshold) ** 2, nan=0.0, posinf=0.0)
        return grad * slope * (magnitude >= threshold), None


def masked(parameter: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """x * m(|x|) with TCB-GD's gradient."""
    return parameter * _Keep.apply(parameter.abs(), threshold)


def thresholds(named: list[tuple[str, torch.Tensor]], rate: float, scope: str) -> dict[str, torch.Tensor]:
    """theta per parameter name: the magnitude of the ceil(r n)-th largest of each module's
    parameters (``layer``) or of all of them (``model``); 0 (keep all) at r = 1."""
    groups: dict[str, list[str]] = {}
    for name, _ in named:
        groups.setdefault(name.rsplit(".", 1)[0] if scope == "layer" else "", []).append(name)
    values = dict(named)
    out = {}
    for members in groups.values():
        magnitudes = torch.cat([values[n].detach().abs().reshape(-1) for n in members])
        keep = max(1, int(-(-rate * magnitudes.numel() // 1)))
        # the keep-th largest: the (n - keep + 1)-th smallest, the same element (kthvalue
        # selects it 5-7x faster than topk sorts the keep largest: 0.06-0.2 against 0.4-1.0
        # ms for the 25,120 weights of the MLP's first layer)
        smallest = magnitudes.numel() - keep + 1
        theta = torch.zeros((), dtype=magnitudes.dtype) if rate >= 1 else magnitudes.kthvalue(smallest).values
        out.update(dict.fromkeys(members, theta))
    return out


class FIARSEPlanner(KnowledgePlanner):
    """FIARSE's planner: each client's sub-model rate sized to fit the deadline from the
    planner's estimate of its time."""

    def rate_for(self, full_time: float, deadline: float | None) -> float | None:
        """The largest rate r with r x T_u <= deadline (None: none fits)."""
        return largest_fitting({float(r): float(r) for r in self.options.rates}, full_time, deadline)

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        rate = fitting_level(context, client, self.rate_for, float, state)
        if rate is None:
            return None
        plan = context.plan
        task = self.make_task(plan, client, plan.assignments[client].local_steps, Coverage(1), state)
        task.payload["rate"] = float(rate)
        task.work_share = float(rate)
        return task


class FIARSEClient(ClientPart):
    """FIARSE's client: trains the importance-selected sub-model (the largest-magnitude
    parameters up to its rate) through a straight-through mask."""

    local_loss_per_client: ClassVar[bool] = True  # the client's own rate and thresholds

    def local_loss(self, task, state, model, x, y, depth, loss, rng):
        """The loss of the masked model x * m(|x|), thresholds set on the received model (the
        first step's parameters) and kept for the task's steps; at rate 1 (theta = 0, the mask
        all ones and its surrogate slope 0) the model's own loss, the same numbers."""
        if float(task.payload["rate"]) >= 1:
            return loss(model(x, depth), y)
        named = list(model.named_parameters())
        if state.get("thresholds_for") != (task.round, task.client):
            state["thresholds"] = thresholds(named, float(task.payload["rate"]), self.options.scope)
            state["thresholds_for"] = (task.round, task.client)
        limits = state["thresholds"]
        effective = {name: masked(p, limits[name].to(p.device)) for name, p in named}
        return loss(torch.func.functional_call(model, effective, (x, depth)), y)

    def finish_local_work(self, task, update, state, region, local, anchor) -> None:
        """The task's thresholds are not kept past it."""
        state.pop("thresholds", None)
        state.pop("thresholds_for", None)


class FIARSEAggregation(Aggregation):
    """FIARSE's aggregation: each parameter averaged over the clients whose mask kept it."""

    def init_state(self, setting) -> dict:
        """What the server knows of its clients' times (:func:`knowledge_state`)."""
        return knowledge_state(setting)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """x + eta sum_u Delta_u / (clients that changed each element); buffers averaged."""
        if not updates:
            return params, buffers
        total, movers = torch.zeros_like(params), torch.zeros_like(params)
        for u in updates:
            total.add_(u.delta)
            movers.add_((u.delta != 0).to(params.dtype))
        step = torch.where(movers > 0, total / movers.clamp(min=1.0), torch.zeros_like(total))
        new_buffers = buffers.clone()
        if buffers.numel():
            for u in updates:
                new_buffers.add_(u.delta_buffers, alpha=1.0 / len(updates))
        return params + self.options.server_lr * step, new_buffers


@register
class FIARSE(PlansFromKnowledge, Algorithm):
    """A client too slow for the full model trains the share r of the parameters with the
    largest magnitudes (the largest of ``rates`` that fits the deadline; thresholds per
    module or over the model, set on the received model), masked in the forward pass and
    trained with TCB-GD's surrogate gradient; the server averages each element over the
    clients that changed it (FIARSE Sec. 3-4)."""

    name = "fiarse"
    summary = "FIARSE: sub-models of the largest-magnitude parameters, TCB-GD (Wu et al. NeurIPS 2024)"
    Options = FIARSEOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": {"low": 0.5, "high": 1.5}}
    Planner = FIARSEPlanner
    Reporting = LateSubModelsReporting
    Client = FIARSEClient
    Aggregation = FIARSEAggregation
