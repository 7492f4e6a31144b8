"""Bernoulli participation (FedStale Assumption 4): profiles, sampled frequencies against the
reported marginals, alone and on top of straggler models; FedAU's online estimates."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.algorithms.fedau import FedAUEstimator
from fedhet.errors import ConfigError
from fedhet.system import (
    BernoulliParticipation,
    ExponentialLayers,
    NoStragglers,
    StragglerRatio,
    UniformDepth,
    Workload,
    participation_probabilities,
)

DRAWS = 20000


def test_two_group_profile_has_half_always_present_and_half_at_p_min():
    rng = np.random.default_rng(0)
    probs = participation_probabilities("two-group", 24, rng, p_min=0.05)
    assert np.sum(probs == 1.0) == 12 and np.sum(probs == 0.05) == 12
    second = participation_probabilities("two-group", 24, rng, p_min=0.05, group="second-half")
    assert np.all(second[:12] == 1.0) and np.all(second[12:] == 0.05)
    odd = participation_probabilities("two-group", 5, rng, p_min=0.2, group="second-half")
    assert odd.tolist() == [1.0, 1.0, 0.2, 0.2, 0.2]


def test_uniform_and_list_profiles_and_their_errors():
    rng = np.random.default_rng(1)
    probs = participation_probabilities("uniform", 1000, rng, low=0.2, high=0.6)
    assert probs.min() >= 0.2 and probs.max() <= 0.6 and abs(probs.mean() - 0.4) < 0.02
    assert participation_probabilities("list", 3, rng, values=[0.1, 0.5, 1.0]).tolist() == [0.1, 0.5, 1.0]
    with pytest.raises(ConfigError, match="participation_probs: 2 values given for 3 clients"):
        participation_probabilities("list", 3, rng, values=[0.1, 0.5])
    with pytest.raises(ConfigError, match="participation_probs"):
        participation_probabilities("list", 2, rng, values=[0.0, 0.5])
    with pytest.raises(ConfigError, match="system.participation_min = 0"):
        participation_probabilities("two-group", 4, rng, p_min=0.0)
    with pytest.raises(ConfigError, match="system.participation = 'weekly'"):
        participation_probabilities("weekly", 4, rng)


def _wrapped_models():
    p = np.array([1.0, 0.7, 0.3, 0.1])
    return {
        "full": BernoulliParticipation(NoStragglers(4, 3), p),
        "uniform-depth": BernoulliParticipation(UniformDepth(4, 3), p),
        "straggler-ratio": BernoulliParticipation(StragglerRatio(4, 3, 0.5), p),
        "straggler-ratio-all": BernoulliParticipation(StragglerRatio(4, 3, 1.0), p),
        "exponential": BernoulliParticipation(
            ExponentialLayers(4, 3, np.array([0.5, 1.0, 1.5, 1.0]), 0.5), p
        ),
    }


@pytest.mark.parametrize("name", list(_wrapped_models()))
def test_sampled_presence_and_reach_match_the_marginals(name):
    """A client counts as reaching layer l only when present; frequencies of presence, of
    reaching l and of nobody reaching l match participation_prob, reach_prob and p_l."""
    model = _wrapped_models()[name]
    batch = np.full(4, 2)
    rng = np.random.default_rng(0)
    draws = [model.sample(Workload(1.0, batch), rng) for _ in range(DRAWS)]
    present = np.stack([o.participates for o in draws])
    depth = np.stack([o.depth for o in draws])
    marg = model.marginals(Workload(1.0, batch))
    tol = lambda q: 4 * np.sqrt(q * (1 - q) / DRAWS) + 2e-3  # noqa: E731
    assert np.all(np.abs(present.mean(0) - marg.participation_prob) < tol(marg.participation_prob))
    for layer in range(1, model.num_layers + 1):
        reached = present & (depth <= layer)
        q = marg.reach_prob[:, layer - 1]
        assert np.all(np.abs(reached.mean(0) - q) < tol(q)), (layer, reached.mean(0), q)
        p_l = marg.no_reach_prob[layer - 1]
        assert abs((~reached.any(1)).mean() - p_l) < tol(p_l), (layer, p_l)


def test_straggler_ratio_under_participation_is_not_the_independent_product():
    """With a straggler set drawn each round clients are dependent; the exact p_l differs from
    the independent product, so the dynamic programme is needed (checked by sampling above)."""
    p = np.array([1.0, 0.7, 0.3, 0.1])
    model = BernoulliParticipation(StragglerRatio(4, 3, 0.5), p)
    marg = model.marginals(Workload(1.0, np.full(4, 2)))
    product = np.prod(1.0 - marg.reach_prob, axis=0)
    assert np.max(np.abs(product - marg.no_reach_prob)) > 0.01


def test_always_present_clients_keep_the_base_marginals():
    base = UniformDepth(3, 4)
    wrapped = BernoulliParticipation(base, np.ones(3))
    a, b = base.marginals(Workload(1.0, np.ones(3))), wrapped.marginals(Workload(1.0, np.ones(3)))
    assert np.allclose(a.reach_prob, b.reach_prob) and np.allclose(a.no_reach_prob, b.no_reach_prob)


def _bernoulli_rounds(probs, rounds, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((rounds, len(probs))) < np.asarray(probs)


def test_fedau_estimates_converge_to_true_probabilities_without_cutoff_effect():
    probs = [0.9, 0.5, 0.2, 0.05]
    estimator = FedAUEstimator(len(probs), cutoff=10_000)
    for present in _bernoulli_rounds(probs, 40_000):
        estimator.observe(present)
    estimate = estimator.probability()
    assert np.allclose(estimate, probs, rtol=0.05), estimate


def test_fedau_respects_the_cutoff():
    """With cutoff K no recorded interval exceeds K: the counter stays below K, estimates stay
    at or above 1/K and converge to the capped-geometric value p / (1 - (1-p)^K)."""
    probs, cutoff = np.array([0.5, 0.05, 0.01]), 5
    estimator = FedAUEstimator(3, cutoff=cutoff)
    for present in _bernoulli_rounds(probs, 40_000, seed=1):
        estimator.observe(present)
        assert estimator.counter.max() < cutoff
    estimate = estimator.probability()
    assert np.all(estimate >= 1.0 / cutoff - 1e-12)
    capped = probs / (1.0 - (1.0 - probs) ** cutoff)
    assert np.allclose(estimate, capped, rtol=0.05), (estimate, capped)
    assert estimate[2] > 3 * probs[2]  # the bias the cutoff trades for lower variance


def test_fedau_weight_is_computed_before_the_current_interval_is_recorded():
    estimator = FedAUEstimator(1, cutoff=100)
    seq = [True, False, False, True, True]
    weights = [float(estimator.observe(np.array([s]))[0]) for s in seq]
    # first participation: no interval yet -> 1; then interval 1 recorded; 2 absences; at the
    # next participation the mean of [1] is used, then 3 is recorded; then mean([1, 3]) = 2
    assert weights[0] == 1.0 and weights[3] == 1.0 and weights[4] == 2.0
    assert estimator.inverse_probability()[0] == pytest.approx((1 + 3 + 1) / 3)


def test_cohort_sampling_draws_exactly_k_clients_and_its_p_l_matches_simulation():
    """participation = "cohort": K of N clients per round, uniformly without replacement;
    p_l (the mean over cohorts of prod (1 - P[reach l])) agrees with 20,000 simulated rounds."""
    from fedhet.config import from_dict
    from fedhet.world import build_world

    config = from_dict(
        {
            "data": {"num_clients": 20},
            "system": {"model": "uniform-depth", "participation": "cohort", "cohort_size": 5},
        }
    )
    world = build_world(config)
    work = world.algorithm.plan(0, {}, world.system, config.round_deadline).workload()
    marginals = world.system.marginals(work)
    assert np.allclose(marginals.participation_prob, 5 / 20)
    rounds, no_reach = 20_000, np.zeros(world.flat.num_layers)
    for t in range(rounds):
        outcomes = world.system.sample(work, np.random.default_rng(t))
        assert outcomes.participates.sum() == 5
        for layer in range(world.flat.num_layers):
            no_reach[layer] += not np.any(outcomes.participates & (outcomes.depth <= layer + 1))
    assert np.allclose(no_reach / rounds, marginals.no_reach_prob, atol=0.01)
    # the product form of independent presence with p = K/N would be wrong by far more
    reach = marginals.reach_prob / 0.25  # P[reach l] given presence
    independent = np.prod(1 - 0.25 * reach, axis=0)
    assert abs(independent[0] - no_reach[0] / rounds) > 0.03


def test_cohort_sampling_refuses_a_straggler_set_drawn_each_round():
    from fedhet.config import from_dict
    from fedhet.errors import ConfigError
    from fedhet.world import build_world

    config = from_dict(
        {
            "data": {"num_clients": 20},
            "system": {"model": "straggler-ratio", "participation": "cohort", "cohort_size": 5},
        }
    )
    with pytest.raises(ConfigError, match="cohort"):
        build_world(config)
