"""FedRA (Shangchao Su, Bin Li, Xiangyang Xue, "FedRA: A Random Allocation Strategy for
Federated Tuning to Unleash the Power of Heterogeneous Clients", ECCV 2024, arXiv
2311.11227): each round every client gets a random subset of the model's blocks, as many as
its resources allow, runs a model made of those blocks alone (the others skipped in its
forward pass) and fine-tunes their adapters; the server averages each block's parameters
over the clients that had it.

For client k in round t, with K skippable blocks (a transformer's; the embedding and the
head always run): a random order of the blocks is drawn from a stream of (run, round,
client), S_k(j) its first j blocks, and the client gets the largest j whose work fits the
deadline by the planner's estimate of its full-work time (``planner_knowledge``), the work
priced in FLOPs with the blocks outside S_k(j) not run (:func:`fedhet.models.cost.
sub_model_step_share`; the blocks alike, j of them cost the same whichever they are); a
client no j fits is not asked, and one whose drawn time then
misses the deadline delivers nothing. Each parameter element is averaged over the clients
whose blocks held it (HeteroFL's ``held`` aggregation); elements nobody trained keep their
value. With a model whose every block is run (no deadline, or all fit) it is FedAvg.

FedRA's paper sizes a client's share from its device's memory; fedhet's devices are limited
by time, so "allows" reads as the deadline, as HeteroFL's widths do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedhet import seeding
from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.heterofl import HeteroFLAggregation
from fedhet.algorithms.sub_models import (
    KNOWLEDGE,
    KnowledgePlanner,
    LateSubModelsReporting,
    PlansFromKnowledge,
    fitting_level,
    knowledge_state,
    largest_fitting,
)
from fedhet.checks import one_of
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage
from fedhet.models.cost import sub_model_step_share


@dataclass
class FedRAOptions:
    """``planner_knowledge``: what the server knows of a client's time when it sizes its
    share of the blocks; ``seed``: the allocations' stream (of (seed, round, client): a
    rule's server part does not see the run's seed, so runs of one setting share it)."""

    planner_knowledge: str = "history"
    seed: int = 0

    aggregate = "held"  # HeteroFL's aggregation: each element over the clients holding it

    def validate(self) -> None:
        one_of("algorithm.planner_knowledge", self.planner_knowledge, KNOWLEDGE)


def allocation(skippable: tuple, order: np.ndarray, count: int) -> int:
    """The bit set of the layers a client runs: every layer that cannot be skipped and the
    first ``count`` of the skippable ones in ``order``."""
    layers = sum(1 << i for i, skip in enumerate(skippable) if not skip)
    for index in order[:count]:
        layers |= 1 << int(index)
    return layers


class FedRAPlanner(KnowledgePlanner):
    """FedRA's planner: each client's random blocks, as many as fit its deadline."""

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        skippable = tuple(state["fedra_skippable"])
        blocks = np.flatnonzero(skippable)
        rng = seeding.round_stream(self.options.seed, f"fedra-{client}", int(context.plan.round))
        order = rng.permutation(blocks)
        shares = {j + 1: float(price) for j, price in enumerate(state["fedra_prices"])}

        def choose(estimate: float, deadline: float | None):
            return largest_fitting(shares, estimate, deadline)

        count = fitting_level(context, client, choose, lambda j: shares[j], state)
        if count is None:
            return None
        plan = context.plan
        layers = allocation(skippable, order, count)
        coverage = Coverage() if count == len(blocks) else Coverage(_lowest(layers), 1.0, 0, 0, layers)
        task = self.make_task(plan, client, plan.assignments[client].local_steps, coverage, state)
        return replace(task, work_share=float(shares[count]))


def _lowest(layers: int) -> int:
    """The lowest layer (1-based) of a bit set."""
    return (layers & -layers).bit_length()


class FedRAAggregation(HeteroFLAggregation):
    """HeteroFL's ``held`` aggregation over the layers each update covers."""

    def init_state(self, setting) -> dict:
        skippable = tuple(setting.layout.skippable)
        if not any(skippable):
            raise ConfigError(
                "algorithm 'fedra' allocates blocks a client runs without the others: it needs a model "
                "with residual blocks that keep their input's shape (model.name = 'transformer')"
            )
        blocks = np.flatnonzero(skippable)
        prices = [self.price(setting, allocation(skippable, blocks, j)) for j in range(1, len(blocks) + 1)]
        return {"fedra_skippable": list(skippable), "fedra_prices": prices, **knowledge_state(setting)}

    @staticmethod
    def price(setting, layers: int) -> float:
        """A client's training step with the layers ``layers`` as a share of the full
        model's; the blocks being alike, j blocks cost the same whichever they are (priced
        with the first j)."""
        layout, mads = setting.layout, list(setting.layer_multiply_adds)
        if layers == (1 << layout.num_layers) - 1 or not mads:
            return (
                1.0 if layers == (1 << layout.num_layers) - 1 else bin(layers).count("1") / layout.num_layers
            )
        return sub_model_step_share(layout, mads, 1.0, 0, _lowest(layers), layers)


@register
class FedRA(PlansFromKnowledge, Algorithm):
    """Each client runs and trains a random subset of the blocks, as many as fit its
    deadline; each element is averaged over the clients that had it (the module's rule)."""

    name = "fedra"
    summary = "FedRA: each client runs and tunes a random subset of the blocks its deadline allows"
    Options = FedRAOptions
    supports_channels_last = False
    Planner = FedRAPlanner
    Aggregation = FedRAAggregation
    Reporting = LateSubModelsReporting
