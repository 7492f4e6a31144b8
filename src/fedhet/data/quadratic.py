"""Quadratic client objectives with exact gradients: the two-client problem of FedStale's
Fig. 1 (Rodio and Neglia, "FedStale: leveraging stale client updates in federated
learning"), as a dataset (``data.dataset = "quadratic"``).

Client i's objective is F_i(w) = 1/2 ||B_i w - b_i||^2 over w in R^d, with b_i = B_i w_i*
(its optimum w_i*). It is a regression with d rows per client: row j of B_i as the
features, entry j of b_i as the target. A linear model without bias (``model.name =
"linear"``) trained on a client's d rows in one batch (``train.batch_size`` >= d) computes
the mean squared error (1/d) sum_j (B_i w - b_i)_j^2 = (2/d) F_i(w), so its gradient is
the exact gradient of F_i up to the constant 2/d: no sampling noise. ``data.partition =
"natural"`` makes each client's rows its own. The test set is every client's rows, so the
test loss is (2 / (N d)) sum_i F_i(w), the uniform objective up to a constant.

The default problem (our choice; the paper draws its figure without giving the numbers): two
clients in 2-D with differently shaped bowls, B_1 = diag(1, 0.3) and B_2 = diag(0.3, 1),
optima w_1* = (5, -2) and w_2* = (-3, 6), so the global optimum (4.34, 5.34) is far from
the mean of the local optima, (1, 2). :func:`weighted_optimum` gives the minimiser of any
weighting sum_i omega_i F_i in closed form: (sum_i omega_i A_i)^{-1} sum_i omega_i A_i w_i*,
with A_i = B_i^T B_i.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.data.task import Regression
from fedhet.errors import ConfigError
from fedhet.registry import register

DEFAULT_MATRICES = [[[1.0, 0.0], [0.0, 0.3]], [[0.3, 0.0], [0.0, 1.0]]]
DEFAULT_OPTIMA = [[5.0, -2.0], [-3.0, 6.0]]


@dataclass
class QuadraticOptions:
    """``quadratic_matrices``: B_i per client (d x d nested lists, invertible);
    ``quadratic_optima``: w_i* per client (d numbers)."""

    quadratic_matrices: list = field(default_factory=lambda: [list(map(list, m)) for m in DEFAULT_MATRICES])
    quadratic_optima: list = field(default_factory=lambda: [list(w) for w in DEFAULT_OPTIMA])

    def validate(self) -> None:
        problem_arrays(self.quadratic_matrices, self.quadratic_optima)


def problem_arrays(matrices, optima) -> tuple[np.ndarray, np.ndarray]:
    """(B, w*) as arrays of shapes (N, d, d) and (N, d), checked: one line naming the key."""
    _only_numbers("data.quadratic_matrices", matrices)
    _only_numbers("data.quadratic_optima", optima)
    try:
        b = np.asarray(matrices, dtype=float)
        w = np.asarray(optima, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(
            "data.quadratic_matrices / quadratic_optima: expected nested lists of numbers"
        ) from None
    if b.ndim != 3 or b.shape[1] != b.shape[2] or b.shape[0] < 1:
        raise ConfigError(
            f"data.quadratic_matrices: expected one d x d matrix per client, got shape {b.shape}"
        )
    if w.shape != b.shape[:2]:
        raise ConfigError(
            f"data.quadratic_optima: expected {b.shape[0]} optima of {b.shape[1]} numbers, "
            f"got shape {w.shape}"
        )
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(w))):
        raise ConfigError("data.quadratic_matrices / quadratic_optima: every number must be finite")
    if np.any(np.abs(np.linalg.det(b)) < 1e-12):
        raise ConfigError("data.quadratic_matrices: every B_i must be invertible (its optimum unique)")
    return b, w


def _only_numbers(key: str, value) -> None:
    """Every entry of nested lists a real number: not a boolean, not text (numpy would read
    ``true`` as 1 and ``"2"`` as 2)."""
    if isinstance(value, list | tuple):
        for item in value:
            _only_numbers(key, item)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: {value!r} is not a number (expected nested lists of numbers)")


def weighted_optimum(matrices, optima, weights) -> np.ndarray:
    """argmin_w sum_i omega_i F_i(w) = (sum_i omega_i A_i)^{-1} sum_i omega_i A_i w_i*."""
    b, w = problem_arrays(matrices, optima)
    a = np.einsum("nji,njk->nik", b, b)  # A_i = B_i^T B_i
    omega = np.asarray(weights, dtype=float)
    return np.linalg.solve(np.einsum("n,nik->ik", omega, a), np.einsum("n,nik,nk->i", omega, a, w))


def objective(matrices, optima, point) -> np.ndarray:
    """F_i(w) for every client at ``point``."""
    b, w = problem_arrays(matrices, optima)
    residual = np.einsum("nij,j->ni", b, np.asarray(point, float)) - np.einsum("nij,nj->ni", b, w)
    return 0.5 * np.sum(residual**2, axis=1)


def load_quadratic(matrices=DEFAULT_MATRICES, optima=DEFAULT_OPTIMA) -> Dataset:
    """The problem as rows: client i's d rows (B_i, B_i w_i*), its users index i."""
    b, w = problem_arrays(matrices, optima)
    n, d = w.shape
    x = torch.from_numpy(b.reshape(n * d, d).astype(np.float32))
    y = torch.from_numpy(np.einsum("nij,nj->ni", b, w).reshape(n * d).astype(np.float32))
    users = torch.arange(n, dtype=torch.int64).repeat_interleave(d)
    return Dataset(
        name="quadratic",
        x_train=x,
        y_train=y,
        x_test=x.clone(),
        y_test=y.clone(),
        num_classes=1,
        provenance={"source": "quadratic objectives", "clients": n, "dimension": d},
        task=Regression(target_scale=1.0),
        train_users=users,
        whole_user_batches=d,  # exact gradients: a client's d rows, all in one batch
        user_names=[f"client-{i}" for i in range(n)],
    )


@register("dataset")
class Quadratic(DatasetSource):
    """Quadratic client objectives with exact gradients (FedStale's Fig. 1 problem)."""

    name = "quadratic"
    Options = QuadraticOptions

    @classmethod
    def build(cls, options: QuadraticOptions, ctx=None) -> Dataset:
        return load_quadratic(options.quadratic_matrices, options.quadratic_optima)
