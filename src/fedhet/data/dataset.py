"""The in-memory :class:`Dataset` every source returns, and :class:`DatasetSource`, the base
of dataset plug-ins (:mod:`fedhet.registry`, kind ``dataset``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from fedhet.data.compact import ByteImages, Features
from fedhet.data.task import Classification, Task
from fedhet.registry import NoOptions


@dataclass
class Dataset:
    """A dataset held in memory: float features and targets (int64 labels for
    classification), train and test splits, and the task they pose (its loss and metrics).

    ``num_classes``: the model's outputs (classes, or a regression's target columns).
    ``train_users``: where the data has its own users (LEAF's writers, speakers, ...), the
    user index of each training example, which ``data.partition = "natural"`` makes the
    clients; ``user_names`` names them."""

    name: str
    x_train: Features  # byte images: uint8 pixels and what each stands for
    y_train: torch.Tensor
    x_test: Features
    y_test: torch.Tensor
    num_classes: int
    images: bool = False  # pixels in [0, 1], channels first, not yet normalised
    provenance: dict = field(default_factory=dict)  # which files / split it came from (in summaries)
    task: Task = field(default_factory=Classification)
    train_users: torch.Tensor | None = None  # int64 user index per training example, or None
    user_names: list = field(default_factory=list)
    # > 0: a contract of the data (the quadratic objectives' exact gradients): each client is
    # one of its own users (data.partition = "natural") and trains on all its rows, this many,
    # in one batch (train.batch_size >= it); a run that breaks it is told so
    whole_user_batches: int = 0
    # the rows of ``x_train`` that are the training examples, where a split chose them without
    # copying the features (``data.fraction``, ``data.validation_fraction``, a pre-training
    # share): the decoded features stay one tensor, shared by the runs of a process;
    # ``y_train`` and ``train_users`` hold those rows' values, in that order. None: every row.
    train_rows: torch.Tensor | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 28, 28)`` or ``(64,)``."""
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        """The number of training examples (rows of ``y_train``)."""
        return int(self.y_train.shape[0])

    def rows(self, positions) -> torch.Tensor:
        """The rows of ``x_train`` holding the training examples at ``positions`` (0-based
        in ``y_train``'s order)."""
        positions = torch.as_tensor(positions, dtype=torch.long)
        return positions if self.train_rows is None else self.train_rows[positions]

    def train_features(self, positions) -> torch.Tensor:
        """The features of the training examples at ``positions`` (a copy)."""
        return self.x_train[self.rows(positions)]

    def test_features(self) -> torch.Tensor:
        """The test examples' features as one float tensor (decoded where kept as bytes)."""
        return self.x_test.decoded() if isinstance(self.x_test, ByteImages) else self.x_test

    def selected(self, positions) -> Dataset:
        """The dataset whose training examples are those at ``positions`` (in that order):
        their labels and users taken, their features left where they are (rows)."""
        positions = torch.as_tensor(positions, dtype=torch.long)
        users = self.train_users
        return replace(
            self,
            y_train=self.y_train[positions],
            train_users=None if users is None else users[positions],
            train_rows=self.rows(positions),
        )


class DatasetSource:
    """A dataset plug-in: ``name``, ``Options`` and ``build(options, ctx)`` returning a
    :class:`Dataset` (``ctx`` is None for now: a dataset depends on its options only).

    :meth:`source_files` names the folder the data is read from, so that a dataset loaded
    once per process (:func:`fedhet.data.sources.open_dataset`) is read again when its files
    change; sources with no files return None."""

    name = "base"
    Options: type = NoOptions

    @classmethod
    def build(cls, options, ctx=None) -> Dataset:
        raise NotImplementedError

    @classmethod
    def source_files(cls, options) -> Path | None:
        return None
