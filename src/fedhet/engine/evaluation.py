"""Evaluation of the global model on the test set, every ``eval_every`` rounds and at the end."""

from __future__ import annotations

import torch

from fedhet.client import evaluate
from fedhet.models.layers import FlatModel


class Evaluator:
    """Test loss and accuracy of global models on one held-out set."""

    def __init__(self, flat: FlatModel, x: torch.Tensor, y: torch.Tensor, every: int, last_round: int):
        self.flat = flat
        self.x = x
        self.y = y
        self.every = every
        self.last_round = last_round

    def due(self, round_number: int) -> bool:
        """Whether round ``round_number`` (1-based) is evaluated."""
        return round_number % self.every == 0 or round_number == self.last_round

    def __call__(self, params: torch.Tensor, buffers: torch.Tensor) -> tuple[float, float]:
        """(test loss, test accuracy)."""
        return evaluate(self.flat, params, buffers, self.x, self.y)
