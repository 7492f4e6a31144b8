"""A researcher's own method for the bench tests: FedAvg over the clients that finished,
with the largest and smallest ``trim`` share of each coordinate's updates left out (a
coordinate-wise trimmed mean, Yin et al., arXiv:1803.01498). It declares ``trim`` as its
hyperparameter, so a bench tunes it beside the learning rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhet.algorithms import Algorithm
from fedhet.errors import ConfigError


@dataclass
class TrimmedMeanOptions:
    trim: float = 0.1

    def validate(self) -> None:
        if not 0.0 <= self.trim < 0.5:
            raise ConfigError(f"algorithm.trim = {self.trim}: must be in [0, 0.5)")


class TrimmedMean(Algorithm):
    name = "trimmed-mean"
    summary = "coordinate-wise trimmed mean of the finishers' updates"
    Options = TrimmedMeanOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"trim": {"low": 0.0, "high": 0.3}}

    def aggregate(self, params, buffers, updates, state, context, layout):
        full = [u for u in updates if u.coverage.is_full()]
        if not full:
            return params, buffers
        deltas = torch.stack([u.delta for u in full]).sort(dim=0).values
        cut = int(self.options.trim * len(full))
        kept = deltas[cut : len(full) - cut] if len(full) - 2 * cut > 0 else deltas
        new_buffers = buffers
        if buffers.numel():
            new_buffers = buffers + torch.stack([u.delta_buffers for u in full]).mean(dim=0)
        return params + kept.mean(dim=0), new_buffers
