"""FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022): clients train continuously from the model version they last received; the
server keeps a buffer and applies it every K arrivals, each update weighted by its
staleness. Runs on the event-driven driver (:mod:`fedhet.engine.events`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import SERVER_LR_RANGE, AsyncAlgorithm, register
from fedhet.algorithms.parts import EventAggregation, EventScheduler, Reporting
from fedhet.errors import ConfigError


@dataclass
class FedBuffOptions:
    """``buffer_size`` K (updates per server step), ``max_concurrency`` (clients training at
    once; 0 = every client), ``server_lr`` eta_g."""

    buffer_size: int = 10
    max_concurrency: int = 0
    server_lr: float = 1.0

    def validate(self) -> None:
        if self.buffer_size < 1:
            raise ConfigError(f"algorithm.buffer_size = {self.buffer_size}: must be >= 1")
        if self.max_concurrency < 0:
            raise ConfigError(f"algorithm.max_concurrency = {self.max_concurrency}: must be >= 0 (0 = all)")
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class FedBuffScheduler(EventScheduler):
    """FedBuff's scheduler: its concurrency and the buffer of K arrivals per server step."""

    def buffer_size(self) -> int:
        return self.options.buffer_size

    def concurrency(self, num_clients: int) -> int:
        return min(self.options.max_concurrency or num_clients, num_clients)


class FedBuffAggregation(EventAggregation):
    """FedBuff's server step: eta_g times the buffer's staleness-weighted mean update."""

    def init_state(self, setting) -> dict:
        if self.options.buffer_size > setting.num_clients:
            raise ConfigError(
                f"algorithm.buffer_size = {self.options.buffer_size}: "
                f"more than the {setting.num_clients} clients"
            )
        return {"log": []}

    @staticmethod
    def staleness_weight(staleness: int) -> float:
        """s(tau) = 1 / sqrt(1 + tau) (FedBuff's polynomial scaling, exponent 1/2)."""
        return 1.0 / math.sqrt(1.0 + staleness)

    def apply_buffer(self, params, buffers, entries, state: dict, version: int):
        """One server step from the buffer ``entries`` = [(update, staleness), ...]."""
        k = len(entries)
        new_params, new_buffers = params.clone(), buffers.clone()
        for update, staleness in entries:
            weight = self.staleness_weight(staleness) / k
            new_params.add_(update.delta, alpha=weight * self.options.server_lr)
            if buffers.numel():
                new_buffers.add_(update.delta_buffers, alpha=1.0 / k)
        state["log"].append(
            {
                "step": version + 1,
                "clients": [u.client for u, _ in entries],
                "staleness": [s for _, s in entries],
            }
        )
        return new_params, new_buffers


class FedBuffReporting(Reporting):
    """FedBuff's report: the server steps and their staleness."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"fedbuff": {"server_steps": state["log"]}}


@register
class FedBuff(AsyncAlgorithm):
    """Server step after every K arrivals: w <- w + eta_g (1/K) sum_i s(tau_i) Delta_i with
    s(tau) = 1 / sqrt(1 + tau), tau = server steps since the client's model was sent
    (FedBuff Algorithm 1 and its polynomial staleness scaling). A client that delivers is
    idle; idle clients are started at random, up to ``max_concurrency`` in flight, on the
    current model."""

    name = "fedbuff"
    summary = "FedBuff: buffered asynchronous aggregation, staleness weight 1/sqrt(1+s)"
    Options = FedBuffOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": SERVER_LR_RANGE}
    Scheduler = FedBuffScheduler
    Aggregation = FedBuffAggregation
    Reporting = FedBuffReporting
