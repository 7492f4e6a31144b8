"""Each system model's sampled outcomes match the marginals it reports."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import poisson

from fedhet.system import ExponentialLayers, StragglerRatio, UniformDepth, Workload

DRAWS = 20000


def _models(num_clients=4, num_layers=4):
    rng = np.random.default_rng(5)
    return {
        "uniform-depth": UniformDepth(num_clients, num_layers),
        "straggler-ratio": StragglerRatio(num_clients, num_layers, 0.5),
        "straggler-ratio-all": StragglerRatio(num_clients, num_layers, 1.0),
        "straggler-ratio-fixed": StragglerRatio(
            num_clients, num_layers, 0.75, fixed_stragglers=True, rng=rng
        ),
        "exponential": ExponentialLayers(num_clients, num_layers, np.array([0.5, 1.0, 1.5, 1.0]), 0.5),
    }


@pytest.mark.parametrize("name", list(_models()))
def test_sampled_no_reach_frequency_matches_p_l(name):
    model = _models()[name]
    batch = np.full(model.num_clients, 2)
    deadline = 1.0
    rng = np.random.default_rng(0)
    depths = np.stack([model.sample(Workload(deadline, batch), rng).depth for _ in range(DRAWS)])
    marg = model.marginals(Workload(deadline, batch))
    L = model.num_layers
    for layer in range(1, L + 1):
        reached = depths <= layer
        no_reach = 1.0 - reached.any(axis=1).mean()
        p = marg.no_reach_prob[layer - 1]
        assert abs(no_reach - p) < 4 * np.sqrt(p * (1 - p) / DRAWS) + 2e-3, (layer, no_reach, p)
        freq = reached.mean(axis=0)
        q = marg.reach_prob[:, layer - 1]
        assert np.all(np.abs(freq - q) < 4 * np.sqrt(q * (1 - q) / DRAWS) + 2e-3), (layer, freq, q)


def test_uniform_depth_p_l_is_salf_eq_10():
    marg = UniformDepth(30, 4).marginals(Workload(1.0, np.ones(30)))
    assert np.allclose(marg.no_reach_prob, (1 - np.arange(1, 5) / 5) ** 30)


def test_exponential_layers_done_are_truncated_poisson():
    L, mean, deadline = 5, 0.4, 1.0
    model = ExponentialLayers(1, L, np.ones(1), time_per_sample_layer=mean)
    rng = np.random.default_rng(1)
    done = np.array(
        [L + 1 - model.sample(Workload(deadline, np.ones(1)), rng).depth[0] for _ in range(DRAWS)]
    )
    lam = deadline / mean
    expected = [poisson.pmf(k, lam) for k in range(L)] + [poisson.sf(L - 1, lam)]
    observed = np.bincount(done, minlength=L + 1) / DRAWS
    assert np.allclose(observed, expected, atol=0.012)


def test_wait_for_all_means_full_depth_and_slowest_time():
    model = ExponentialLayers(3, 4, np.ones(3), 1.0)
    out = model.sample(Workload(None, np.ones(3)), np.random.default_rng(0))
    assert np.all(out.depth == 1) and np.array_equal(out.finish_time, out.full_time)
    with pytest.raises(Exception, match="straggler_ratio"):
        StragglerRatio(3, 4, 1.5)
