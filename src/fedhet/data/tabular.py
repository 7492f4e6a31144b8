"""A regression dataset: scikit-learn's bundled diabetes data (Efron et al., "Least Angle
Regression", Annals of Statistics 2004): 442 patients, 10 baseline variables, and a
quantitative measure of disease progression one year later.

It poses a :class:`~fedhet.data.task.Regression` task: the model has one output, trains
with the mean squared error on the standardised target, and runs report ``test_rmse`` in
the target's own units. Features and target are standardised with the training split's
statistics only. The train/test split is fixed (``split_seed``), whatever the run's seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.checks import in_range
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.data.task import Regression
from fedhet.registry import register


@dataclass
class DiabetesOptions:
    """``test_fraction`` of the 442 patients held out for testing, drawn with ``split_seed``."""

    test_fraction: float = 0.2
    split_seed: int = 0

    def validate(self) -> None:
        in_range("data.test_fraction", self.test_fraction, 0.0, 0.5, low_open=True)


def load_diabetes(test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    """The diabetes regression data, split and standardised (see the module's docstring)."""
    from sklearn.datasets import load_diabetes as sk_load_diabetes

    x, y = sk_load_diabetes(return_X_y=True, scaled=False)
    order = np.random.default_rng(split_seed).permutation(len(y))
    held = int(round(test_fraction * len(y)))
    test, train = np.sort(order[:held]), np.sort(order[held:])
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    std[std == 0] = 1.0
    target_mean, target_std = float(y[train].mean()), float(y[train].std())

    def features(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((x[rows] - mean) / std).astype(np.float32))

    def target(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((y[rows] - target_mean) / target_std).astype(np.float32))

    return Dataset(
        name="diabetes",
        x_train=features(train),
        y_train=target(train),
        x_test=features(test),
        y_test=target(test),
        num_classes=1,  # one output: the standardised progression measure
        provenance={
            "source": "sklearn.datasets.load_diabetes",
            "train_rows": len(train),
            "test_rows": held,
            "target_mean": target_mean,
            "target_std": target_std,
        },  # fmt: skip
        task=Regression(target_scale=target_std),
    )


@register("dataset")
class Diabetes(DatasetSource):
    """scikit-learn's diabetes data (442 patients, 10 features): a regression (MSE, RMSE)."""

    name = "diabetes"
    Options = DiabetesOptions

    @classmethod
    def build(cls, options: DiabetesOptions, ctx=None) -> Dataset:
        return load_diabetes(options.test_fraction, options.split_seed)
