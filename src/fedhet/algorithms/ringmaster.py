"""Ringmaster ASGD (Maranjyan, Tyurin and Richtárik, "Ringmaster ASGD: The First Asynchronous
SGD with Optimal Time Complexity", ICML 2025, arXiv 2501.16168): asynchronous SGD in which
the server applies each arriving update at once unless it is too stale, and discards it
otherwise. Runs on the event-driven driver, every client computing at once.

A worker computes its update on the model it was sent, x_{k - delta}; the server, at its k-th
applied update::

    if delta < R:  x_{k+1} = x_k + eta_g Delta     (Delta = -gamma g with one local step)
    else:          the update is discarded (x unchanged)

and the worker starts again on the current model. delta is the delay counted in *applied*
updates since the worker's model was sent (a discarded arrival applies nothing, so it does
not age the others), R the ``delay_threshold``. With R large enough no update is discarded
and the rule is plain asynchronous SGD; the paper's analysis sets R from the gradient
noise and the target accuracy (R = max(1, ceil(sigma^2 / epsilon))), which a run does not
know, so R is an option (10 by default, ours) that ``fedhet bench`` tunes. eta_g is fedhet's
one server learning rate (``server.lr``; 1: the update as the worker computed it, gamma the
clients' ``train.lr``). BatchNorm statistics move with the same rule. The time-optimality
the paper proves is about the simulated clock: a slow worker's stale gradients stop costing
the fast ones anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import SERVER_LR_RANGE, AsyncAlgorithm, register
from fedhet.algorithms.parts import EventAggregation, EventScheduler, Reporting
from fedhet.errors import ConfigError


@dataclass
class RingmasterOptions:
    """``delay_threshold`` R (updates staler than R - 1 applied updates are discarded),
    ``max_concurrency`` (clients computing at once; 0 = every client), ``server_lr`` eta_g."""

    delay_threshold: int = 10
    max_concurrency: int = 0
    server_lr: float = 1.0

    def validate(self) -> None:
        if self.delay_threshold < 1:
            raise ConfigError(f"algorithm.delay_threshold = {self.delay_threshold}: must be >= 1")
        if self.max_concurrency < 0:
            raise ConfigError(f"algorithm.max_concurrency = {self.max_concurrency}: must be >= 0 (0 = all)")
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class RingmasterScheduler(EventScheduler):
    """Every arrival is a server step; as many clients compute at once as allowed."""

    def concurrency(self, num_clients: int) -> int:
        return min(self.options.max_concurrency or num_clients, num_clients)


class RingmasterAggregation(EventAggregation):
    """Apply the arrival, or discard it when its delay in applied updates reaches R."""

    def init_state(self, setting) -> dict:
        # applied[i]: updates applied after server step i (a discard is a step that applies none)
        return {"applied": [], "log": [], "discarded": 0}

    @staticmethod
    def delay(applied: list[int], version: int, staleness: int) -> int:
        """Updates applied since the model of server step ``version - staleness`` was sent."""
        now = applied[version - 1] if version > 0 else 0
        sent = version - staleness
        return now - (applied[sent - 1] if sent > 0 else 0)

    def apply_buffer(self, params, buffers, entries, state: dict, version: int):
        """The server step of one arrival ``entries`` = [(update, staleness)]."""
        applied = state["applied"]
        new_params, new_buffers = params.clone(), buffers.clone()
        done = applied[-1] if applied else 0
        for update, staleness in entries:
            delay = self.delay(applied, version, staleness)
            kept = delay < self.options.delay_threshold
            if kept:
                new_params.add_(update.delta, alpha=self.options.server_lr)
                if buffers.numel():
                    new_buffers.add_(update.delta_buffers)
                done += 1
            state["discarded"] = discarded_count(state) + (not kept)  # before the log grows
            state["log"].append(
                {"step": version + 1, "client": update.client, "delay": delay, "applied": kept}
            )
        applied.append(done)
        return new_params, new_buffers


class RingmasterReporting(Reporting):
    """Ringmaster's report: each arrival's delay and whether it was applied."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"ringmaster": {"arrivals": state["log"]}}

    def round_metrics(self, state: dict) -> dict[str, float]:
        """How many arrivals have been discarded so far."""
        return {"discarded": float(discarded_count(state))}


def discarded_count(state: dict) -> int:
    """Arrivals discarded so far: the running count (a state saved before it kept one counts
    its log once, then keeps the count)."""
    if "discarded" not in state:
        state["discarded"] = sum(1 for entry in state["log"] if not entry["applied"])
    return state["discarded"]


@register
class Ringmaster(AsyncAlgorithm):
    """Each arrival applied at once, x <- x + eta_g Delta, unless its delay in applied
    updates is R or more: then discarded (Ringmaster ASGD, Algorithm 1); every client
    computes at once and starts again on the current model when its update arrives."""

    name = "ringmaster"
    summary = "Ringmaster ASGD: asynchronous SGD that discards updates delayed by R or more applied steps"
    Options = RingmasterOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        "server_lr": SERVER_LR_RANGE,
        "delay_threshold": {"low": 1, "high": 40, "int": True, "log": True},
    }
    Scheduler = RingmasterScheduler
    Aggregation = RingmasterAggregation
    Reporting = RingmasterReporting
