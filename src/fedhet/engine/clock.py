"""The virtual clock: simulated time only, never the host's.

A round lasts until its deadline, or until every asked client has reported if that comes
first; without a deadline (wait-for-all) it lasts until the slowest client finishes. A round
in which no client is present lasts its deadline (the server waits for it, as it would for
stragglers; the clock moves on, so availability traces move on), or no time without one.
With a time budget, a round that would take the clock past it is not run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def round_duration(deadline: float | None, finish_times: np.ndarray) -> float:
    """min(deadline, slowest finish time) of the asked, present clients; with none, the
    deadline (0 without one)."""
    if not len(finish_times):
        return 0.0 if deadline is None else float(deadline)
    slowest = float(np.max(finish_times))
    return slowest if deadline is None else min(deadline, slowest)


@dataclass
class VirtualClock:
    """Simulated seconds since the run started, and the run's budget (0 = none)."""

    now: float = 0.0
    budget: float = 0.0
    refused: float | None = None  # the duration of the last round that did not fit

    def fits(self, duration: float) -> bool:
        """Whether a round of ``duration`` ends within the budget."""
        ok = not self.budget or self.now + duration <= self.budget * (1 + 1e-12)
        if not ok:
            self.refused = duration
        return ok

    def advance(self, duration: float) -> float:
        self.now += duration
        return self.now
