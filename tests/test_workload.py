"""System models price the whole plan: local steps cost time (K steps cost K times one),
every model reports whole steps done by the deadline, and the marginals P[steps_done >= k],
P[reach l] match sampled frequencies."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import gammainc

from fedhet.system import (
    BernoulliParticipation,
    ExponentialLayers,
    NoStragglers,
    PerStepCost,
    StragglerRatio,
    UniformDepth,
    Workload,
)

U, L, DRAWS = 4, 3, 20000
CAPS = np.array([0.5, 0.8, 1.2, 1.5])


def _work(deadline=1.0, steps=(1, 2, 3, 5)):
    return Workload(deadline, np.full(U, 2), np.array(steps))


MODELS = {
    "uniform-depth": UniformDepth(U, L),
    "straggler-ratio": StragglerRatio(U, L, 0.5),
    "exponential": ExponentialLayers(U, L, CAPS, time_per_sample_layer=0.05),
    "per-step": PerStepCost(U, L, CAPS, time_per_sample_step=0.1, comm_time=0.1, jitter=0.5),
    "per-step+bernoulli": BernoulliParticipation(
        PerStepCost(U, L, CAPS, time_per_sample_step=0.1, comm_time=0.1, jitter=0.5),
        np.array([1, 0.7, 0.5, 0.2]),
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_sampled_steps_and_depths_match_the_marginals(name):
    model, work = MODELS[name], _work()
    rng = np.random.default_rng(1)
    draws = [model.sample(work, rng) for _ in range(DRAWS)]
    present = np.stack([d.participates for d in draws])
    steps = np.stack([d.steps_done for d in draws]) * present
    depth = np.where(present, np.stack([d.depth for d in draws]), L + 1)
    marg = model.marginals(work)
    for k in range(1, work.max_steps + 1):
        freq = (steps >= k).mean(0)
        assert np.allclose(freq, marg.step_prob[:, k - 1], atol=0.015), (k, freq, marg.step_prob[:, k - 1])
    for layer in range(1, L + 1):
        assert np.allclose((depth <= layer).mean(0), marg.reach_prob[:, layer - 1], atol=0.015)
    assert np.all(steps <= work.local_steps)
    # finishing everything is one event in both readings
    assert np.array_equal((steps == work.local_steps) & present, (depth == 1) & present)


def test_exponential_steps_are_poisson_counts_of_layer_steps():
    """K steps over L layers: N ~ Poisson(T / mean); steps_done >= k iff N >= k L, depth
    reaches l iff N >= K (L + 1 - l); at K = 1 this is ADEL-FL's Lemma 1."""
    model = ExponentialLayers(U, L, CAPS, time_per_sample_layer=0.05)
    work = _work(deadline=0.6, steps=(1, 2, 4, 4))
    rate = 0.6 / model.mean_layer_time(work.batch_sizes)
    marg = model.marginals(work)
    assert np.allclose(marg.step_prob[:, 0], gammainc(L, rate))
    assert np.allclose(marg.reach_prob[:, 0], gammainc(work.local_steps * L, rate))
    assert np.allclose(marg.reach_prob[0], gammainc(L + 1 - np.arange(1, L + 1), rate[0]))  # K = 1


def test_local_steps_cost_time():
    """Without a deadline the models with a time law charge K steps K times one step (the
    depth-only models take their depth law as given for the work asked, see outcomes.py)."""
    rng = np.random.default_rng(0)
    per_step = PerStepCost(U, L, CAPS, time_per_sample_step=0.1, comm_time=0.3)
    one, five = (per_step.sample(Workload(None, np.full(U, 2), np.full(U, k)), rng) for k in (1, 5))
    c = per_step.step_time(np.full(U, 2))
    assert np.allclose(one.finish_time, c + 0.3) and np.allclose(five.finish_time, 5 * c + 0.3)
    exponential = ExponentialLayers(U, L, CAPS, time_per_sample_layer=0.05)
    mean = exponential.mean_layer_time(np.full(U, 2))
    times = np.stack(
        [
            exponential.sample(Workload(None, np.full(U, 2), np.full(U, 3)), rng).finish_time
            for _ in range(4000)
        ]
    )
    assert np.allclose(times.mean(0), 3 * L * mean, rtol=0.05)
    full = NoStragglers(U, L).sample(_work(), rng)
    assert np.array_equal(full.steps_done, _work().local_steps)


def test_per_step_clients_deliver_the_steps_they_finished():
    """t_i steps finish at c_i t_i + b_i: with no jitter the steps done by the deadline are
    floor((T - b_i) / c_i), capped at K."""
    model = PerStepCost(U, L, CAPS, time_per_sample_step=0.1, comm_time=0.2)
    work = Workload(1.0, np.full(U, 2), np.full(U, 5))
    out = model.sample(work, np.random.default_rng(0))
    c = model.step_time(work.batch_sizes)
    expected = np.minimum(np.floor((1.0 - 0.2) / c + 1e-9), 5).astype(int)
    assert out.steps_done.tolist() == expected.tolist() == [2, 3, 4, 5]
    assert np.allclose(out.finish_time, np.minimum(5 * c + 0.2, 1.0))
    marg = model.marginals(work)
    assert marg.step_prob.tolist() == [[1.0 if k <= e else 0.0 for k in range(1, 6)] for e in expected]
