"""TimelyFL (Zhang, Gao, Lee, Zhang and Avestimehr, "TimelyFL: Heterogeneity-aware
Asynchronous Federated Learning with Adaptive Partial Training", arXiv:2304.06947): every
round has a deadline set from the clients' own speeds, and each client gets the work it can
finish by it: fast clients more local epochs of the whole model, slow ones one epoch of only
the layers nearest the output. No update is stale and no planned update is late.

Each round, fedhet's form of TimelyFL's heterogeneity-aware workload scheduling (the
authors' code was not compared):

1. Each client's unit time t_i: one local epoch of the whole model and its communication,
   as the system model prices them (an "epoch" is ``train.local_steps`` steps here).
2. The aggregation interval T is the k-th smallest t_i (k = ``aggregation_goal``), so at
   least k clients can train the whole model once.
3. A client with t_i <= T trains the whole model for E_i epochs, the most that fit T
   (E_i c_i + b_i <= T with c_i an epoch's compute and b_i its communication, at most
   ``max_epochs``); a client with t_i > T trains one epoch of the top layers d..L for the
   smallest d (the largest share of the model) whose compute and upload fit T: the partial
   training ratio of the paper, taken from the output side because back-propagation runs
   output to input. A client for which not even the output layer fits is not asked.
4. The server averages each layer over the clients that trained it (the partially trained
   layers' own average; layers nobody trained keep their value).

Our readings where the paper leaves a choice to the implementation: times are the system
model's own (exactly, for models that draw nothing; else the mean of ``timing_draws``
draws), so the planned work of every client finishes by T under a deterministic model; the
upload priced in step 3 is the trained layers' float32 parameters (compression only makes it
faster); a client that misses T anyway (a random system model) is dropped like a
straggler, since TimelyFL aggregates only timely updates; the per-layer average is
unweighted, as SALF's. ``aggregation_goal = 0`` takes half the clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.algorithms.aggregation import expand_per_layer, layerwise_mean
from fedhet.algorithms.base import Algorithm, ClientAssignment, RoundPlan, register, require_time_law
from fedhet.algorithms.parts import Aggregation, Planner, Reporting
from fedhet.algorithms.salf import salf_layer_factor
from fedhet.algorithms.streaming import LayerwiseSumAggregator
from fedhet.errors import ConfigError
from fedhet.system.types import Workload

FLOAT_BYTES = 4


@dataclass
class TimelyFLOptions:
    """``aggregation_goal`` k (0 = half the clients): the deadline is the k-th fastest
    client's unit time; ``max_epochs``: the most local epochs a fast client is given;
    ``timing_draws``: draws of a random system model averaged into expected times."""

    aggregation_goal: int = 0
    max_epochs: int = 5
    timing_draws: int = 64

    def validate(self) -> None:
        if self.aggregation_goal < 0:
            raise ConfigError(
                f"algorithm.aggregation_goal = {self.aggregation_goal}: must be >= 0 (0 = half)"
            )
        if self.max_epochs < 1:
            raise ConfigError(f"algorithm.max_epochs = {self.max_epochs}: must be >= 1")
        if not 1 <= self.timing_draws <= 10_000:
            raise ConfigError(f"algorithm.timing_draws = {self.timing_draws}: must be in 1..10000")

    def validate_in(self, config) -> None:
        if self.aggregation_goal > config.data.num_clients:
            raise ConfigError(
                f"algorithm.aggregation_goal = {self.aggregation_goal}: more than the "
                f"{config.data.num_clients} clients"
            )


def expected_finish(system, work: Workload, draws: int) -> np.ndarray:
    """Each client's time to do all of ``work`` under ``system`` (no deadline): exact for a
    model that draws nothing, else the mean of ``draws`` draws on a fixed stream."""
    rng = np.random.default_rng(0)
    count = 1 if system.deterministic else draws
    return np.mean([system.full_times(work, rng) for _ in range(count)], axis=0)


class TimelyFLPlanner(Planner):
    """TimelyFL's planner: the round's deadline and each client's share of the model
    (layers) and steps from its profiled time."""

    def goal(self, num_clients: int) -> int:
        return self.options.aggregation_goal or max(1, (num_clients + 1) // 2)

    def schedule(self, system, batch_sizes: np.ndarray, state: dict):
        """(deadline T, epochs E_i, depth d_i, asked_i) of TimelyFL's workload scheduling."""
        n, L, K = system.num_clients, system.num_layers, self.train.local_steps
        draws = self.options.timing_draws
        down = np.full(n, state["download_bytes"])
        upload = state["upload_bytes"]

        def finish(depth: int, epochs: int) -> np.ndarray:
            work = Workload(
                None, batch_sizes, np.full(n, K * epochs), np.full(n, depth),
                upload_bytes=np.full(n, float(upload[depth - 1])), download_bytes=down,
            )  # fmt: skip
            return expected_finish(system, work, draws)

        one, two = finish(1, 1), finish(1, 2)
        epoch_compute = np.maximum(two - one, 1e-300)  # c_i: the model's time is linear in steps
        communication = one - epoch_compute  # b_i
        deadline = float(np.sort(one)[self.goal(n) - 1])  # the k-th fastest unit time
        slack = 1.0 + 1e-9
        epochs = np.floor((deadline * slack - communication) / epoch_compute).astype(int)
        epochs = np.clip(epochs, 0, self.options.max_epochs)
        depth = np.ones(n, dtype=int)
        partial = epochs < 1
        if partial.any():
            by_depth = np.stack([finish(d, 1) for d in range(1, L + 1)], axis=1)  # n x L
            fits = by_depth <= deadline * slack
            # the smallest d (most layers) that fits; L + 1 if none does
            depth = np.where(fits.any(axis=1), fits.argmax(axis=1) + 1, L + 1)
            depth[~partial] = 1
        asked = depth <= L
        epochs = np.where(partial, 1, epochs)
        depth = np.where(asked, depth, 1)  # not asked: nothing to price
        return deadline, epochs, depth, asked

    def plan(self, round_index, state, system, deadline):
        batch = np.full(system.num_clients, self.train.batch_size)
        round_deadline, epochs, depth, asked = self.schedule(system, batch, state)
        steps = self.train.local_steps
        assignments = [
            ClientAssignment(int(batch[i]), int(epochs[i]) * steps, asked=bool(asked[i]), depth=int(depth[i]))
            for i in range(system.num_clients)
        ]
        record = {"deadline": round_deadline, "epochs": epochs.tolist(), "depth": depth.tolist(),
                  "asked": asked.tolist()}  # fmt: skip
        return RoundPlan(round_index, round_deadline, self.lr_at(round_index), assignments, record)


class TimelyFLAggregation(Aggregation):
    """TimelyFL's aggregation: layer-wise means over the clients that trained each layer."""

    def init_state(self, setting) -> dict:
        require_time_law(setting.system, self.name)
        layout = setting.layout
        per_layer = [end - start for start, end in layout.param_slices.bounds]
        # bytes of an update over layers d..L, d = 1..L
        upload = [FLOAT_BYTES * sum(per_layer[d - 1 :]) for d in range(1, layout.num_layers + 1)]
        download = FLOAT_BYTES * (layout.num_params + layout.num_buffers)
        return {"upload_bytes": upload, "download_bytes": float(download), "log": []}

    def streaming_aggregator(self, params, buffers, tasks, state, context, layout):
        """Each layer's mean update over the clients that trained it; layers nobody trained
        keep their value."""

        def finish(param_sums, buffer_sums):
            counts = param_sums.counts
            factor = salf_layer_factor(counts, torch.zeros_like(counts), bias_correction=False)
            new_params = params + param_sums.total * expand_per_layer(
                factor, layout.param_slices, params.numel()
            )
            return new_params, layerwise_mean(buffers, buffer_sums)

        plan = context.plan.record
        asked = [d for d, a in zip(plan["depth"], plan["asked"], strict=True) if a]
        full = sum(1 for d in asked if d == 1)
        entry = {"round": context.plan.round + 1, "deadline": plan["deadline"], "full": full}
        entry.update(partial=len(asked) - full, not_asked=len(plan["depth"]) - len(asked))
        state["log"].append(entry)
        return LayerwiseSumAggregator(params, buffers, layout, finish)

    def aggregate(self, params, buffers, updates, state, context, layout):
        aggregator = self.streaming_aggregator(params, buffers, [], state, context, layout)
        for update in updates:
            aggregator.add(update)
        return aggregator.result()


class TimelyFLReporting(Reporting):
    """TimelyFL's report: deadlines and the workloads it assigned."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"timelyfl": {"rounds": state["log"]}}


@register
class TimelyFL(Algorithm):
    """A deadline from the k-th fastest client's unit time; more epochs for fast clients,
    the top layers for slow ones; per-layer averages (TimelyFL, arXiv:2304.06947)."""

    name = "timelyfl"
    summary = (
        "TimelyFL: adaptive deadline, epochs for fast clients, top layers for slow ones (arXiv:2304.06947)"
    )
    Options = TimelyFLOptions
    partial_work = "none"
    planner_knowledge = "profile"  # plans from the times the system model declares (expected_finish)
    Planner = TimelyFLPlanner
    Aggregation = TimelyFLAggregation
    Reporting = TimelyFLReporting
