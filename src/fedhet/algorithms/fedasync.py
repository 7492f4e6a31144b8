"""FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", arXiv:1903.03934):
every arrival is mixed into the global model at once, with a weight that falls with its
staleness. Runs on the event-driven driver (:mod:`fedhet.engine.drivers`), as FedBuff.

A worker receives x_tau, minimises its regularised local objective
f(x) + (rho/2)||x - x_tau||^2 (FedAsync Algorithm 1, the worker's process) and sends its
model x_new; the server mixes it in (Algorithm 1, the updater)::

    alpha_t = alpha * s(t - tau)
    x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new

with the staleness functions of the paper's Sec. 5: ``constant`` s = 1, ``polynomial``
s_a(d) = (d + 1)^(-a), ``hinge`` s_{a,b}(d) = 1 if d <= b else 1 / (a (d - b) + 1). The
clients of fedhet send x_new - x_tau; the driver keeps x_tau for each update in flight
(:meth:`AsyncAlgorithm.apply_models`), so x_new = x_tau + delta exactly.

Defaults: polynomial staleness with a = 0.5 and hinge with a = 10, b = 4 (the settings of
the paper's experiments as we read them); alpha = 0.6 (FLGo's default; the paper varies
it); rho = 0.005 (ours). ``fedhet bench`` tunes alpha and rho. BatchNorm statistics are
mixed like the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import AsyncAlgorithm, register
from fedhet.algorithms.parts import ClientPart, EventAggregation, EventScheduler, Reporting
from fedhet.checks import in_range, one_of
from fedhet.errors import ConfigError

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


@dataclass
class FedAsyncOptions:
    """``alpha`` the mixing weight in (0, 1]; ``staleness`` the function s and its
    parameters ``staleness_a`` (the polynomial's exponent, the hinge's slope) and
    ``staleness_b`` (the hinge's knee, in server steps); ``rho`` the local proximal weight;
    ``max_concurrency`` clients training at once (0 = every client)."""

    alpha: float = 0.6
    staleness: str = "polynomial"
    staleness_a: float = 0.5
    staleness_b: float = 4.0
    rho: float = 0.005
    max_concurrency: int = 0

    def validate(self) -> None:
        in_range("algorithm.alpha", self.alpha, 0.0, 1.0, low_open=True)
        one_of("algorithm.staleness", self.staleness, STALENESS_FUNCTIONS)
        if not self.staleness_a >= 0:
            raise ConfigError(f"algorithm.staleness_a = {self.staleness_a}: must be >= 0")
        if not self.staleness_b >= 0:
            raise ConfigError(f"algorithm.staleness_b = {self.staleness_b}: must be >= 0")
        if not self.rho >= 0:
            raise ConfigError(f"algorithm.rho = {self.rho}: must be >= 0")
        if self.max_concurrency < 0:
            raise ConfigError(f"algorithm.max_concurrency = {self.max_concurrency}: must be >= 0 (0 = all)")


def staleness_function(kind: str, staleness: int, a: float = 0.5, b: float = 4.0) -> float:
    """s(t - tau) of FedAsync Sec. 5: constant 1; polynomial (d + 1)^(-a); hinge 1 for
    d <= b, else 1 / (a (d - b) + 1)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((staleness + 1.0) ** (-a))
    if kind == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"unknown staleness function {kind!r}")


class FedAsyncScheduler(EventScheduler):
    """FedAsync's scheduler: how many clients train at once."""

    def concurrency(self, num_clients: int) -> int:
        return min(self.options.max_concurrency or num_clients, num_clients)


class FedAsyncClient(ClientPart):
    """FedAsync's client: the proximal term rho/2 ||w - w_t||^2 of its local objective."""

    def gradient_correction(self, task, state, region, local, anchor):
        """grad of (rho/2)||x - x_tau||^2 over the covered region: rho (x - x_tau)
        (the worker's regularised objective, FedAsync Algorithm 1)."""
        if not self.options.rho:
            return None
        return self.options.rho * (local[region] - anchor[region])


class FedAsyncAggregation(EventAggregation):
    """FedAsync's server step: w <- (1 - alpha_t) w + alpha_t w_u with alpha_t discounted by
    the update's staleness."""

    def init_state(self, setting) -> dict:
        return {"log": []}

    def mixing_weight(self, staleness: int) -> float:
        """alpha_t = alpha s(t - tau) (FedAsync Algorithm 1, with s of Sec. 5)."""
        o = self.options
        return o.alpha * staleness_function(o.staleness, staleness, o.staleness_a, o.staleness_b)

    def apply_models(self, params, buffers, arrivals, state: dict, version: int):
        """x <- (1 - alpha_t) x + alpha_t (x_tau + delta) for each arrival, in order."""
        new_params, new_buffers = params.clone(), buffers.clone()
        for update, staleness, sent_params, sent_buffers in arrivals:
            weight = self.mixing_weight(staleness)
            new_params.mul_(1.0 - weight).add_(sent_params + update.delta, alpha=weight)
            if buffers.numel():
                new_buffers.mul_(1.0 - weight).add_(sent_buffers + update.delta_buffers, alpha=weight)
            state["log"].append(
                {"step": version + 1, "client": update.client, "staleness": staleness, "weight": weight}
            )
        return new_params, new_buffers


class FedAsyncReporting(Reporting):
    """FedAsync's report: the mixing weights it applied."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"fedasync": {"server_steps": state["log"]}}


@register
class FedAsync(AsyncAlgorithm):
    """Every arrival: x <- (1 - alpha s(d)) x + alpha s(d) x_new, d its staleness (FedAsync
    Algorithm 1); clients minimise f + (rho/2)||x - x_tau||^2 locally. Idle clients are
    started at random, up to ``max_concurrency`` in flight, on the current model."""

    name = "fedasync"
    summary = "FedAsync: each arrival mixed in with weight alpha s(staleness) (Xie et al., arXiv:1903.03934)"
    Options = FedAsyncOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        "alpha": {"low": 0.1, "high": 0.9},
        "rho": {"low": 1e-4, "high": 0.1, "log": True},
    }
    Scheduler = FedAsyncScheduler
    Client = FedAsyncClient
    Aggregation = FedAsyncAggregation
    Reporting = FedAsyncReporting
