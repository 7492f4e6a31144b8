"""REFL's staleness-aware aggregation (Abdelmoniem, Sahu, Canini, Fahmy, "REFL:
Resource-Efficient Federated Learning", EuroSys 2023, arXiv:2111.13263, Sec. 4.2): a client
that misses a round's deadline keeps training, and its update joins the round in which it
arrives, weighted by how stale it is and by how far it would move the fresh average.

With F fresh updates Delta_1..Delta_F (weight 1 each) and their sum S, a stale update
Delta_c that is tau_c rounds old gets

    Lambda_c = || (S + Delta_c) / (F + 1) - S / F ||^2 / || S / F ||^2
    w_c = (1 - beta) / (tau_c + 1) + beta (1 - exp(-Lambda_c / Lambda_max) / kappa)

(Lambda_max the largest Lambda of the round's stale updates), and the round moves the model
by sum_i w_i Delta_i / sum_i w_i over fresh and stale updates. The damping term falls with
staleness; the boosting term favours a stale update that changes the fresh average most (a
straggler's data the fresh clients do not cover). Defaults beta = 0.35 and kappa = 1, the
values of the authors' experiment scripts (their parser's default kappa is 10);
``max_staleness`` = 0 keeps every late update (the scripts' -1).

How late an update is: a straggler asked in round t whose full local work takes f seconds
arrives in round t + ceil(f / D) - 1 for the round's deadline D (the rounds it spans, each
lasting D: the regime of deadline-bound rounds REFL addresses). It is not asked again while
its update is on its way, and one that fails mid-round never arrives. fedhet's messages
carry deltas, so Lambda is computed on deltas (the authors' code averages models; with every
stale model's base the current one the two agree). With no fresh update, Lambda has no
reference and each stale update gets the damping term plus beta (1 - e^-1 / kappa).
REFL's client selection is the ``[selection] rule = "refl"`` plug-in; the two compose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhet.algorithms.asyncfl import AsyncFL, AsyncFLAggregation, AsyncFLReporting
from fedhet.algorithms.base import register
from fedhet.checks import in_range
from fedhet.errors import ConfigError


@dataclass
class REFLOptions:
    """``beta`` the share of the boosting term in a stale update's weight, ``kappa`` >= 1
    its scale, ``max_staleness`` the oldest update kept, in rounds (0 = every one)."""

    beta: float = 0.35  # in [0, 1]: 0 = staleness damping only
    kappa: float = 1.0  # >= 1: the boosting term's scaling coefficient
    max_staleness: int = 0  # late updates older than this many rounds are dropped (0 = none)

    def validate(self) -> None:
        in_range("algorithm.beta", self.beta, 0.0, 1.0)
        if not 1.0 <= self.kappa < math.inf:
            raise ConfigError(f"algorithm.kappa = {self.kappa!r}: must be >= 1")
        if isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ConfigError(f"algorithm.max_staleness = {self.max_staleness!r}: must be >= 0 (0 = none)")


def stale_weights(fresh_sum: torch.Tensor | None, fresh: int, stale: list, beta: float, kappa: float) -> list:
    """w_c of REFL's staleness-aware aggregation for ``stale`` = [(delta, tau), ...] beside
    ``fresh`` fresh updates summing to ``fresh_sum`` (see the module's docstring)."""
    if not stale:
        return []
    if fresh == 0 or fresh_sum is None or not float(fresh_sum.norm()) > 0.0:
        ratios = [1.0] * len(stale)
    else:
        mean = fresh_sum / fresh
        deviation = [
            float((((fresh_sum + d) / (fresh + 1) - mean).norm() / mean.norm()) ** 2) for d, _ in stale
        ]
        top = max(deviation)
        ratios = [x / top if top > 0 else 0.0 for x in deviation]
    pairs = zip(stale, ratios, strict=True)
    return [(1.0 - beta) / (tau + 1.0) + beta * (1.0 - math.exp(-r) / kappa) for (_, tau), r in pairs]


class REFLAggregation(AsyncFLAggregation):
    """REFL's aggregation: fresh and late updates with staleness-aware weights."""

    def init_state(self, setting) -> dict:
        return {"pending": [], "log": []}

    @staticmethod
    def lateness(full_time: float, deadline: float | None) -> int:
        """Rounds after the one it was asked in that an update of ``full_time`` seconds
        arrives: ceil(f / D) - 1 (0 when it meets the deadline or there is none)."""
        if deadline is None or deadline <= 0 or full_time <= deadline:
            return 0
        return math.ceil(full_time / deadline - 1e-12) - 1

    def aggregate(self, params, buffers, updates, state, context, layout):
        """Fresh updates weight 1, the stale ones due this round w_c; the weighted mean."""
        t, o = context.plan.round, self.options
        fresh = []
        for u in updates:
            wait = self.lateness(float(context.outcomes.full_time[u.client]), context.plan.deadline)
            if wait == 0:
                fresh.append(u)
            else:
                state["pending"].append({"client": u.client, "made": t, "due": t + wait,
                                         "delta": u.delta, "buffers": u.delta_buffers})  # fmt: skip
        due = [p for p in state["pending"] if p["due"] == t]
        state["pending"] = [p for p in state["pending"] if p["due"] != t]
        kept = [p for p in due if not o.max_staleness or t - p["made"] <= o.max_staleness]
        fresh_sum = torch.stack([u.delta for u in fresh]).sum(0) if fresh else None
        weights = stale_weights(
            fresh_sum, len(fresh), [(p["delta"], t - p["made"]) for p in kept], o.beta, o.kappa
        )
        state["log"].append({"round": t + 1, "fresh": [u.client for u in fresh],
                             "stale": [{"client": p["client"], "staleness": t - p["made"], "weight": w}
                                       for p, w in zip(kept, weights, strict=True)],
                             "dropped": [p["client"] for p in due if p not in kept]})  # fmt: skip
        terms = [(1.0, u.delta, u.delta_buffers) for u in fresh]
        terms += [(w, p["delta"], p["buffers"]) for p, w in zip(kept, weights, strict=True)]
        total = sum(w for w, _, _ in terms)
        if not terms or total <= 0:
            return params, buffers
        new_params, new_buffers = params.clone(), buffers.clone()
        for weight, delta, delta_buffers in terms:
            new_params.add_(delta, alpha=weight / total)
            if buffers.numel():
                new_buffers.add_(delta_buffers, alpha=weight / total)
        return new_params, new_buffers


class REFLReporting(AsyncFLReporting):
    """REFL's report: the late updates and their weights."""

    def reports(self, state: dict) -> dict[str, dict]:
        in_flight = [{"client": p["client"], "made": p["made"], "due": p["due"]} for p in state["pending"]]
        return {"refl": {"rounds": state["log"], "in_flight": in_flight}}


@register
class REFL(AsyncFL):
    """REFL's staleness-aware aggregation (Sec. 4.2): a client that misses the deadline keeps
    training and its update joins the round it arrives in, weighted (1 - beta) / (tau + 1)
    + beta (1 - exp(-Lambda / Lambda_max) / kappa) beside fresh updates of weight 1, Lambda
    the relative change it makes to the fresh average. Its tasks are AsyncFL's: every
    present client not busy with a late update trains its full local work."""

    name = "refl"
    summary = (
        "REFL: stragglers' late updates weighted by staleness and deviation (Abdelmoniem et al. EuroSys 2023)"
    )
    Options = REFLOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"beta": {"low": 0.0, "high": 1.0}}
    Aggregation = REFLAggregation
    Reporting = REFLReporting
