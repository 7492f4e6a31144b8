"""FedAvg that waits for every client (SALF/ADEL-FL eq. (3))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import SERVER_LR_RANGE, Algorithm, register
from fedhet.algorithms.parts import Aggregation
from fedhet.algorithms.streaming import WeightedSumAggregator
from fedhet.errors import ConfigError


@dataclass
class FedAvgOptions:
    """``weights``: ``uniform`` (1/U, the papers' eq. (3)) or ``samples`` (n_u / n), over the
    clients that delivered; ``server_lr``: eta_s in w_t + eta_s sum_u a_u Delta_u (an older
    key: the run's one server learning rate is now server.lr)."""

    weights: str = "uniform"
    server_lr: float = 1.0

    def validate(self) -> None:
        if self.weights not in ("uniform", "samples"):
            raise ConfigError(f"algorithm.weights = {self.weights!r}: must be 'uniform' or 'samples'")
        if self.server_lr <= 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class FedAvgAggregation(Aggregation):
    """FedAvg's aggregation (SALF/ADEL-FL eq. (3)): w_t + eta_s sum_u a_u Delta_u over the
    full updates, streamed as they arrive."""

    def streaming_aggregator(self, params, buffers, tasks, state, context, layout):
        """Streams eq. (3): the weights are fixed by the tasks sent (1/|tasks| or n_u / sum
        of their examples), so each update is added as it arrives."""
        samples = self.options.weights == "samples"
        sizes = context.client_sizes
        expected = float(sum(sizes[t.client] for t in tasks)) if samples else float(len(tasks))

        def weight(update):
            return float(update.num_samples) if samples else 1.0

        return WeightedSumAggregator(params, buffers, weight, expected or 1.0, self.proposal_lr)

    @property
    def proposal_lr(self) -> float:
        """eta_s of the rule's own proposal w_t + eta_s sum_u a_u Delta_u (a server-optimizer
        preset proposes at 1 and steps with its optimizer's rate)."""
        return self.options.server_lr

    def client_weights(self, full: list) -> list[float]:
        """a_u of eq. (3) over the clients that delivered: 1/U, or n_u / n (``weights``)."""
        if self.options.weights == "samples":
            total = float(sum(u.num_samples for u in full))
            return [u.num_samples / total for u in full]
        return [1.0 / len(full)] * len(full)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w_{t+1} = w_t + eta_s sum_u a_u Delta_u with a_u = 1/U or n_u/n (eq. (3))."""
        full = [u for u in updates if u.coverage.is_full()]
        if not full:
            return params, buffers
        weights = self.client_weights(full)
        new_params = params.clone()
        new_buffers = buffers.clone()
        for w, u in zip(weights, full, strict=True):
            new_params.add_(u.delta, alpha=w * self.proposal_lr)
            if buffers.numel():
                new_buffers.add_(u.delta_buffers, alpha=w)
        return new_params, new_buffers


@register
class FedAvg(Algorithm):
    """Every client computes its full update; w_{t+1} = mean_u w_u. The round has no
    deadline: it lasts until the slowest client finishes (max_u finish time).

    Under Bernoulli participation the mean runs over the clients present this round: plain
    FedAvg over participants, biased towards frequent participants (FedStale Sec. 2)."""

    name = "fedavg"
    partial_work = "none"
    summary = "FedAvg waiting for all clients (no deadline); over the present ones under participation"
    Options = FedAvgOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": SERVER_LR_RANGE}
    uses_deadline = False
    Aggregation = FedAvgAggregation
