"""Numerics of random client subsets: E over a uniformly random k-subset of a product
(cohorts, straggler sets drawn per round) through the Poisson-binomial distribution."""

from __future__ import annotations

import numpy as np


def random_subset_product(inside: np.ndarray, outside: np.ndarray, size: int) -> float:
    """E over a uniformly random ``size``-subset S of the clients of
    prod_{u in S} inside_u * prod_{u not in S} outside_u (all factors in [0, 1]).

    That is [z^k] prod_u (outside_u + inside_u z) / C(U, k). Exact and free of overflow for
    any number of clients: tilt z -> theta z with theta chosen so that the Bernoulli
    probabilities r_u = inside_u theta / (outside_u + inside_u theta) sum to k; then
    [z^k] = theta^-k prod_u (outside_u + inside_u theta) P[sum_u Bernoulli(r_u) = k], all in
    logarithms, and the Poisson-binomial probability at its own mean comes from the product
    of the U polynomials (1 - r_u + r_u z) by pairwise (FFT) convolution, O(U log^2 U)."""
    from scipy.optimize import brentq
    from scipy.special import gammaln

    x, y = np.asarray(inside, float), np.asarray(outside, float)
    total = len(x)
    k = int(size)
    if not 0 <= k <= total:
        return 0.0
    log_choose = gammaln(total + 1) - gammaln(k + 1) - gammaln(total - k + 1)
    forced_in, forced_out = y == 0, x == 0  # clients that must be (or must not be) in S
    if np.any(forced_in & forced_out) or forced_in.sum() > k or forced_out.sum() > total - k:
        return 0.0
    log_fixed = np.log(x[forced_in]).sum() + np.log(y[forced_out]).sum()
    free = ~(forced_in | forced_out)
    x, y, k = x[free], y[free], k - int(forced_in.sum())
    if k == 0 or k == len(x):
        log_value = log_fixed + (np.log(y).sum() if k == 0 else np.log(x).sum())
        return float(np.exp(log_value - log_choose))
    log_ratio = np.log(x) - np.log(y)  # r_u = sigmoid(log_ratio + log_theta)

    def excess(log_theta: float) -> float:
        return float(np.sum(1.0 / (1.0 + np.exp(-(log_ratio + log_theta))))) - k

    low, high = -log_ratio.max() - 50.0, -log_ratio.min() + 50.0
    log_theta = brentq(excess, low, high, xtol=1e-12)
    r = 1.0 / (1.0 + np.exp(-(log_ratio + log_theta)))
    pmf_k = poisson_binomial_pmf(r)[k]
    if pmf_k <= 0:
        return 0.0
    log_tilt = np.logaddexp(np.log(y), np.log(x) + log_theta).sum()
    log_value = log_fixed - k * log_theta + log_tilt + np.log(pmf_k) - log_choose
    return float(np.exp(log_value))


def poisson_binomial_pmf(probs: np.ndarray) -> np.ndarray:
    """P[sum_u Bernoulli(probs_u) = j], j = 0..U: the product of the polynomials
    (1 - p_u + p_u z), multiplied pairwise level by level (direct convolution while short,
    batched FFTs after), O(U log^2 U)."""
    p = np.asarray(probs, float)
    size = 1 << max(0, int(np.ceil(np.log2(max(len(p), 1)))))
    polys = np.zeros((size, 2))
    polys[:, 0] = 1.0  # padding: the polynomial 1
    polys[: len(p), 0], polys[: len(p), 1] = 1.0 - p, p
    while len(polys) > 1:
        a, b = polys[0::2], polys[1::2]
        width = 2 * a.shape[1] - 1
        if a.shape[1] <= 32:
            merged = np.zeros((len(a), width))
            for i in range(a.shape[1]):
                merged[:, i : i + b.shape[1]] += a[:, i : i + 1] * b
        else:
            n = 1 << int(np.ceil(np.log2(width)))
            merged = np.fft.irfft(np.fft.rfft(a, n) * np.fft.rfft(b, n), n)[:, :width]
            np.clip(merged, 0.0, None, out=merged)
        polys = merged
    return polys[0][: len(p) + 1]
