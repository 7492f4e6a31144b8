"""AsyncFL, the asynchronous baseline of SALF (Sec. IV): a straggler computes its full update
on the model it received and takes part in FedAvg late.

A straggler whose back-propagation reached layer d by the deadline (d = 1: finished) is slow
by that much: it delivers its full update, computed on the model it was sent, 2 d rounds
later (SALF Sec. IV: "participate in the FedAvg every 2l global iterations"); a client is
not asked again while its update is on its way. Each round the server averages the fresh
updates of the clients that finished and the stale ones arriving this round (uniform
weights, FedAvg's eq. (3)); with none, the model is kept.
"""

from __future__ import annotations

from fedhet.algorithms.base import Algorithm, NoOptions, register
from fedhet.messages import ClientTask, Coverage


@register
class AsyncFL(Algorithm):
    """Fresh updates now, a straggler's full update 2 d rounds after it was started."""

    name = "asyncfl"
    summary = "AsyncFL: stragglers' full updates arrive 2d rounds late and join FedAvg (SALF Sec. IV)"
    Options = NoOptions

    def init_state(self, setting) -> dict:
        return {"pending": [], "log": []}

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        """Every present client not still busy with an earlier task trains the full model."""
        plan, outcomes = context.plan, context.outcomes
        assignment = plan.assignments[client]
        if not (assignment.asked and outcomes.participates[client]):
            return None
        if any(p["client"] == client for p in state["pending"]):
            return None  # still computing its previous update
        return self.make_task(plan, client, assignment.local_steps, Coverage(1), state)

    @staticmethod
    def delay(depth: int) -> int:
        """Rounds until a straggler that reached layer ``depth`` delivers: 2 d (0 if finished)."""
        return 0 if depth <= 1 else 2 * int(depth)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w_{t+1} = w_t + mean of (fresh deltas and the stale deltas due this round)."""
        t = context.plan.round
        fresh = []
        for u in updates:
            wait = self.delay(int(context.outcomes.depth[u.client]))
            if wait == 0:
                fresh.append(u)
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

    def reports(self, state: dict) -> dict[str, dict]:
        in_flight = [{"client": p["client"], "made": p["made"], "due": p["due"]} for p in state["pending"]]
        return {"asyncfl": {"rounds": state["log"], "in_flight": in_flight}}
