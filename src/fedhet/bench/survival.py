"""Time to the target on the simulated clock, with the runs that miss it censored.

A seed run that reaches the suite's target at simulated time t is an event at t; a run
that ends (its time budget or its rounds spent) at time T without reaching it is
right-censored at T: it says only that its time to target exceeds T. Averaging the hits
alone, as the leaderboard once did, reports a method that reaches the target in one run
of ten as fast as one that reaches it in all ten. The Kaplan-Meier estimate of the
survival function S(t) = P(time to target > t) uses both (scipy.stats.ecdf on
``CensoredData``); the table gives its median, the first t with S(t) <= 1/2, or none when
fewer than half the runs are known to reach the target.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeToTarget:
    """The Kaplan-Meier median time to target (None: not reached by half the runs) and
    the runs that reached it, of all."""

    median: float | None
    reached: int
    runs: int


def kaplan_meier(
    times: list[float | None], ends: list[float | None], horizon: float | None = None
) -> TimeToTarget:
    """The Kaplan-Meier median of runs' times to target: ``times[i]`` the time run i
    reached the target (None: it did not), ``ends[i]`` its simulated end (the censoring
    time of a miss; None where not recorded: then ``horizon``, and a miss without either is
    censored at the latest time seen)."""
    from scipy.stats import CensoredData, ecdf

    hits = [float(t) for t in times if t is not None]
    known = [float(e) for e in ends if e is not None] + hits
    fallback = horizon if horizon is not None else (max(known) if known else 0.0)
    misses = [float(e) if e is not None else fallback for t, e in zip(times, ends, strict=True) if t is None]
    runs = len(times)
    if not hits:
        return TimeToTarget(None, 0, runs)
    result = ecdf(CensoredData(uncensored=hits, right=misses))
    survival = result.sf
    median = _median_of_steps(survival.quantiles, survival.probabilities)
    return TimeToTarget(None if median is None else float(median), len(hits), runs)


def _median_of_steps(quantiles, probabilities) -> float | None:
    """The first time at which a step survival function is at or below 1/2."""
    for time, survival in zip(quantiles, probabilities, strict=True):
        if survival <= 0.5 + 1e-12:
            return float(time)
    return None
