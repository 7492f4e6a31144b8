"""Seeds into figures with intervals: the mean of a cell's runs with a standard deviation or a
95% Student-t confidence interval, and whether two columns of a grid differ significantly
(a paired t-test over the seeds both ran, Welch's t-test when fewer than two pairs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INTERVALS = ("std", "ci95")


@dataclass(frozen=True)
class Estimate:
    """Mean of ``n`` values and the half-width shown after "±" (0 for a single value)."""

    mean: float
    spread: float
    n: int


def estimate(values: list[float], interval: str = "std") -> Estimate:
    """``interval = "std"``: the sample standard deviation; ``"ci95"``: the half-width of the
    95% confidence interval of the mean, t_{0.975, n-1} s / sqrt(n)."""
    if interval not in INTERVALS:
        raise ValueError(f"interval {interval!r}: one of {', '.join(INTERVALS)}")
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values")
    if x.size == 1:
        return Estimate(float(x[0]), 0.0, 1)
    s = float(x.std(ddof=1))
    if interval == "std":
        return Estimate(float(x.mean()), s, int(x.size))
    from scipy.stats import t

    return Estimate(float(x.mean()), float(t.ppf(0.975, x.size - 1)) * s / math.sqrt(x.size), int(x.size))


def difference_p_value(a: dict, b: dict, paired: bool = True) -> float | None:
    """Two-sided p-value of "a and b have the same mean". ``a`` and ``b`` map a seed (or any
    pairing key) to a value: with >= 2 seeds in common, a paired t-test on the differences
    of those seeds; otherwise (or ``paired=False``: independent units, such as separate
    tunings) Welch's t-test on all values; ``None`` when neither has enough values. A
    constant nonzero paired difference gives 0, an identical pair 1."""
    common = sorted(set(a) & set(b), key=str) if paired else []
    if len(common) >= 2:
        d = np.array([a[k] - b[k] for k in common], dtype=float)
        if not np.any(d):
            return 1.0
        if float(d.std(ddof=1)) == 0.0:
            return 0.0
        from scipy.stats import ttest_1samp

        return float(ttest_1samp(d, 0.0).pvalue)
    xa, xb = np.array(list(a.values()), float), np.array(list(b.values()), float)
    if xa.size < 2 or xb.size < 2:
        return None
    if xa.std(ddof=1) == 0 and xb.std(ddof=1) == 0:
        return 1.0 if xa[0] == xb[0] else 0.0
    from scipy.stats import ttest_ind

    return float(ttest_ind(xa, xb, equal_var=False).pvalue)


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values of one family of tests (``None``: no test, left
    out of the family): with the m p-values sorted, p_(1) <= ... <= p_(m), the adjusted
    p_(j) = max over i <= j of min(1, (m - i + 1) p_(i)). Rejecting where the adjusted value
    is below alpha keeps the family-wise error rate at alpha (Holm 1979)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running, m = 0.0, len(tested)
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


def significance_mark(above: bool, p: float | None, p_corrected: float | None, alpha: float = 0.05) -> str:
    """The mark a results table puts after a cell compared with its reference: `` ↑``/`` ↓``
    when the corrected p-value is below ``alpha``, `` (↑)``/`` (↓)`` when only the uncorrected
    one is, ``""`` otherwise (``above``: the cell's mean is above the reference's)."""
    arrow = "↑" if above else "↓"
    if p_corrected is not None and p_corrected < alpha:
        return f" {arrow}"
    if p is not None and p < alpha:
        return f" ({arrow})"
    return ""


def paired_variance_p_value(a: dict, b: dict) -> float | None:
    """Two-sided p-value of "a and b have the same variance" for values paired by seed (the
    Pitman-Morgan test: Var a = Var b exactly when a + b and a - b are uncorrelated, so the
    Pearson correlation of the sums and differences over the common seeds is tested against
    0 with n - 2 degrees of freedom; Pitman 1939, Morgan 1939). ``None`` with fewer than
    three common seeds; 1 when the sums or the differences are constant."""
    common = sorted(set(a) & set(b), key=str)
    if len(common) < 3:
        return None
    x = np.array([a[k] for k in common], dtype=float)
    y = np.array([b[k] for k in common], dtype=float)
    sums, differences = x + y, x - y
    if np.ptp(sums) == 0.0 or np.ptp(differences) == 0.0:
        return 1.0
    from scipy.stats import pearsonr

    return float(pearsonr(sums, differences).pvalue)
