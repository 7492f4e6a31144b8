"""The largest sub-model that fits a deadline: the choice HeteroFL, FedRolex and FjORD make
among widths and DepthFL among depths, one rule for all of them."""

from __future__ import annotations

from collections.abc import Mapping


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
