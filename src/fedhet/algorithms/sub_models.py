"""The largest sub-model that fits a deadline: the choice HeteroFL, FedRolex and FjORD make
among widths and DepthFL and FIARSE among depths and shares, one rule for all of them, and
what the server knows when it makes it.

**What the server knows** (``algorithm.planner_knowledge``). A real server sizes a client's
sub-model before the round, from what it can know of the client's speed, and learns whether
the work fit only when the client reports:

- ``history`` (the default): the client's full-work time as it reported it the last time it
  was asked (a client measures its speed on the steps it did, even when it misses the
  deadline); before its first report, ``profile``;
- ``profile``: the time the system model declares to expect of the client (the mean of
  :data:`PROFILE_DRAWS` draws on a fixed stream; exact for a model that draws nothing);
- ``oracle``: this round's drawn time, as if the server knew in advance who straggles and
  how far (the reading of papers that assume it; labelled, for reproducing them).

The drawn time then decides: a client whose sub-model does not fit its drawn time works
until the deadline and delivers nothing (these rules use no partial work); the run counts
such clients (``late_sub_models``, a metrics column: the total so far).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from fedhet.algorithms.parts import Planner, Reporting
from fedhet.errors import ConfigError

KNOWLEDGE = ("history", "profile", "oracle")
PROFILE_DRAWS = 32  # draws of a random system model averaged into a client's expected time
FLOAT_BYTES = 4


def largest_fitting(costs: Mapping, full_time: float, deadline: float | None):
    """The largest level whose cost share c fits: c x ``full_time`` <= ``deadline``, where
    ``costs`` maps each level (a width, a depth) to its share of the full model's work and
    ``full_time`` is the client's time for the full model's work. Without a deadline, or
    when the full work fits, the largest level (the full model); None when no level fits
    (HeteroFL Sec. 3.1's "the largest sub-model the client can afford", DepthFL's deepest
    local model)."""
    slack = 1 + 1e-12
    if deadline is None or full_time <= deadline * slack:
        return max(costs)
    fitting = [level for level, cost in costs.items() if cost * full_time <= deadline * slack]
    return max(fitting) if fitting else None


def require_unit_layers(layout, rule: str, ranks: bool = True) -> None:
    """A width rule needs a model whose layers are chains of units (its masks keep the
    leading units of each), or, with ``ranks``, adapters with a rank axis (the masks then
    keep their leading ranks); one line otherwise (a transformer's heads are not units)."""
    if not layout.unit_layers and not (ranks and layout.rank_axes):
        raise ConfigError(
            f"algorithm {rule!r} trains width-reduced sub-models, which cut the units of Linear and "
            "Conv layers (or the ranks of LoRA adapters); this model has other layers (embeddings, "
            "attention, LayerNorm) and no adapters: choose a depth rule (salf, adel-fl, depthfl, "
            "timelyfl) or drop"
        )


def knowledge_state(setting) -> dict:
    """The server state the estimates need: each client's last reported full-work time,
    the late clients counted so far, the full model's bytes (its download and upload)."""
    layout = setting.layout
    size = float(FLOAT_BYTES * (layout.num_params + layout.num_buffers))
    return {"reported_time": [None] * setting.num_clients, "late_sub_models": 0, "model_bytes": size}


def expected_full_times(system, batch_size: int, local_steps: int, model_bytes: float) -> np.ndarray:
    """Each client's expected time for the full model's work (``profile``): exact for a
    system model that draws nothing, else the mean of :data:`PROFILE_DRAWS` draws on a fixed
    stream (the model's declared law, not this round's draw)."""
    from fedhet.system.types import Workload

    n = system.num_clients
    work = Workload(None, np.full(n, batch_size), np.full(n, local_steps), np.ones(n, dtype=int),
                    upload_bytes=np.full(n, model_bytes), download_bytes=np.full(n, model_bytes))  # fmt: skip
    rng = np.random.default_rng(0)
    count = 1 if system.deterministic else PROFILE_DRAWS
    return np.mean([system.full_times(work, rng) for _ in range(count)], axis=0)


def with_estimates(plan, state: dict, system, knowledge: str, train):
    """``plan`` with the server's estimate of each client's full-work time in its record
    (``estimated_full_time``), from ``knowledge`` (see the module's docstring); the plan as
    it is for ``oracle``."""
    if knowledge == "oracle":
        return plan
    known = state.get("reported_time") if knowledge == "history" else None  # a state without: none yet
    reported = list(known) if known is not None else [None] * system.num_clients
    estimates = list(reported)
    if any(r is None for r in reported):
        size = float(state.get("model_bytes", 0.0))
        profile = expected_full_times(system, train.batch_size, train.local_steps, size)
        estimates = [float(p) if r is None else float(r) for p, r in zip(profile, reported, strict=True)]
    return replace(plan, record={**plan.record, "estimated_full_time": estimates})


def fitting_level(context, client: int, choose: Callable, cost: Callable, state: dict | None = None):
    """The sub-model level ``client`` trains this round: ``choose(full_time, deadline)``
    (usually :func:`largest_fitting`) for an asked, present client, from the plan's estimate
    of its full time (``estimated_full_time``; this round's drawn time where the plan has
    none: ``oracle``), kept when the client finishes that level's work, ``cost(level)`` x its
    drawn full time, by the deadline and before it fails mid-round; None when it is not
    asked, not present, no level fits, the level does not fit its drawn time (counted in
    ``state["late_sub_models"]``) or it fails first. Its drawn time is what it reports
    (``state["reported_time"]``, read by the next plans)."""
    plan, outcomes = context.plan, context.outcomes
    if not (plan.assignments[client].asked and outcomes.participates[client]):
        return None
    full_time = float(outcomes.full_time[client])
    estimates = plan.record.get("estimated_full_time") if plan.record else None
    estimate = full_time if estimates is None else float(estimates[client])
    level = choose(estimate, plan.deadline)
    if estimates is not None and state is not None:  # measured on its steps, reported
        state.setdefault("reported_time", [None] * len(outcomes.full_time))[client] = full_time
    if level is None:  # no level fits: not asked to work (charged nothing: KnowledgePlanner.idle_clients)
        if state is not None:
            idle = state.get("idle_clients")
            if not idle or idle[0] != plan.round:
                idle = state["idle_clients"] = [plan.round, []]
            idle[1].append(int(client))
        return None
    seconds, limit = cost(level) * full_time, (plan.deadline or 0.0) * (1 + 1e-12)
    # work sized to fit the estimate that its drawn time does not fit (a level given whatever
    # it costs, HeteroFL's fixed rate, is trained whatever it takes, as before)
    late = plan.deadline is not None and cost(level) * estimate <= limit < seconds
    if late and state is not None:
        state["late_sub_models"] = state.get("late_sub_models", 0) + 1
    if late or not outcomes.finishes_before_failure(client, seconds):
        return None  # its sub-model does not fit its drawn time, or it failed mid-round first
    return level


class PlansFromKnowledge:
    """For a sub-model rule: what its planner knows of each client's time
    (``algorithm.planner_knowledge``, recorded in the run's summary)."""

    @property
    def planner_knowledge(self) -> str:
        return str(self.options.planner_knowledge)  # type: ignore[attr-defined]


class KnowledgePlanner(Planner):
    """The sub-model rules' planner: the plan carries the server's estimate of each client's
    full-work time (:func:`with_estimates`), from what the rule may know."""

    def plan(self, round_index, state, system, deadline):
        plan = super().plan(round_index, state, system, deadline)
        return with_estimates(plan, state, system, self.rule.planner_knowledge, self.train)

    def idle_clients(self, state: dict, round_index: int) -> set[int]:
        """The present clients no level fits by the planner's estimate: told not to work.
        A client sent a level its drawn time does not meet worked until the deadline."""
        idle = state.get("idle_clients")
        return set(idle[1]) if idle and idle[0] == round_index else set()


class LateSubModelsReporting(Reporting):
    """The sub-model rules' metrics: the clients whose sub-model, sized from an estimate, did
    not fit their drawn time (running total)."""

    def round_metrics(self, state: dict) -> dict[str, float]:
        late = float(state.get("late_sub_models", 0))  # a state saved before the count: none yet
        return {**super().round_metrics(state), "late_sub_models": late}
