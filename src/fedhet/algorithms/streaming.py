"""Streaming aggregation: a rule that can sum updates as they arrive holds one running sum,
not the cohort's list (memory = one update, not cohort x parameters).

:meth:`Algorithm.aggregator` returns an :class:`Aggregator`: the engine calls
:meth:`Aggregator.add` for each delivered update, in client order, and
:meth:`Aggregator.result` at the end of the round. Rules that need every update at once
(FedStale's memory, SCAFFOLD, FedNova, ...) keep the default :class:`ListAggregator`, which
collects the list and calls :meth:`Algorithm.aggregate` — they say so by not overriding
:meth:`Algorithm.aggregator`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedhet.messages import ClientUpdate


class Aggregator:
    """One round's aggregation, fed one update at a time."""

    streams = False

    def add(self, update: ClientUpdate) -> None:
        raise NotImplementedError

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class ListAggregator(Aggregator):
    """Collects the updates and hands the list to ``aggregate`` (rules that need it)."""

    def __init__(self, aggregate: Callable[[list[ClientUpdate]], tuple[torch.Tensor, torch.Tensor]]):
        self.updates: list[ClientUpdate] = []
        self._aggregate = aggregate

    def add(self, update: ClientUpdate) -> None:
        self.updates.append(update)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._aggregate(self.updates)


class WeightedSumAggregator(Aggregator):
    """w + eta sum_u a_u Delta_u over the full-coverage updates, summed as they arrive.

    The weights a_u = weight(u) / normaliser are fixed by the ``expected`` normaliser the
    round announces (the number of tasks, or their total examples); the arithmetic is then
    the same as summing the list. When fewer updates arrive than announced (a skipped or
    failed client) the sum is rescaled to the normaliser actually met."""

    streams = True

    def __init__(
        self,
        params: torch.Tensor,
        buffers: torch.Tensor,
        weight: Callable[[ClientUpdate], float],
        expected: float,
        server_lr: float = 1.0,
        buffer_weight: Callable[[ClientUpdate], float] | None = None,
        buffer_expected: float | None = None,
    ):
        self.params, self.buffers = params, buffers
        self.new_params, self.new_buffers = params.clone(), buffers.clone()
        self.weight, self.expected, self.server_lr = weight, float(expected), server_lr
        self.buffer_weight = buffer_weight or weight
        self.buffer_expected = float(expected if buffer_expected is None else buffer_expected)
        self.met = 0.0
        self.buffer_met = 0.0

    def add(self, update: ClientUpdate) -> None:
        if not update.coverage.is_full():
            return
        raw = self.weight(update)
        self.met += raw
        self.buffer_met += self.buffer_weight(update)
        self.new_params.add_(update.delta, alpha=(raw / self.expected) * self.server_lr)
        if self.buffers.numel():
            self.new_buffers.add_(
                update.delta_buffers, alpha=self.buffer_weight(update) / self.buffer_expected
            )

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.met:
            return self.params, self.buffers
        params, buffers = self.new_params, self.new_buffers
        if self.met != self.expected:  # fewer arrived than announced: renormalise
            params = self.params + (params - self.params) * (self.expected / self.met)
        if self.buffers.numel() and self.buffer_met != self.buffer_expected:
            buffers = self.buffers + (buffers - self.buffers) * (self.buffer_expected / self.buffer_met)
        return params, buffers


class LayerwiseSumAggregator(Aggregator):
    """Per-layer sums of partial updates and |U_l|, accumulated as updates arrive (the same
    arithmetic as :func:`fedhet.algorithms.aggregation.layerwise_sum` over the list);
    ``finish(param_sums, param_counts, buffer_sums, buffer_counts)`` makes the new model."""

    streams = True

    def __init__(self, params, buffers, layout, finish):
        from fedhet.algorithms.aggregation import LayerwiseSum

        self.params_sum = LayerwiseSum(layout.param_slices, params.numel())
        self.buffers_sum = LayerwiseSum(layout.buffer_slices, buffers.numel()) if buffers.numel() else None
        self._finish = finish

    def add(self, update: ClientUpdate) -> None:
        self.params_sum.add(update, update.delta)
        if self.buffers_sum is not None:
            self.buffers_sum.add(update, update.delta_buffers)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._finish(self.params_sum, self.buffers_sum)
