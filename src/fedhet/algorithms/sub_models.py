"""The largest sub-model that fits a deadline: the choice HeteroFL, FedRolex and FjORD make
among widths and DepthFL among depths, one rule for all of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping


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


def fitting_level(context, client: int, choose: Callable, cost: Callable):
    """The sub-model level ``client`` trains this round: ``choose(full_time, deadline)``
    (usually :func:`largest_fitting`) for an asked, present client, kept when the client
    finishes that level's work, ``cost(level)`` x its full time, before it fails mid-round;
    None when it is not asked, not present, no level fits, or it fails first."""
    plan, outcomes = context.plan, context.outcomes
    if not (plan.assignments[client].asked and outcomes.participates[client]):
        return None
    full_time = float(outcomes.full_time[client])
    level = choose(full_time, plan.deadline)
    if level is None or not outcomes.finishes_before_failure(client, cost(level) * full_time):
        return None  # no level fits, or it failed mid-round before its sub-model was done
    return level
