"""FedAvg that waits for every client (SALF/ADEL-FL eq. (3))."""

from __future__ import annotations

from dataclasses import dataclass

from fedhet.algorithms.base import Algorithm, register
from fedhet.errors import ConfigError


@dataclass
class FedAvgOptions:
    """``weights``: ``uniform`` (1/U, the papers' eq. (3)) or ``samples`` (n_u / n)."""

    weights: str = "uniform"

    def validate(self) -> None:
        if self.weights not in ("uniform", "samples"):
            raise ConfigError(f"algorithm.weights = {self.weights!r}: must be 'uniform' or 'samples'")


@register
class FedAvg(Algorithm):
    """Every client computes its full update; w_{t+1} = mean_u w_u. The round has no
    deadline: it lasts until the slowest client finishes (max_u finish time)."""

    name = "fedavg"
    summary = "FedAvg waiting for all clients (no deadline)"
    Options = FedAvgOptions
    uses_deadline = False

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w_{t+1} = w_t + sum_u a_u Delta_u with a_u = 1/U or n_u/n (eq. (3))."""
        full = [u for u in updates if u.depth == 1]
        if not full:
            return params, buffers
        if self.options.weights == "samples":
            total = float(sum(u.num_samples for u in full))
            weights = [u.num_samples / total for u in full]
        else:
            weights = [1.0 / len(full)] * len(full)
        new_params = params.clone()
        new_buffers = buffers.clone()
        for w, u in zip(weights, full, strict=True):
            new_params.add_(u.delta_params, alpha=w)
            if buffers.numel():
                new_buffers.add_(u.delta_buffers, alpha=w)
        return new_params, new_buffers
