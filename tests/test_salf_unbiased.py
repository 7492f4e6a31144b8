"""SALF's layer-wise rule is an unbiased estimate of full FedAvg (SALF Lemma 2, ADEL-FL
Lemma 2): for fixed client updates, the Monte-Carlo mean over outcome draws of the
aggregated model equals the FedAvg model, layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms import ALGORITHMS, RoundContext, RoundPlan
from fedhet.config import TrainConfig, build_options
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models.layers import LayerSlices, ModelLayout
from fedhet.system import ExponentialLayers, StragglerRatio, UniformDepth, Workload

U, L = 5, 4
LAYER_SIZES = (3, 2, 4, 2)
DRAWS = 12000


def _layout():
    bounds, off = [], 0
    for n in LAYER_SIZES:
        bounds.append((off, off + n))
        off += n
    return ModelLayout(LayerSlices(tuple(bounds)), LayerSlices(tuple((0, 0) for _ in LAYER_SIZES)))


def _monte_carlo(system, options, deadline=1.0, seed=0):
    layout = _layout()
    gen = torch.Generator().manual_seed(seed)
    params = torch.randn(layout.num_params, generator=gen)
    deltas = torch.randn(U, layout.num_params, generator=gen)
    algorithm = ALGORITHMS["salf"](build_options("salf", options), TrainConfig())
    batch = np.ones(U, dtype=int)
    plan = RoundPlan(0, deadline, 0.1, [])
    marg = system.marginals(Workload(deadline, batch))
    rng = np.random.default_rng(seed)
    results = torch.zeros(DRAWS, layout.num_params)
    empty = torch.zeros(0)
    for i in range(DRAWS):
        out = system.sample(Workload(deadline, batch), rng)
        updates = [
            ClientUpdate(
                u, Coverage(int(d)), 1, 1, 0.0, deltas[u, layout.param_slices.start(int(d)) :], empty
            )
            for u, d in enumerate(out.depth)
        ]
        context = RoundContext(plan, out, marg, U, L)
        results[i], _ = algorithm.aggregate(params, empty, updates, {}, context, layout)
    fedavg = params + deltas.mean(0)
    mean = results.mean(0)
    stderr = results.std(0) / np.sqrt(DRAWS)
    return mean, fedavg, stderr


SYSTEMS = {
    "uniform-depth": UniformDepth(U, L),
    "exponential": ExponentialLayers(U, L, np.ones(U), time_per_sample_layer=0.45),
    "straggler-ratio": StragglerRatio(U, L, 0.6),
    "straggler-ratio-all": StragglerRatio(U, L, 1.0, min_depth=1),  # min_depth 2 never reaches layer 1
}


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_salf_aggregate_is_unbiased(name):
    mean, fedavg, stderr = _monte_carlo(SYSTEMS[name], {})
    assert torch.all((mean - fedavg).abs() <= 4.5 * stderr + 1e-4), (mean - fedavg, stderr)


def test_without_bias_correction_the_shallow_layers_are_biased():
    """Control: dropping the 1/(1 - p_l) factor shrinks the first layer's expected step."""
    system = UniformDepth(U, L)
    mean, fedavg, stderr = _monte_carlo(system, {"bias_correction": False})
    first = _layout().param_slices.of(1)
    gap = (mean - fedavg)[first].abs()
    assert torch.any(gap > 6 * stderr[first]), (gap, stderr[first])


def test_layers_nobody_reached_are_kept_and_all_normalisation_divides_by_u():
    layout = _layout()
    params = torch.zeros(layout.num_params)
    deltas = torch.ones(U, layout.num_params)
    depth = np.array([3, 4, 5, 5, 5])  # only layers 3..4 reached, by 1 and 2 clients
    out_cls = UniformDepth(U, L)
    out = out_cls.sample(Workload(1.0, np.ones(U)), np.random.default_rng(0))
    out.depth = depth
    updates = [
        ClientUpdate(
            u, Coverage(int(d)), 1, 1, 0.0, deltas[u, layout.param_slices.start(int(d)) :], torch.zeros(0)
        )
        for u, d in enumerate(depth)
    ]
    context = RoundContext(
        RoundPlan(0, 1.0, 0.1, []), out, out_cls.marginals(Workload(1.0, np.ones(U))), U, L
    )
    for normalize, expected in (("reached", None), ("all", [0, 0, 1 / U, 2 / U])):
        algorithm = ALGORITHMS["salf"](build_options("salf", {"normalize": normalize}), TrainConfig())
        new, _ = algorithm.aggregate(params, torch.zeros(0), updates, {}, context, layout)
        for layer in (1, 2):
            assert torch.all(new[layout.param_slices.of(layer)] == 0)
        if expected:
            for layer in (3, 4):
                assert torch.allclose(new[layout.param_slices.of(layer)], torch.tensor(expected[layer - 1]))
        else:
            p = context.marginals.no_reach_prob
            for layer in (3, 4):
                assert torch.allclose(
                    new[layout.param_slices.of(layer)],
                    torch.tensor(1 / (1 - p[layer - 1]), dtype=torch.float32),
                )
