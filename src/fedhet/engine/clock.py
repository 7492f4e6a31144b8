"""The virtual clock: simulated time only, never the host's.

A round lasts until its deadline, or until every asked client has reported if that comes
first; without a deadline (wait-for-all) it lasts until the slowest client finishes. A round
in which no client is present lasts its deadline (the server waits for it, as it would for
stragglers; the clock moves on, so availability traces move on), or no time without one.
With a time budget, a round that would take the clock past it is not run; likewise a round
that would take the clients' energy (:mod:`fedhet.system.energy`) past an energy budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.system.energy import ACCOUNTS, RoundEnergy


def round_duration(deadline: float | None, finish_times: np.ndarray) -> float:
    """min(deadline, slowest finish time) of the asked, present clients; with none, the
    deadline (0 without one)."""
    if not len(finish_times):
        return 0.0 if deadline is None else float(deadline)
    slowest = float(np.max(finish_times))
    return slowest if deadline is None else min(deadline, slowest)


class Budget:
    """What a run's budget limits (the clock's seconds, the clients' joules): ``used`` so
    far against ``budget`` (0 = none); ``refused``: the amount of the last round that did
    not fit."""

    budget: float = 0.0
    refused: float | None = None

    @property
    def used(self) -> float:
        raise NotImplementedError

    def fits(self, amount: float) -> bool:
        """Whether a round of ``amount`` ends within the budget (a relative 1e-12 of
        rounding forgiven, so a budget of exactly R rounds runs R)."""
        ok = not self.budget or self.used + amount <= self.budget * (1 + 1e-12)
        if not ok:
            self.refused = amount
        return ok


@dataclass
class VirtualClock(Budget):
    """Simulated seconds since the run started, and the run's time budget (0 = none)."""

    now: float = 0.0
    budget: float = 0.0
    refused: float | None = None  # the duration of the last round that did not fit

    @property
    def used(self) -> float:
        return self.now

    def advance(self, duration: float) -> float:
        self.now += duration
        return self.now


class EnergyAccount(Budget):
    """The run's energy so far: per client (:data:`ACCOUNTS`, kept in the run state, so a
    resumed run goes on counting) and in total, against ``run.energy_budget`` (joules; 0 =
    none)."""

    def __init__(self, state: dict, num_clients: int, budget: float = 0.0) -> None:
        for name in ACCOUNTS:
            state.setdefault(name, [0.0] * num_clients)
        self.state, self.budget = state, budget

    @property
    def total(self) -> float:
        return float(sum(self.state["joules"]))

    @property
    def used(self) -> float:
        return self.total

    def add(self, spent: RoundEnergy) -> None:
        for name in ACCOUNTS:
            self.state[name] = (np.asarray(self.state[name]) + getattr(spent, name)).tolist()
