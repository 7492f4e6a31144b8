"""Evaluation of the global model on the test set, every ``eval_every`` rounds and at the end,
and, with ``run.client_eval``, on each client's held-out part of its own data; and the
first round and simulated time at which test accuracy reaches each of ``run.targets``."""

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

    def clients(
        self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor, holdout: list
    ) -> list[dict]:
        """The global model on each client's held-out examples (rows of client_metrics.csv)."""
        rows = []
        for client, indices in enumerate(holdout):
            if len(indices) == 0:
                continue
            loss, accuracy = evaluate(self.flat, params, buffers, x[indices], y[indices])
            rows.append({"client": client, "examples": len(indices), "loss": loss, "accuracy": accuracy})
        return rows


def target_times(metrics: list[dict], targets: list[float]) -> dict[str, dict | None]:
    """For each target accuracy, the first evaluated round reaching it and its simulated time
    (``None`` if never reached)."""
    out: dict[str, dict | None] = {}
    for target in targets:
        hit = next(
            (r for r in metrics if r.get("test_accuracy") is not None and r["test_accuracy"] >= target), None
        )
        out[f"{target:g}"] = (
            None if hit is None else {"round": int(hit["round"]), "sim_time": hit["sim_time"]}
        )
    return out
