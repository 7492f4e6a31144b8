"""A dataset from two CSV files of numbers (a header line, one example per row, the label in
column ``label_column``): any tabular data a researcher has at hand.

A fedhet dataset is a class deriving ``DatasetSource`` with a ``name``, an ``Options``
dataclass (its ``[data]`` keys besides ``dataset``) and ``build(options, ctx)`` returning
a ``Dataset`` of tensors; ``source_files`` lets fedhet notice when the files change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.data import Dataset, DatasetSource
from fedhet.errors import ConfigError, DataError


@dataclass
class CSVOptions:
    """``train_file``, ``test_file``: the two CSV files; ``label_column``: the label's column
    name; features are standardised with the training file's mean and std."""

    train_file: str = ""
    test_file: str = ""
    label_column: str = "label"

    def validate(self) -> None:
        if not self.train_file or not self.test_file:
            raise ConfigError("data.train_file / data.test_file: the csv dataset needs both files")


def _read(path: Path, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    header = [name.strip() for name in lines[0].split(",")] if lines else []
    if label_column not in header:
        raise DataError(f"{path}: no column {label_column!r} in the header line")
    try:
        rows = np.array([[float(v) for v in line.split(",")] for line in lines[1:] if line.strip()])
    except ValueError as exc:
        raise DataError(f"{path}: not a table of numbers ({exc})") from None
    if rows.ndim != 2 or rows.shape[1] != len(header):
        raise DataError(f"{path}: rows do not all have the header's {len(header)} columns")
    label = header.index(label_column)
    return np.delete(rows, label, axis=1).astype(np.float32), rows[:, label].astype(np.int64)


class CSVDataset(DatasetSource):
    """Tabular data from a training and a test CSV file."""

    name = "csv"
    Options = CSVOptions

    @classmethod
    def build(cls, options: CSVOptions, ctx=None) -> Dataset:
        x_train, y_train = _read(Path(options.train_file), options.label_column)
        x_test, y_test = _read(Path(options.test_file), options.label_column)
        mean, std = x_train.mean(axis=0), x_train.std(axis=0)
        std[std == 0] = 1.0
        classes = int(max(y_train.max(), y_test.max())) + 1
        return Dataset(
            name="csv",
            x_train=torch.from_numpy((x_train - mean) / std),
            y_train=torch.from_numpy(y_train),
            x_test=torch.from_numpy((x_test - mean) / std),
            y_test=torch.from_numpy(y_test),
            num_classes=classes,
        )

    @classmethod
    def source_files(cls, options: CSVOptions) -> Path | None:
        return Path(options.train_file).parent
