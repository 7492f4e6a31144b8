"""The learning task a dataset poses: the training loss and the evaluation metrics.

A :class:`~fedhet.data.dataset.Dataset` carries its task (``dataset.task``), so the local
trainer, the evaluation, the wall-clock budget and the layer-time calibration all train and
score with what the data asks for, never with a hard-coded loss:

- :class:`Classification` (the default): cross-entropy; metrics ``loss`` and ``accuracy``;
  integer labels (they also drive the label partitions: dirichlet, shards, label-swap).
- :class:`Regression`: mean squared error on the (standardised) targets; metrics ``loss``
  (MSE) and ``rmse``, in the target's own units (``target_scale``); no labels to split by.
- :class:`NextToken`: a language model's; every position predicts the next token; metrics
  ``loss`` (cross-entropy per token), ``perplexity`` (the score, lower is better) and
  ``accuracy``.

In a run, each metric becomes the metrics.csv column ``test_<metric>`` (and the summary's
``final_test_<metric>`` / ``best_test_<metric>``); per-client evaluation writes the same
names in client_metrics.csv. A task plug-in (a dataset's own) subclasses :class:`Task`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

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

    def example_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each example's training loss (what a rule that selects samples by loss reads:
        FedBalancer)."""
        raise NotImplementedError(f"the {self.name} task defines no per-example loss")

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The task is its training loss (what a rule's ``local_loss`` gets as ``loss``)."""
        return self.loss(output, target)

    def distillation(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """The loss of ``student``'s outputs matching a (detached) ``teacher``'s on the same
        batch: self-distillation (FjORD)."""
        raise NotImplementedError(f"the {self.name} task defines no distillation loss")

    def divergences(self, outputs: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """For each ordered pair (i, j), i != j, of ``outputs`` on one batch (i first, then
        j): how far output i is from output j's detached prediction, zero when they agree:
        mutual self-distillation between exits (DepthFL Sec. 3.2)."""
        raise NotImplementedError(f"the {self.name} task defines no divergence")

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """Sums over one evaluation batch, added up over the batches (see :meth:`metrics`)."""
        raise NotImplementedError

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        """The metrics of ``count`` examples from the added-up :meth:`batch_sums`."""
        raise NotImplementedError

    def higher_is_better_for(self, metric: str) -> bool | None:
        """Whether ``metric`` grows as a model improves: the score's own direction
        (``higher_is_better``), a loss falls; None for a metric the task does not report."""
        if metric == self.score:
            return bool(self.higher_is_better)
        if metric == "loss":
            return False
        return None

    def metric_names(self) -> tuple[str, ...]:
        """The names :meth:`metrics` returns, in order."""
        raise NotImplementedError

    def value_range(self, metric: str) -> tuple[float, float]:
        """The values ``metric`` can take (a band or interval drawn over seeds is clipped to
        them): a loss is never negative; unbounded otherwise."""
        return (0.0, math.inf) if metric == "loss" else (-math.inf, math.inf)


class Classification(Task):
    """Cross-entropy training; loss and accuracy (the share of argmax hits)."""

    name = "classification"
    score = "accuracy"
    higher_is_better = True
    labels = True

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def example_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target, reduction="none")

    def distillation(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the student with the teacher's softmax (FjORD Sec. 3.3)."""
        return F.cross_entropy(student, teacher.softmax(dim=1))

    def divergences(self, outputs: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """KL(softmax z_j || softmax z_i), averaged over the batch (DepthFL Sec. 3.2)."""
        students = [F.log_softmax(z, dim=1) for z in outputs]
        teachers = [z.detach().softmax(dim=1) for z in outputs]
        for i, student in enumerate(students):
            for j, teacher in enumerate(teachers):
                if i != j:
                    yield F.kl_div(student, teacher, reduction="batchmean")

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        return {
            "loss": float(F.cross_entropy(output, target, reduction="sum")),
            "correct": int((output.argmax(1) == target).sum()),
        }

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        return {"loss": sums["loss"] / count, "accuracy": sums["correct"] / count}

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "accuracy")

    def value_range(self, metric: str) -> tuple[float, float]:
        return (0.0, 1.0) if metric == "accuracy" else super().value_range(metric)


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

    def example_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        squared = (output.reshape(target.shape) - target) ** 2
        return squared.reshape(len(target), -1).mean(1)

    def distillation(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """Mean squared error to the teacher's predictions."""
        return F.mse_loss(student, teacher)

    def divergences(self, outputs: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """Mean squared error of z_i to the detached z_j (a softmax of one output would
        make every divergence zero)."""
        for i, student in enumerate(outputs):
            for j, teacher in enumerate(outputs):
                if i != j:
                    yield F.mse_loss(student, teacher.detach())

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        return {"squared": float(((output.reshape(target.shape) - target) ** 2).sum())}

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        mse = sums["squared"] / count
        return {"loss": mse, "rmse": math.sqrt(mse) * self.target_scale}

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "rmse")

    def value_range(self, metric: str) -> tuple[float, float]:
        return (0.0, math.inf) if metric == "rmse" else super().value_range(metric)


class NextToken(Task):
    """A language model's task: every position of a sequence predicts the token after it.
    Outputs are (batch, positions, vocabulary) logits, targets (batch, positions) token
    indices; the loss is the mean cross-entropy per token, ``perplexity`` its exponential
    (the score, lower is better), ``accuracy`` the share of next tokens that are the argmax."""

    name = "next-token"
    score = "perplexity"
    higher_is_better = False
    labels = False

    @staticmethod
    def _flat(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output.reshape(-1, output.shape[-1]), target.reshape(-1).long()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(*self._flat(output, target))

    def example_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each sequence's mean cross-entropy per token."""
        losses = F.cross_entropy(*self._flat(output, target), reduction="none")
        return losses.view(target.shape[0], -1).mean(1)

    def distillation(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """Classification's, with every position a prediction of its own."""
        vocabulary = student.shape[-1]
        return Classification().distillation(student.reshape(-1, vocabulary), teacher.reshape(-1, vocabulary))

    def divergences(self, outputs: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """Classification's, with every position a prediction of its own (averaged over them)."""
        return Classification().divergences([z.reshape(-1, z.shape[-1]) for z in outputs])

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        logits, tokens = self._flat(output, target)
        return {
            "loss": float(F.cross_entropy(logits, tokens, reduction="sum")),
            "correct": int((logits.argmax(1) == tokens).sum()),
            "tokens": int(tokens.numel()),
        }

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        tokens = max(1, int(sums["tokens"]))
        loss = sums["loss"] / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": sums["correct"] / tokens}

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "perplexity", "accuracy")

    def value_range(self, metric: str) -> tuple[float, float]:
        if metric == "perplexity":
            return (1.0, math.inf)
        return (0.0, 1.0) if metric == "accuracy" else super().value_range(metric)

    def higher_is_better_for(self, metric: str) -> bool | None:
        return True if metric == "accuracy" else super().higher_is_better_for(metric)


def default_task() -> Task:
    """The task of a dataset that names none, and of a trainer or evaluator built without
    one: classification (cross-entropy; loss and accuracy). The one place that says so."""
    return Classification()


@dataclass(frozen=True)
class Score:
    """What says how good a model is: the metric ``metric`` of a task, better when higher
    (``higher_is_better``) or lower. Decides a run's best round, its targets, the console,
    plots, tables and the objectives of tune and bench."""

    metric: str = "accuracy"
    higher_is_better: bool = True

    @classmethod
    def of(cls, task: Task) -> Score:
        return cls(task.score, bool(task.higher_is_better))

    @classmethod
    def from_summary(cls, summary: dict) -> Score:
        """A run's score, as its summary.json records it (older runs: accuracy when they
        have one, else a regression's RMSE)."""
        saved = summary.get("score")
        if isinstance(saved, dict) and "metric" in saved:
            return cls(str(saved["metric"]), bool(saved.get("higher_is_better", True)))
        if summary.get("final_test_accuracy") is None and summary.get("final_test_rmse") is not None:
            return cls("rmse", False)
        return cls()

    @property
    def column(self) -> str:
        """Its metrics.csv column."""
        return f"test_{self.metric}"

    @property
    def direction(self) -> str:
        """Optuna's word for it."""
        return "maximize" if self.higher_is_better else "minimize"

    def reaches(self, value: float, target: float) -> bool:
        """Whether ``value`` is at least as good as ``target``."""
        return value >= target if self.higher_is_better else value <= target

    def best(self, values):
        """The best of ``values`` (None when empty)."""
        values = list(values)
        if not values:
            return None
        return max(values) if self.higher_is_better else min(values)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "higher_is_better": self.higher_is_better}


def check_objective(key: str, objective: str, plain: tuple[str, ...] = ("sim_time", "rounds")) -> None:
    """A summary number to judge runs by: ``final_test_<metric>`` or ``best_test_<metric>``
    of the task's metrics (accuracy, loss, a regression's rmse, ...), or one of ``plain``;
    refused in one line naming ``key`` otherwise. Whether the run's task has the metric is
    known once a run has its summary (:func:`objective_of`)."""
    import re

    from fedhet.errors import ConfigError

    if objective in plain or re.fullmatch(r"(final|best)_test_[a-z][a-z0-9_]*", str(objective)):
        return
    raise ConfigError(
        f"{key} = {objective!r}: final_test_<metric> or best_test_<metric> (metric: accuracy, loss, "
        f"rmse, ... of the dataset's task){', or ' + ', '.join(plain) if plain else ''}"
    )


def objective_of(summary: dict, objective: str) -> float | None:
    """The objective's value in a run's summary; one line naming the task's metrics when
    the run's task has no such number (final_test_accuracy on a regression)."""
    from fedhet.errors import FedhetError

    if objective not in summary and objective.startswith(("final_test_", "best_test_")):
        have = sorted(k for k in summary if k.startswith("final_test_"))
        raise FedhetError(
            f"objective {objective!r}: the run's task ({summary.get('task', '?')}) reports "
            f"{', '.join(have) or 'no test metric'} (and best_test_...)"
        )
    value = summary.get(objective)
    return None if value is None else float(value)
