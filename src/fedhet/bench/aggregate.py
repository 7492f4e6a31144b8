"""The leaderboard across scenarios: Friedman's test with Nemenyi's critical difference.

Each scenario is a block and each method a treatment; within a scenario the methods are
ranked by their mean test score (1 = best, ties share the mean rank). Friedman's test asks
whether the methods' mean ranks differ at all; Nemenyi's critical difference (CD) is the
smallest difference of mean ranks that tells two methods apart at ``alpha`` over all pairs
(Demšar, "Statistical Comparisons of Classifiers over Multiple Data Sets", JMLR 7, 2006,
Sec. 3.2.2): CD = q_alpha sqrt(k (k + 1) / (6 N)), q_alpha the studentized range's
1 - alpha quantile for k groups over sqrt(2). The test needs every method in every block,
so it runs over the methods that have a result in every scenario; the others are named as
left out. Its power is stated by CD itself: with few scenarios and many methods, only
large differences of rank can be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Friedman:
    """Friedman's test over ``scenarios`` (the blocks) of ``methods`` (each with a result in
    all of them) and Nemenyi's critical difference of mean ranks at ``alpha``."""

    methods: list[str]
    scenarios: list[str]
    mean_ranks: dict[str, float]  # over the blocks, among ``methods`` only (1 = best)
    statistic: float | None  # chi-square; None where every block ranks the methods alike
    p: float | None
    critical_difference: float
    alpha: float
    left_out: list[str] = field(default_factory=list)  # methods without a result in every block

    def near_best(self, method: str) -> bool | None:
        """Whether ``method``'s mean rank is within the critical difference of the best one
        (Nemenyi: not told apart from it); None for a method left out of the test."""
        if method not in self.mean_ranks:
            return None
        return self.mean_ranks[method] - min(self.mean_ranks.values()) <= self.critical_difference


def nemenyi_critical_difference(methods: int, blocks: int, alpha: float) -> float:
    """CD = q_alpha sqrt(k (k + 1) / (6 N)) (Demšar 2006, eq. in Sec. 3.2.2), q_alpha the
    studentized range's 1 - alpha quantile for k = ``methods`` over sqrt(2)."""
    import math

    from scipy.stats import studentized_range

    q = float(studentized_range.ppf(1.0 - alpha, methods, math.inf)) / math.sqrt(2.0)
    return q * math.sqrt(methods * (methods + 1) / (6.0 * blocks))


def friedman(means: dict[str, dict[str, float]], higher_is_better: bool, alpha: float) -> Friedman | None:
    """The test over ``means`` (scenario -> method -> mean test score), or None where fewer
    than 3 methods ran in every scenario or fewer than 2 scenarios hold them."""
    import numpy as np
    from scipy.stats import friedmanchisquare, rankdata

    order = list(dict.fromkeys(m for scores in means.values() for m in scores))
    common = [m for m in order if all(m in scores for scores in means.values())]
    blocks = list(means)
    if len(common) < 3 or len(blocks) < 2:
        return None
    table = np.array([[means[s][m] for m in common] for s in blocks])  # blocks x methods
    ranks = np.vstack([rankdata(-row if higher_is_better else row) for row in table])
    statistic: Any = None
    p: Any = None
    if any(len(set(row)) > 1 for row in table):
        result = friedmanchisquare(*table.T)
        statistic, p = float(result.statistic), float(result.pvalue)
    return Friedman(
        common, blocks, {m: float(r) for m, r in zip(common, ranks.mean(axis=0), strict=True)},
        statistic, p, nemenyi_critical_difference(len(common), len(blocks), alpha), alpha,
        [m for m in order if m not in common],
    )  # fmt: skip


def t_test_power(delta: float, df: int, alpha: float) -> float:
    """Power of a two-sided t-test at ``alpha`` with ``df`` degrees of freedom when the
    noncentrality is ``delta``: E_V[Phi(delta - c sqrt(V/df)) + Phi(-delta - c sqrt(V/df))],
    V ~ chi-square(df), c = t_{1-alpha/2}(df) (integrated with scipy; stable where the
    noncentral t's own functions are not: few degrees of freedom and a small alpha)."""
    import math

    from scipy.stats import chi2, norm, t

    critical = float(t.ppf(1.0 - alpha / 2.0, df))

    def rejected(v: float) -> float:
        scaled = critical * math.sqrt(v / df)
        return float(norm.cdf(delta - scaled) + norm.cdf(-delta - scaled))

    return float(chi2.expect(rejected, args=(df,)))


def detectable_difference(sd: float, units: int, alpha: float, power: float = 0.8) -> float | None:
    """The smallest difference of two methods' means that a two-sided t-test over ``units``
    units each (their standard deviation ``sd``; df = 2 units - 2) detects with ``power`` at
    ``alpha``: the noncentrality delta with :func:`t_test_power` = ``power``, times
    sd sqrt(2 / units). None for fewer than 2 units."""
    import math

    from scipy.optimize import brentq

    if units < 2 or not math.isfinite(sd):
        return None
    df = 2 * units - 2
    high = 1.0
    while t_test_power(high, df, alpha) < power and high < 1e6:
        high *= 2.0
    delta = brentq(lambda d: t_test_power(d, df, alpha) - power, 0.0, high, xtol=1e-6)
    return float(delta) * sd * math.sqrt(2.0 / units)


def pooled_sd(groups: list[list[float]]) -> float | None:
    """The pooled standard deviation of ``groups`` (each with 2 or more values)."""
    import numpy as np

    kept = [np.asarray(g, dtype=float) for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in kept)
    if not dof:
        return None
    return float(np.sqrt(sum(((g - g.mean()) ** 2).sum() for g in kept) / dof))
