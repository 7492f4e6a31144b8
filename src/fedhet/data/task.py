"""The learning task a dataset poses: the training loss and the evaluation metrics.

A :class:`~fedhet.data.dataset.Dataset` carries its task (``dataset.task``), so the local
trainer, the evaluation, the wall-clock budget and the layer-time calibration all train and
score with what the data asks for, never with a hard-coded loss:

- :class:`Classification` (the default): cross-entropy; metrics ``loss`` and ``accuracy``;
  integer labels (they also drive the label partitions: dirichlet, shards, label-swap).
- :class:`Regression`: mean squared error on the (standardised) targets; metrics ``loss``
  (MSE) and ``rmse``, in the target's own units (``target_scale``); no labels to split by.

In a run, each metric becomes the metrics.csv column ``test_<metric>`` (and the summary's
``final_test_<metric>`` / ``best_test_<metric>``); per-client evaluation writes the same
names in client_metrics.csv. A task plug-in (a dataset's own) subclasses :class:`Task`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class Task:
    """Base: ``loss(output, target)`` for training, and metrics accumulated over batches.

    ``score`` names the metric that says how good a model is, ``higher_is_better`` its
    direction; ``labels``: whether targets are class labels (label partitions need them)."""

    name = "base"
    score = "loss"
    higher_is_better = False
    labels = False

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean training loss of a batch."""
        raise NotImplementedError

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """Sums over one evaluation batch, added up over the batches (see :meth:`metrics`)."""
        raise NotImplementedError

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        """The metrics of ``count`` examples from the added-up :meth:`batch_sums`."""
        raise NotImplementedError

    def metric_names(self) -> tuple[str, ...]:
        """The names :meth:`metrics` returns, in order."""
        raise NotImplementedError


class Classification(Task):
    """Cross-entropy training; loss and accuracy (the share of argmax hits)."""

    name = "classification"
    score = "accuracy"
    higher_is_better = True
    labels = True

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        return {
            "loss": float(F.cross_entropy(output, target, reduction="sum")),
            "correct": int((output.argmax(1) == target).sum()),
        }

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        return {"loss": sums["loss"] / count, "accuracy": sums["correct"] / count}

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "accuracy")


class Regression(Task):
    """Mean squared error on targets standardised by the dataset (``target_scale`` = the
    standard deviation they were divided by); ``rmse`` is reported in the target's units:
    sqrt(MSE) x target_scale."""

    name = "regression"
    score = "rmse"
    higher_is_better = False
    labels = False

    def __init__(self, target_scale: float = 1.0):
        self.target_scale = float(target_scale)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output.reshape(target.shape), target)

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        return {"squared": float(((output.reshape(target.shape) - target) ** 2).sum())}

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        mse = sums["squared"] / count
        return {"loss": mse, "rmse": math.sqrt(mse) * self.target_scale}

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "rmse")
