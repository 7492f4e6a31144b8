"""Drop-stragglers FedAvg (SALF eq. (4)): only clients that finished every layer count."""

from __future__ import annotations

from dataclasses import dataclass

from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.parts import Aggregation
from fedhet.errors import ConfigError


@dataclass
class DropOptions:
    """``normalize``: ``finishers`` (mean over finishers, our default) or ``all`` (sum over
    finishers divided by U, as the SALF authors' public code does)."""

    normalize: str = "finishers"

    def validate(self) -> None:
        if self.normalize not in ("finishers", "all"):
            raise ConfigError(f"algorithm.normalize = {self.normalize!r}: must be 'finishers' or 'all'")


class DropStragglersAggregation(Aggregation):
    """Drop-stragglers' aggregation: the mean of the finishers' updates (SALF eq. (4))."""

    def aggregate(self, params, buffers, updates, state, context, layout):
        """SALF eq. (4)."""
        finishers = [u for u in updates if u.coverage.is_full()]
        if not finishers:
            return params, buffers
        divisor = len(finishers) if self.options.normalize == "finishers" else context.num_clients
        new_params = params.clone()
        new_buffers = buffers.clone()
        for u in finishers:
            new_params.add_(u.delta, alpha=1.0 / divisor)
            if buffers.numel():
                new_buffers.add_(u.delta_buffers, alpha=1.0 / len(finishers))
        return new_params, new_buffers


@register
class DropStragglers(Algorithm):
    """Clients with depth > 1 at the deadline are discarded (they need not even compute);
    w_{t+1} = w_t + mean over finishers of Delta_u; with no finisher w_t is kept."""

    name = "drop"
    summary = "FedAvg that drops clients not finished by the deadline (SALF eq. (4))"
    Options = DropOptions
    partial_work = "none"  # a straggler's work would be thrown away: it is not asked for
    Aggregation = DropStragglersAggregation
