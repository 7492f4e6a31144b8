"""Evaluation of the global model on the test set, every ``eval_every`` rounds (or at each
multiple of ``eval_interval`` simulated seconds) and at the end,
and, with ``run.client_eval``, on each client's held-out part of its own data; and the
first round and simulated time at which test accuracy reaches each of ``run.targets``."""

from __future__ import annotations

import math

import numpy as np
import torch

from fedhet import seeding
from fedhet.client import evaluate
from fedhet.client.evaluate import batch_sums, combine
from fedhet.data.task import Score, Task, default_task
from fedhet.models.batchnorm import static_batchnorm_buffers
from fedhet.models.layers import FlatModel


class Evaluator:
    """Test loss and accuracy of global models on one held-out set.

    ``statistics_from``: training examples on which, before each evaluation, the global
    model's BatchNorm statistics are recomputed (static BatchNorm, for algorithms that ask
    for it); ``statistics_examples`` of them (0 = all), a random subset per round."""

    def __init__(
        self,
        flat: FlatModel,
        x: torch.Tensor,
        y: torch.Tensor,
        every: int,
        last_round: int,
        statistics_from: torch.Tensor | None = None,
        statistics_examples: int = 0,
        seed: int = 0,
        task: Task | None = None,
        interval: float = 0.0,
    ):
        self.flat = flat
        self.interval = float(interval)
        self.x = x
        self.y = y
        self.every = every
        self.last_round = last_round
        self.statistics_from = statistics_from
        self.statistics_examples = statistics_examples
        self.seed = seed
        self.task = task or default_task()

    def refresh_buffers(self, params: torch.Tensor, buffers: torch.Tensor, round_number: int) -> torch.Tensor:
        """The buffers to evaluate (and keep) ``params`` with: recomputed BatchNorm statistics
        under static BatchNorm, otherwise ``buffers`` unchanged."""
        x = self.statistics_from
        if x is None or not buffers.numel():
            return buffers
        if 0 < self.statistics_examples < len(x):
            rng = seeding.round_stream(self.seed, "static-batchnorm", round_number)
            x = x[np.sort(rng.choice(len(x), self.statistics_examples, replace=False))]
        return static_batchnorm_buffers(self.flat, params, buffers, x)

    def due(self, round_number: int, sim_time: float = 0.0, previous_time: float = 0.0) -> bool:
        """Whether round ``round_number`` (1-based), ending at simulated time ``sim_time``
        (the round before it ended at ``previous_time``), is evaluated: the last round; with
        an interval, the first round ending at or after each multiple of it (a round that
        passes several multiples is evaluated once); else every ``every``-th round."""
        if round_number == self.last_round:
            return True
        if self.interval > 0:
            return self.grid_index(sim_time) > self.grid_index(previous_time)
        return round_number % self.every == 0

    def grid_index(self, sim_time: float) -> int:
        """How many multiples of the interval ``sim_time`` has reached; a time a rounding
        error short of a multiple (ten rounds of 0.2 s add up to 1.9999999999999998) reaches it."""
        return int(math.floor(sim_time / self.interval + 1e-9))

    def __call__(self, params: torch.Tensor, buffers: torch.Tensor) -> dict[str, float]:
        """The task's metrics on the test set, as metrics-row columns (``test_loss``,
        ``test_accuracy``; a regression's ``test_rmse``, ...)."""
        return self.from_batches(self.batch_sums(params, buffers, 0, len(self.y)))

    def batch_sums(self, params: torch.Tensor, buffers: torch.Tensor, start: int, stop: int) -> list[dict]:
        """The per-batch sums of one shard ``[start, stop)`` of the test set
        (:func:`fedhet.client.evaluate.shards`), for :meth:`from_batches`."""
        return batch_sums(self.flat, params, buffers, self.x, self.y, start, stop, task=self.task)

    def from_batches(self, batches: list[dict]) -> dict[str, float]:
        """The metrics-row columns from every batch's sums, in batch order (the shards'
        lists concatenated): the same numbers as one pass over the test set."""
        return test_metrics(batches, len(self.y), self.task)

    def clients(
        self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor, holdout: list
    ) -> list[dict]:
        """The global model on each client's held-out examples (rows of client_metrics.csv)."""
        rows = []
        for client, indices in enumerate(holdout):
            if len(indices) == 0:
                continue
            found = evaluate(self.flat, params, buffers, x[indices], y[indices], task=self.task)
            rows.append({"client": client, "examples": len(indices), **found})
        return rows


def target_times(
    metrics: list[dict], targets: list[float], score: Score | None = None
) -> dict[str, dict | None]:
    """For each target value of the task's score (an accuracy to reach, an RMSE to get
    below), the first evaluated round reaching it and its simulated time (``None`` if never
    reached)."""
    score = score or Score()
    out: dict[str, dict | None] = {}
    for target in targets:
        column = score.column
        reached = (r for r in metrics if r.get(column) is not None and score.reaches(r[column], target))
        hit = next(reached, None)
        out[f"{target:g}"] = (
            None if hit is None else {"round": int(hit["round"]), "sim_time": hit["sim_time"]}
        )
    return out


def test_metrics(batches: list[dict], count: int, task: Task) -> dict[str, float]:
    """Metrics-row columns (``test_<metric>``) of ``count`` test examples from their
    per-batch sums in batch order."""
    return {f"test_{name}": value for name, value in combine(batches, count, task).items()}


def make_evaluator(world) -> Evaluator:
    """The run's evaluator: the test set, ``run.eval_every``, and the clients' training
    examples when the algorithm asks for static BatchNorm statistics."""
    config, algorithm = world.config, world.algorithm
    examples = algorithm.static_batchnorm_examples
    statistics_from = None
    if examples is not None and world.flat.buffers.numel():
        statistics_from = world.dataset.x_train[np.sort(np.concatenate(world.client_indices))]
    return Evaluator(
        world.flat,
        world.dataset.test_features(),
        world.dataset.y_test,
        config.run.eval_every,
        config.run.rounds,
        statistics_from=statistics_from,
        statistics_examples=examples or 0,
        seed=config.run.seed,
        task=world.dataset.task,
        interval=config.run.eval_interval,
    )
