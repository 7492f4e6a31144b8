"""Coordinate-wise median aggregation (Yin et al., "Byzantine-robust distributed learning:
towards optimal statistical rates", arXiv:1803.01498): robust to a minority of clients
sending anything at all.

A fedhet rule is a class with a ``name``, an ``Options`` dataclass (its ``[algorithm]``
keys) and the part it changes: here only the aggregation (an ``Aggregation`` part); the
planner, the client part and the reporting are the shared defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhet.algorithms import Aggregation, Algorithm
from fedhet.errors import ConfigError


@dataclass
class CoordinateMedianOptions:
    """``server_lr``: eta_s in w + eta_s median_u Delta_u."""

    server_lr: float = 1.0

    def validate(self) -> None:
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class MedianOfFinishers(Aggregation):
    """w + eta_s median_u Delta_u over the clients that finished (w kept when none did)."""

    def aggregate(self, params, buffers, updates, state, context, layout):
        full = [u for u in updates if u.coverage.is_full()]
        if not full:
            return params, buffers
        median = torch.stack([u.delta for u in full]).median(dim=0).values
        new_buffers = buffers
        if buffers.numel():
            new_buffers = buffers + torch.stack([u.delta_buffers for u in full]).mean(dim=0)
        return params + self.options.server_lr * median, new_buffers


class CoordinateMedian(Algorithm):
    """Clients that would not finish by the deadline are not asked; the server steps by the
    coordinate-wise median of the finishers' updates (kept when nobody finished)."""

    name = "coordinate-median"
    summary = "coordinate-wise median of the finishers' updates (Yin et al. 2018)"
    Options = CoordinateMedianOptions
    partial_work = "none"
    # tuned by fedhet bench beside the learning rate (the range, as in a search space file)
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": {"low": 0.25, "high": 2.0, "log": True}}
    Aggregation = MedianOfFinishers


@dataclass
class FinishedStepsMeanOptions:
    """``server_lr``: eta_s in w + eta_s sum_u a_u Delta_u, a_u proportional to u's steps."""

    server_lr: float = 1.0

    def validate(self) -> None:
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class StepsWeightedMean(Aggregation):
    """w + eta_s sum_u a_u Delta_u with a_u proportional to the local steps u finished."""

    def aggregate(self, params, buffers, updates, state, context, layout):
        steps = torch.tensor([float(u.steps) for u in updates])
        if not updates or not steps.sum() > 0:
            return params, buffers
        weights = steps / steps.sum()
        step = sum(w * u.delta for w, u in zip(weights, updates, strict=True))
        new_buffers = buffers
        if buffers.numel():
            new_buffers = buffers + sum(w * u.delta_buffers for w, u in zip(weights, updates, strict=True))
        return params + self.options.server_lr * step, new_buffers


class FinishedStepsMean(Algorithm):
    """A rule that uses partial work: ``partial_work = "steps"`` makes fedhet cut each
    client's task to the whole local steps its sampled outcome lets it finish by the
    deadline (``ClientUpdate.steps``), so a straggler still delivers what it did; the server
    averages the updates weighted by those steps (a client that finished none sends nothing).
    ``"layers"`` would cut by layers instead (SALF), ``"none"`` asks only finishers."""

    name = "finished-steps-mean"
    summary = "steps-weighted average of every client's finished local steps"
    Options = FinishedStepsMeanOptions
    partial_work = "steps"
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": {"low": 0.25, "high": 2.0, "log": True}}
    Aggregation = StepsWeightedMean
