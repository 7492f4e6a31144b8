"""The tuning budget as a curve: each method's expected best validation score after n trials.

A bench tunes every method under the same trial budget N. Whether a ranking holds at
that budget only, or flips with it, shows in the curve of the best validation value found
within the first n trials, n = 1..N. A method's tunings are independent searches of the
same space (their samplers seeded apart, :func:`fedhet.bench.study.sampler_seed`), so the
mean over its tunings of their best-so-far after n trials estimates the expected best
after n trials under the bench's own sampler (TPE after random start-up trials: its trials
are not independent draws, so the order-statistics estimator of "Show Your Work"
(Dodge et al., EMNLP 2019), which assumes them, would not apply; the tunings' own
sequences need no such assumption). The band is a 95% percentile bootstrap over the
tunings; a method tuned once has none.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

REPLICATES = 2000


@dataclass
class BudgetCurve:
    """Per trial count n (1..len), the mean best-so-far over the tunings and its band."""

    method: str
    mean: list[float | None]
    low: list[float | None]
    high: list[float | None]
    tunings: int


def best_so_far(values: list[float | None], maximize: bool) -> list[float | None]:
    """The best of the first n values, for n = 1..len (None until one is finite)."""
    out: list[float | None] = []
    best: float | None = None
    for value in values:
        if value is not None:
            better = best is None or (value > best if maximize else value < best)
            best = value if better else best
        out.append(best)
    return out


def curve(
    method: str, tunings: list[list[float | None]], maximize: bool, label: str = ""
) -> BudgetCurve | None:
    """A method's curve from its tunings' trial values (None without any trial)."""
    import numpy as np

    sequences = [best_so_far(t, maximize) for t in tunings if t]
    if not sequences:
        return None
    length = max(len(s) for s in sequences)
    table = np.full((len(sequences), length), np.nan)
    for row, sequence in enumerate(sequences):
        padded = sequence + [sequence[-1]] * (length - len(sequence))  # a shorter tuning: its best stays
        table[row] = [np.nan if v is None else v for v in padded]
    mean = _nanmean(table)
    low: list[float | None] = [None] * length
    high: list[float | None] = [None] * length
    if len(sequences) > 1:
        rng = np.random.default_rng(zlib.crc32(f"{label}/{method}".encode()))
        draws = rng.integers(0, len(sequences), size=(REPLICATES, len(sequences)))
        replicated = _nanmean(table[draws], axis=1)  # replicates x trial counts
        low = _listed(np.nanpercentile(replicated, 2.5, axis=0))
        high = _listed(np.nanpercentile(replicated, 97.5, axis=0))
    return BudgetCurve(method, _listed(mean), low, high, len(sequences))


def _nanmean(table: Any, axis: int = 0) -> Any:
    import warnings

    import numpy as np

    with warnings.catch_warnings():  # a column with no finite value yet: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(table, axis=axis)


def _listed(values: Any) -> list[float | None]:
    import math

    return [None if not math.isfinite(v) else float(v) for v in values]


def leaders(curves: list[BudgetCurve], maximize: bool) -> list[tuple[int, str]]:
    """Per trial count n, the method with the best expected best-so-far (its first
    listed among ties); counts where no method has a value are left out."""
    out = []
    length = max((len(c.mean) for c in curves), default=0)
    for n in range(length):
        scored = [(float(v), c.method) for c in curves if n < len(c.mean) and (v := c.mean[n]) is not None]
        if scored:
            pick = max if maximize else min
            best = pick(value for value, _ in scored)
            out.append((n + 1, next(m for value, m in scored if value == best)))
    return out


def budget_sentence(curves: list[BudgetCurve], maximize: bool) -> str | None:
    """Whether the leader by expected best validation value changes with the budget."""
    led = leaders(curves, maximize)
    if not led:
        return None
    changes = [(n, m) for i, (n, m) in enumerate(led) if i == 0 or led[i - 1][1] != m]
    path = "; ".join(f"from {n} trial{'s' if n > 1 else ''}: {m}" for n, m in changes)
    if len(changes) == 1:
        return f"Budget: the leader by expected best validation value is the same at every budget ({path})."
    return (
        "Budget: the leader by expected best validation value changes with the budget, "
        f"{len(changes) - 1} time{'s' if len(changes) > 2 else ''} ({path})."
    )
