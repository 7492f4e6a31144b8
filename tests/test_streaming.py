"""Streaming aggregation: a rule that sums updates as they arrive gives exactly what its
list aggregation gives, holds one running sum, and a subclass that overrides ``aggregate``
alone is aggregated from the list."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms import ALGORITHMS, RoundContext, RoundPlan
from fedhet.algorithms.base import ClientAssignment
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.streaming import ListAggregator, WeightedSumAggregator
from fedhet.config import TrainConfig, build_options
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models import FlatModel, build_model
from fedhet.system import Marginals, Outcomes

LAYOUT = FlatModel(build_model("mlp", (1, 8, 8), 10, [16, 8])).layout
SIZE = LAYOUT.param_slices.bounds[-1][1]
L = len(LAYOUT.param_slices.bounds)


def _round(depths: list[int], sizes: list[int]):
    generator = torch.Generator().manual_seed(0)
    updates = []
    for client, depth in enumerate(depths):
        start = LAYOUT.param_slices.start(depth) if depth <= L else SIZE
        delta = torch.randn(SIZE - start, generator=generator)
        updates.append(ClientUpdate(client, Coverage(depth), 1, sizes[client], 0.5, delta))
    n = len(depths)
    plan = RoundPlan(0, 1.0, 0.1, [ClientAssignment(16, 1)] * n)
    outcomes = Outcomes(np.ones(n, bool), np.array(depths), np.ones(n), np.ones(n))
    no_reach = np.linspace(0.3, 0.0, L)
    marginals = Marginals(np.full((n, L), 0.5), no_reach, np.ones(n))
    context = RoundContext(plan, outcomes, marginals, n, L, client_sizes=np.array(sizes))
    tasks = [ClientTask(0, c, 0.1, 16, 1, Coverage(d)) for c, d in enumerate(depths)]
    return updates, context, tasks


@pytest.mark.parametrize(
    ("name", "options", "depths"),
    [
        ("fedavg", {}, [1, 1, 1, 1]),
        ("fedavg", {"weights": "samples", "server_lr": 0.7}, [1, 1, 1, 1]),
        ("fedprox", {"mu": 0.1}, [1, 1, 1]),
        ("salf", {}, [1, 2, 3, 4, 2]),
        ("salf", {"normalize": "all"}, [3, 2, 4, 1]),
        ("adel-fl", {}, [4, 3, 1]),
    ],
)
def test_streaming_equals_the_list_bit_for_bit(name, options, depths):
    rule = ALGORITHMS[name](build_options(name, options), TrainConfig())
    updates, context, tasks = _round(depths, [30, 50, 20, 40, 10][: len(depths)])
    params, buffers = torch.randn(SIZE, generator=torch.Generator().manual_seed(1)), torch.zeros(0)
    aggregator = rule.aggregator(params, buffers, tasks, {}, context, LAYOUT)
    assert aggregator.streams and not isinstance(aggregator, ListAggregator)
    for update in updates:
        aggregator.add(update)
    streamed, _ = aggregator.result()
    listed, _ = rule.aggregate(params, buffers, updates, {}, context, LAYOUT)
    assert torch.equal(streamed, listed)


def test_a_missing_update_renormalises_to_the_ones_that_arrived():
    rule = FedAvg(build_options("fedavg", {"weights": "samples"}), TrainConfig())
    updates, context, tasks = _round([1, 1, 1, 1], [30, 50, 20, 40])
    params = torch.zeros(SIZE)
    aggregator = rule.aggregator(params, torch.zeros(0), tasks, {}, context, LAYOUT)
    for update in updates[:3]:  # the fourth client's update never arrives (skipped or failed)
        aggregator.add(update)
    streamed, _ = aggregator.result()
    listed, _ = rule.aggregate(params, torch.zeros(0), updates[:3], {}, context, LAYOUT)
    assert torch.allclose(streamed, listed, atol=1e-6)


def test_a_subclass_that_overrides_aggregate_alone_gets_the_list():
    class Trimmed(FedAvg):
        def aggregate(self, params, buffers, updates, state, context, layout):
            return super().aggregate(params, buffers, updates[1:], state, context, layout)

    updates, context, tasks = _round([1, 1, 1], [10, 10, 10])
    rule = Trimmed(build_options("fedavg", {}), TrainConfig())
    aggregator = rule.aggregator(torch.zeros(SIZE), torch.zeros(0), tasks, {}, context, LAYOUT)
    assert isinstance(aggregator, ListAggregator)
    amsfl = ALGORITHMS["amsfl"](build_options("amsfl", {"round_budget": 1.0}), TrainConfig())
    assert isinstance(
        amsfl.aggregator(torch.zeros(SIZE), torch.zeros(0), tasks, {}, context, LAYOUT), ListAggregator
    )


def test_the_running_sum_holds_no_update():
    updates, context, tasks = _round([1, 1], [10, 10])
    aggregator = WeightedSumAggregator(torch.zeros(SIZE), torch.zeros(0), lambda u: 1.0, 2.0)
    for update in updates:
        aggregator.add(update)
    held = [v for v in vars(aggregator).values() if isinstance(v, ClientUpdate | list)]
    assert held == []
