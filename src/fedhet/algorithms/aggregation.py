"""Layer-wise sums of partial client updates over flat parameter vectors.

A client whose coverage starts at depth d sends the flat region of layers d..L. Summing every update into a
full-size vector and counting, per layer, the clients that reached it costs O(U * P) and
gives what every layer-wise rule needs: sum over U_l of Delta_u^l and |U_l|.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedhet.messages import ClientUpdate
from fedhet.models.layers import LayerSlices


def layerwise_sum(
    updates: Iterable[ClientUpdate],
    slices: LayerSlices,
    size: int,
    which: str = "params",
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (sum over clients of their delta, zero outside reached layers; per-layer counts
    |U_l| = #{u : d_u <= l}) for ``which`` in {"params", "buffers"}.

    ``weights[u, l-1]``, when given, multiplies client u's delta on layer l in the sum."""
    num_layers = len(slices.bounds)
    total = torch.zeros(size)
    counts = torch.zeros(num_layers)
    lengths = torch.tensor([end - start for start, end in slices.bounds])
    for update in updates:
        if update.coverage.width != 1.0:
            raise ValueError("layer-wise aggregation takes full-width updates only")
        if update.depth > num_layers:
            continue
        delta = update.delta if which == "params" else update.delta_buffers
        start = slices.start(update.depth)
        if weights is None:
            total[start:].add_(delta)  # in place: `x[s:] += d` also copies the view onto itself
        else:
            per_layer = weights[update.client, update.depth - 1 :].to(torch.float32)
            total[start:].add_(delta * torch.repeat_interleave(per_layer, lengths[update.depth - 1 :]))
        counts[update.depth - 1 :].add_(1)
    return total, counts


class LayerwiseSum:
    """The running sum over clients of their partial deltas (zero outside reached layers)
    and the per-layer counts |U_l|, one update at a time."""

    def __init__(self, slices: LayerSlices, size: int):
        self.slices = slices
        self.total = torch.zeros(size)
        self.counts = torch.zeros(len(slices.bounds))

    def add(self, update: ClientUpdate, delta: torch.Tensor) -> None:
        if update.coverage.width != 1.0:
            raise ValueError("layer-wise aggregation takes full-width updates only")
        if update.depth > len(self.slices.bounds):
            return
        self.total[self.slices.start(update.depth) :].add_(delta)
        self.counts[update.depth - 1 :].add_(1)


def layerwise_mean(values: torch.Tensor, summed: LayerwiseSum | None) -> torch.Tensor:
    """values + (per-layer mean over U_l of the summed deltas); layers nobody reached kept."""
    if summed is None or values.numel() == 0:
        return values
    per_element = expand_per_layer(summed.counts, summed.slices, values.numel())
    return values + summed.total / per_element.clamp(min=1.0)


def expand_per_layer(values: torch.Tensor, slices: LayerSlices, size: int) -> torch.Tensor:
    """Repeat one value per layer over that layer's flat region (length ``size``)."""
    lengths = torch.tensor([end - start for start, end in slices.bounds])
    out = torch.repeat_interleave(values.to(torch.float32), lengths)
    assert out.numel() == size
    return out


def layerwise_mean_buffers(
    buffers: torch.Tensor, updates: list[ClientUpdate], slices: LayerSlices
) -> torch.Tensor:
    """Float buffers (BatchNorm running statistics) of layer l: the mean over U_l of the
    clients' buffers; kept when nobody reached l. Statistics are not gradient estimates, so
    no probability correction is applied to them."""
    if buffers.numel() == 0:
        return buffers
    total, counts = layerwise_sum(updates, slices, buffers.numel(), which="buffers")
    per_element = expand_per_layer(counts, slices, buffers.numel())
    return buffers + total / per_element.clamp(min=1.0)


def client_weights(updates: list[ClientUpdate], mode: str) -> list[float]:
    """Aggregation weights over the delivering clients: ``uniform`` 1/|S| or ``samples``
    n_u / sum_S n_v."""
    if mode == "samples":
        total = float(sum(u.num_samples for u in updates))
        return [u.num_samples / total for u in updates]
    return [1.0 / len(updates)] * len(updates)


def weighted_delta_sum(updates: list[ClientUpdate], weights: list[float], size: int) -> torch.Tensor:
    """sum_u a_u Delta_u over full updates (each covering every parameter)."""
    total = torch.zeros(size)
    for a, u in zip(weights, updates, strict=True):
        total.add_(u.delta, alpha=a)
    return total
