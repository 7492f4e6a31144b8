"""The bench's statistical model, and the intervals and effect sizes it gives.

The model of one scenario's final test scores is

    y[m, r, s] = mu_m + tau[m, r] + sigma_s + (mu sigma)[m, s] + e[m, r, s]

with ``m`` a method, ``r`` one of its tunings (each an independent search: nested in the
method, random) and ``s`` a test seed. Seeds are crossed with methods: seed ``s`` draws the
same split, devices and availability for every method and tuning, so two methods are
paired by seed and the seed's main effect ``sigma_s`` cancels from their difference.

Intervals come from a **hierarchical bootstrap** that follows this design: each replicate
draws the scenario's seeds with replacement once, for every method alike (the pairing),
and each method's tunings with replacement, its own (the nesting); a method's replicate
mean is the mean over its drawn tunings of their means over the drawn seeds. A method's
interval is the percentile interval of its replicate means; its effect against the
scenario's best method and against the suite's reference is the difference of their
replicate means, replicate by replicate (paired), with its percentile interval. Every
interval is clipped to the score's range (an accuracy's [0, 1]; a difference of
accuracies' [-1, 1]); a percentile interval of means of values in that range lies in it
anyway, where the Student-t interval it replaces reached below 0 with two tunings.

Why a bootstrap and not a mixed model: the field's cells are unbalanced (seeds that
failed, methods that skip scenarios), the score is bounded and skewed near its ends, and
two to five tunings estimate a tuning variance component poorly; the bootstrap needs no
distributional form and no new dependency. Its known weakness: with few units a
percentile interval is too narrow (by about sqrt((R - 1) / R) for R tunings), so the
intervals are read with the tests' p, which use the t distribution.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

REPLICATES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """An estimate with its bootstrap percentile interval."""

    value: float
    low: float
    high: float

    def text(self, digits: int = 4, signed: bool = False) -> str:
        sign = "+" if signed else ""
        return f"{self.value:{sign}.{digits}f} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}]"


def score_matrix(tunings: list[Any], seeds: list[int]) -> Any:
    """A tunings x seeds array of final scores (NaN where a tuning has no score for a seed);
    ``tunings`` are :class:`fedhet.bench.leaderboard.Tuned`."""
    import numpy as np

    table = np.full((len(tunings), len(seeds)), np.nan)
    for row, tuned in enumerate(tunings):
        for column, seed in enumerate(seeds):
            if seed in tuned.scores:
                table[row, column] = tuned.scores[seed]
    return table


def replicate_means(
    tables: dict[str, Any], seed_count: int, label: str, replicates: int = REPLICATES
) -> dict[str, Any]:
    """Per method, its ``replicates`` bootstrap means (the hierarchical draw of the module's
    docstring: one draw of the ``seed_count`` seeds shared by all methods, one draw of each
    method's tunings). The seeds' draws are seeded by ``label`` (the scenario's name), each
    method's tunings' draws by ``label`` and its name: a leaderboard reads the same every time
    it is made, and a method's own interval does not change when another method joins."""
    import warnings

    import numpy as np

    rng = np.random.default_rng(zlib.crc32(label.encode()))
    seed_draws = rng.integers(0, seed_count, size=(replicates, seed_count))
    out = {}
    for method, table in tables.items():
        own = np.random.default_rng(zlib.crc32(f"{label}/{method}".encode()))
        tuning_draws = own.integers(0, table.shape[0], size=(replicates, table.shape[0]))
        drawn = table[tuning_draws[:, :, None], seed_draws[:, None, :]]  # replicates x tunings x seeds
        with warnings.catch_warnings():  # a replicate that drew only missing seeds: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            out[method] = np.nanmean(np.nanmean(drawn, axis=2), axis=1)
    return out


def percentile_interval(value: float, draws: Any, low: float, high: float) -> Interval | None:
    """``value`` with the central ``LEVEL`` percentile interval of ``draws`` (NaN draws
    left out), clipped to [``low``, ``high``]; None without two finite draws."""
    import numpy as np

    finite = draws[np.isfinite(draws)]
    if finite.size < 2:
        return None
    tail = (1.0 - LEVEL) / 2.0 * 100.0
    lower, upper = np.percentile(finite, [tail, 100.0 - tail])
    return Interval(float(value), float(min(max(lower, low), high)), float(min(max(upper, low), high)))


def mean_intervals(
    draws: dict[str, Any], means: dict[str, float], score_range: tuple[float, float]
) -> dict[str, Interval | None]:
    """Each method's mean with its interval, clipped to the score's range."""
    low, high = score_range
    return {m: percentile_interval(means[m], draws[m], low, high) for m in means}


def effects(
    draws: dict[str, Any], means: dict[str, float], against: str, score_range: tuple[float, float]
) -> dict[str, Interval | None]:
    """Each method's difference to ``against`` (its mean less ``against``'s: the effect in
    the score's units) with the interval of the paired replicate differences, clipped to
    [-(range), +(range)]; ``against`` itself and methods without draws: None."""
    low, high = score_range
    width = high - low
    out: dict[str, Interval | None] = {}
    for method in means:
        if method == against or against not in draws:
            out[method] = None
            continue
        gap = means[method] - means[against]
        out[method] = percentile_interval(gap, draws[method] - draws[against], -width, width)
    return out
