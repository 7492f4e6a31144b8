"""AsyncFL, the asynchronous baseline of SALF (Sec. IV): a straggler computes its full update
on the model it received and takes part in FedAvg late.

A straggler whose back-propagation reached layer d by the deadline (d = 1: finished) is slow
by that much: it delivers its full update, computed on the model it was sent, 2 d rounds
later (SALF Sec. IV: "participate in the FedAvg every 2l global iterations"); a client is
not asked again while its update is on its way. Each round the server averages the fresh
updates of the clients that finished and the stale ones arriving this round (uniform
weights, FedAvg's eq. (3)); with none, the model is kept.

The paper's sentence also admits a second reading, ``late_update = "fresh"``: a straggler
takes part only once every 2 d rounds, but with an update computed on the current model —
its update joins this round's average and it sits out the next 2 d rounds, the rounds a
stale update would have been on its way (absence instead of staleness).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.parts import Aggregation, Planner, Reporting
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage

LATE_UPDATES = ("stale", "fresh")


@dataclass
class AsyncFLOptions:
    """``late_update``: "stale" (a straggler's update, computed on the model it was sent,
    arrives 2 d rounds later) or "fresh" (it counts now and the straggler sits out the next
    2 d rounds)."""

    late_update: str = "stale"

    def validate(self) -> None:
        if self.late_update not in LATE_UPDATES:
            raise ConfigError(
                f"algorithm.late_update = {self.late_update!r}: must be one of {', '.join(LATE_UPDATES)}"
            )


class AsyncFLPlanner(Planner):
    """AsyncFL's planner: a straggler keeps training past the deadline and is sent no new
    task until its late update is in (``busy_clients``)."""

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        """Every present client not still busy with an earlier task trains the full model."""
        plan, outcomes = context.plan, context.outcomes
        assignment = plan.assignments[client]
        if not (assignment.asked and outcomes.participates[client]):
            return None
        if not outcomes.finishes_before_failure(client, float(outcomes.full_time[client])):
            return None  # failed mid-round: its full update never arrives
        if client in self.busy_clients(state, plan.round):
            return None  # still computing its previous update
        return self.make_task(plan, client, assignment.local_steps, Coverage(1), state)

    def busy_clients(self, state: dict, round_index: int) -> set[int]:
        """The clients whose late update is on its way ("stale"), or that sit out the rounds
        it would have taken ("fresh")."""
        resting = state.get("resting", {})
        return {int(p["client"]) for p in state["pending"]} | {
            int(c) for c, until in resting.items() if until >= round_index
        }


class AsyncFLAggregation(Aggregation):
    """AsyncFL's aggregation: this round's finishers with the late updates that arrive now,
    each discounted by its staleness."""

    def init_state(self, setting) -> dict:
        return {"pending": [], "log": [], "resting": {}}

    @staticmethod
    def delay(depth: int) -> int:
        """Rounds until a straggler that reached layer ``depth`` delivers: 2 d (0 if finished)."""
        return 0 if depth <= 1 else 2 * int(depth)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w_{t+1} = w_t + mean of (fresh deltas and the stale deltas due this round)."""
        t = context.plan.round
        fresh = []
        resting = state.setdefault("resting", {})
        for key in [k for k, until in resting.items() if until < t]:
            del resting[key]
        for u in updates:
            wait = self.delay(int(context.outcomes.depth[u.client]))
            if wait == 0:
                fresh.append(u)
            elif self.options.late_update == "fresh":
                fresh.append(u)
                resting[str(u.client)] = t + wait  # sits out rounds t+1..t+2d, as a stale one would
            else:
                state["pending"].append(
                    {
                        "client": u.client,
                        "made": t,
                        "due": t + wait,
                        "delta": u.delta,
                        "buffers": u.delta_buffers,
                    }
                )
        arriving = [p for p in state["pending"] if p["due"] == t]
        state["pending"] = [p for p in state["pending"] if p["due"] != t]
        state["log"].append(
            {"round": t + 1, "fresh": [u.client for u in fresh],
             "stale": [{"client": p["client"], "staleness": t - p["made"]} for p in arriving]}
        )  # fmt: skip
        deltas = [(u.delta, u.delta_buffers) for u in fresh] + [(p["delta"], p["buffers"]) for p in arriving]
        if not deltas:
            return params, buffers
        new_params, new_buffers = params.clone(), buffers.clone()
        for delta, delta_buffers in deltas:
            new_params.add_(delta, alpha=1.0 / len(deltas))
            if buffers.numel():
                new_buffers.add_(delta_buffers, alpha=1.0 / len(deltas))
        return new_params, new_buffers


class AsyncFLReporting(Reporting):
    """AsyncFL's report: the late updates and their delays."""

    def reports(self, state: dict) -> dict[str, dict]:
        in_flight = [{"client": p["client"], "made": p["made"], "due": p["due"]} for p in state["pending"]]
        return {"asyncfl": {"rounds": state["log"], "in_flight": in_flight}}


@register
class AsyncFL(Algorithm):
    """Fresh updates now, a straggler's full update 2 d rounds after it was started."""

    name = "asyncfl"
    summary = "AsyncFL: stragglers' full updates arrive 2d rounds late and join FedAvg (SALF Sec. IV)"
    Options: ClassVar[type] = AsyncFLOptions
    Planner = AsyncFLPlanner
    Aggregation = AsyncFLAggregation
    Reporting = AsyncFLReporting
