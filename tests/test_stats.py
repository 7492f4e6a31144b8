"""The paired variance test (Pitman-Morgan) behind the AMSFL variance page: it agrees with
the test's textbook form, holds its level on correlated pairs of equal variance, and finds
a doubled spread."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from fedhet.studies.stats import paired_variance_p_value


def _pairs(x, y) -> tuple[dict, dict]:
    return dict(enumerate(map(float, x))), dict(enumerate(map(float, y)))


def test_it_equals_the_textbook_statistic_from_the_variance_ratio_and_correlation():
    """t = (F - 1) sqrt(n - 2) / (2 sqrt(F (1 - r^2))), F = s_x^2 / s_y^2, r = corr(x, y)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=30)
    y = 0.6 * x + rng.normal(scale=1.3, size=30)
    f = x.var(ddof=1) / y.var(ddof=1)
    r = np.corrcoef(x, y)[0, 1]
    stat = (f - 1) * math.sqrt(28) / (2 * math.sqrt(f * (1 - r**2)))
    expected = 2 * student_t.sf(abs(stat), 28)
    assert paired_variance_p_value(*_pairs(x, y)) == pytest.approx(expected, rel=1e-9)


def test_it_holds_its_level_on_correlated_pairs_of_equal_variance_and_finds_a_doubled_spread():
    rng = np.random.default_rng(0)
    null, power = [], []
    for _ in range(2000):
        shared = rng.normal(size=50)
        x = shared + rng.normal(size=50)
        y = shared + rng.normal(size=50)
        null.append(paired_variance_p_value(*_pairs(x, y)))
        power.append(paired_variance_p_value(*_pairs(x, 2 * y)))
    assert 0.035 < np.mean(np.array(null) < 0.05) < 0.065
    assert np.mean(np.array(power) < 0.05) > 0.95


def test_too_few_seeds_give_no_test_and_constant_pairs_no_difference():
    assert paired_variance_p_value({1: 0.5, 2: 0.6}, {1: 0.4, 2: 0.7}) is None
    assert paired_variance_p_value(*_pairs([1, 2, 3], [1, 2, 3])) == 1.0
