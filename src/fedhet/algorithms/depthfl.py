"""DepthFL (Kim, Yu, Kim and Moon, "DepthFL: Depthwise Federated Learning for Heterogeneous
Clients", ICLR 2023): a slow client trains a shallower local model, the first k blocks of
the global model with the classifier after each of them, and the classifiers teach each
other (mutual self-distillation). Needs a multi-exit model (``mlp-exits``, ``cnn2-exits``, or
any model built with :func:`fedhet.models.exits.with_exits`).

- **Local depth** (DepthFL Sec. 3.1): client u gets the deepest k whose training cost fits the
  round's deadline: k = K if its full work does (full_time_u <= deadline), else the largest k
  with c(k) full_time_u <= deadline, c(k) the share of a training step's multiply-adds in
  blocks 1..k and their classifiers (fedhet's pricing of sub-models, as HeteroFL's and
  FjORD's); a client for which even k = 1 does not fit is not asked.
- **Local loss** (Sec. 3.2, with the authors' public baseline's form): over the exits
  z_1..z_k of the local model, sum_i [CE(z_i, y) + w_t / (k - 1) sum_{j != i}
  KL(softmax(z_j) || softmax(z_i))], the teacher softmax(z_j) detached, temperature 1. w_t is
  ``consistency_weight`` times the authors' ramp exp(-5 (1 - min(t, R)/R)^2) over the first
  R = ``consistency_rampup`` rounds (R = 0: no ramp). ``distillation = false`` drops the KL
  terms ("DepthFL (FedAvg)" without KD).
- **Aggregation** (Sec. 3.1): each layer (a block or a classifier) is the mean of the
  updates of the clients whose local model holds it; layers nobody trained keep their value.
- **Inference**: the global model's output is the ensemble of all its classifiers (the mean
  of their logits, as the authors' evaluation).

The paper's headline numbers add FedDyn's regularisation to the local objective; this is
its "DepthFL (FedAvg)" form with self-distillation. A client's update travels whole on
fedhet's clock (the layers beyond its depth as zeros): its upload is over-charged, not
under-charged, where uploads are priced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedhet.algorithms.aggregation import expand_per_layer
from fedhet.algorithms.base import Algorithm, register
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

EXITS = "exits"  # the task's and the update's payload key: the client's local depth k


@dataclass
class DepthFLOptions:
    """``distillation`` (mutual self-distillation), ``consistency_weight`` (the KL terms'
    weight once ramped up), ``consistency_rampup`` (rounds of the ramp; 0 = none) and
    ``planner_knowledge`` (what the server knows of a client's time when it picks its depth:
    :mod:`fedhet.algorithms.sub_models`)."""

    distillation: bool = True
    consistency_weight: float = 1.0
    consistency_rampup: int = 300
    planner_knowledge: str = "history"  # history | profile | oracle: what sizes a client's sub-model

    def validate(self) -> None:
        one_of("algorithm.planner_knowledge", self.planner_knowledge, KNOWLEDGE)
        if not self.consistency_weight >= 0:
            raise ConfigError(f"algorithm.consistency_weight = {self.consistency_weight}: must be >= 0")
        if self.consistency_rampup < 0:
            raise ConfigError(f"algorithm.consistency_rampup = {self.consistency_rampup}: must be >= 0")


def consistency_weight(weight: float, round_index: int, rampup: int) -> float:
    """w_t = weight exp(-5 (1 - min(t, R)/R)^2), the authors' sigmoid ramp (R = 0: weight)."""
    if rampup <= 0:
        return weight
    phase = 1.0 - min(round_index, rampup) / rampup
    return weight * float(np.exp(-5.0 * phase * phase))


class DepthFLPlanner(KnowledgePlanner):
    """DepthFL's planner: each client's depth (its classifiers up to an exit) sized to fit
    the deadline from the planner's estimate of its time."""

    def depth_for(self, full_time: float, deadline: float | None, level_cost: list[float]) -> int | None:
        """The local depth k of a client whose full work takes ``full_time``: K when it fits
        the deadline (or there is none), else the largest k with c(k) full_time <= deadline;
        None when no k fits."""
        return largest_fitting(dict(enumerate(level_cost, start=1)), full_time, deadline)

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        costs = state["level_cost"]
        k = fitting_level(
            context, client, lambda full_time, deadline: self.depth_for(full_time, deadline, costs),
            lambda level: costs[level - 1], state,
        )  # fmt: skip
        if k is None:
            return None
        plan = context.plan
        task = self.make_task(plan, client, plan.assignments[client].local_steps, Coverage(1), state)
        task.payload[EXITS] = int(k)
        task.work_share = float(costs[k - 1])
        return task


class DepthFLClient(ClientPart):
    """DepthFL's client: the loss over its exits with mutual self-distillation between them."""

    def local_loss(self, task, state, model, x, y, depth, loss, rng):
        """sum_i CE(z_i, y) + w_t/(k-1) sum_{i != j} KL(softmax z_j || softmax z_i) over the
        local model's exits (DepthFL Sec. 3.2); the task's loss and divergence (a
        regression's: squared error to the other exit's prediction)."""
        k = int(task.payload.get(EXITS, getattr(model, "num_exits", 1)))
        outputs = model.exits(x, k, depth)
        total = sum(loss(z, y) for z in outputs)
        weight = consistency_weight(
            self.options.consistency_weight, task.round, self.options.consistency_rampup
        )
        if self.options.distillation and len(outputs) > 1 and weight > 0:
            for divergence in loss.divergences(outputs):  # the task's (fedhet.data.task)
                total = total + weight * divergence / (len(outputs) - 1)
        return total

    def finish_local_work(self, task, update, state, region, local, anchor):
        """The client's depth k travels with its update; the server takes only the layers of
        level <= k from it (the others had no gradient)."""
        update.payload[EXITS] = int(task.payload.get(EXITS, 0))


class DepthFLAggregation(Aggregation):
    """DepthFL's aggregation: each layer averaged over the clients whose depth covers it."""

    def init_state(self, setting) -> dict:
        levels = setting.layout.exit_levels
        if not levels:
            raise ConfigError(
                "algorithm 'depthfl' needs a model with a classifier after each block: model.name = "
                "'mlp-exits' or 'cnn2-exits' (or a model built with fedhet.models.exits.with_exits)"
            )
        return {"level_cost": self.level_costs(setting.layout, setting.layer_multiply_adds),
                **knowledge_state(setting)}  # fmt: skip

    @staticmethod
    def level_costs(layout, layer_multiply_adds) -> list[float]:
        """c(k), k = 1..K: the share of a training step's multiply-adds (else of the
        parameters, where the counts are unknown) in the layers of level <= k."""
        levels = np.array(layout.exit_levels)
        if layer_multiply_adds and len(layer_multiply_adds) == len(levels):
            work = np.array(layer_multiply_adds, dtype=float)
        else:
            work = np.array([end - start for start, end in layout.param_slices.bounds], dtype=float)
        total = work.sum()
        return [float(work[levels <= k].sum() / total) for k in range(1, int(levels.max()) + 1)]

    def aggregate(self, params, buffers, updates, state, context, layout):
        """Each layer: the mean update over the clients whose local depth holds it."""
        if not updates:
            return params, buffers
        levels = torch.tensor(layout.exit_levels, dtype=torch.float32)
        slices = layout.param_slices
        counts = torch.zeros(len(levels))
        total = torch.zeros_like(params)
        new_buffers = buffers.clone()
        buffer_total = torch.zeros_like(buffers)
        for u in updates:
            k = int(u.payload.get(EXITS, len(state["level_cost"])))
            held = (levels <= k).to(torch.float32)
            counts += held
            total += u.delta * expand_per_layer(held, slices, params.numel())
            if buffers.numel():
                buffer_total += u.delta_buffers * expand_per_layer(
                    held, layout.buffer_slices, buffers.numel()
                )
        factor = torch.where(counts > 0, 1.0 / counts.clamp(min=1.0), torch.zeros_like(counts))
        new_params = params + total * expand_per_layer(factor, slices, params.numel())
        if buffers.numel():
            new_buffers += buffer_total * expand_per_layer(factor, layout.buffer_slices, buffers.numel())
        return new_params, new_buffers


@register
class DepthFL(PlansFromKnowledge, Algorithm):
    """The deepest local model that fits each client's deadline, mutual self-distillation
    among its classifiers, per-layer means over the clients holding each layer."""

    name = "depthfl"
    summary = "DepthFL: depth-scaled local models with a classifier per block, self-distillation"
    Options = DepthFLOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        "consistency_weight": {"low": 0.1, "high": 3.0, "log": True}
    }
    Planner = DepthFLPlanner
    Reporting = LateSubModelsReporting
    Client = DepthFLClient
    Aggregation = DepthFLAggregation
