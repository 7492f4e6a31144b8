"""Numerical faults: non-finite client updates and global parameters.

A client whose training loss or update is NaN or infinite (too large a learning rate, an
exploding model) is either skipped for the round (``run.on_non_finite = "skip-client"``,
counted in metrics.csv's ``skipped``) or stops the run (``"stop"``, the default) with the
round, the client and what went non-finite; a non-finite global model always stops it. The
run keeps its last good checkpoint and marks the summary ``stopped_by = "non_finite"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedhet.messages import ClientUpdate


@dataclass
class NonFinite:
    """Where a run met a non-finite value: ``round`` (1-based), ``client`` (None for the
    global model) and ``what`` went non-finite."""

    round: int
    client: int | None
    what: str

    def describe(self) -> str:
        who = "the global model" if self.client is None else f"client {self.client}"
        return f"round {self.round}: {who}: non-finite {self.what}"

    def to_dict(self) -> dict:
        return {"round": self.round, "client": self.client, "what": self.what}


def all_finite(values: torch.Tensor) -> bool:
    """Whether every element is finite. A NaN or infinity makes the sum non-finite, so a
    finite sum (one reduction, ~5x cheaper than an element-wise test) settles the common
    case; a non-finite sum (or an overflowing one) is checked element by element."""
    if not values.numel():
        return True
    if bool(torch.isfinite(values.sum())):
        return True
    return bool(torch.isfinite(values).all())


def update_fault(update: ClientUpdate) -> str | None:
    """What is non-finite in a client's update (its training loss, its model update or its
    buffers), or None. Updates without local steps carry no loss and are not checked."""
    if update.steps <= 0:
        return None
    if not math.isfinite(update.loss):
        return f"training loss ({update.loss})"
    if not all_finite(update.delta):
        return "model update"
    if update.delta_buffers.is_floating_point() and not all_finite(update.delta_buffers):
        return "buffer update"
    return None


def params_fault(params: torch.Tensor, buffers: torch.Tensor) -> str | None:
    """What is non-finite in the global model after aggregation, or None."""
    if not all_finite(params):
        return "parameters after aggregation"
    if buffers.is_floating_point() and not all_finite(buffers):
        return "buffers after aggregation"
    return None
