"""Per-layer bias and spread of SALF's aggregation (SALF eq. (9)) by Monte-Carlo, for the
system models of the persistent-stragglers study.

    python experiments/salf_bias.py [--draws 4000] [--layers 3] [--seed 1]

Each draw is one round as the engine plays it: the algorithm plans, the system model samples
every client's depth (``sample``) and gives its marginals, the algorithm turns outcomes into
tasks (``client_task``), and ``SALF.aggregate`` aggregates one update per task. Client u's
update is the indicator of u on every layer it reached (a layout of L layers of U elements
each), so element u of layer l of the aggregated step is the weight w_u^l the rule gave u.
The target, FedAvg over all U clients with full updates, weighs every client 1/U; a rule is
unbiased for every choice of client updates iff E[U w_u^l] = 1 for every u and l.

Printed per setting, rule and layer (input layer first): ``mass`` = mean over clients of
E[U w_u^l] (the share of the target step's size the layer gets on average), ``min``/``max``
over clients of E[U w_u^l] (unequal weighting of clients: with persistent client
differences, a bias that does not average out over rounds), and ``noise`` = the mean over
clients of E[(U w_u^l)^2]: how many times the variance that independent noise in the
clients' updates (their minibatches) adds to the step exceeds the target's (1 when every
client reaches the layer; that target variance itself scales as 1 / U).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from fedhet import seeding
from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.base import RoundContext
from fedhet.config import from_dict
from fedhet.messages import ClientUpdate
from fedhet.models.layers import LayerSlices, ModelLayout
from fedhet.registry import resolve
from fedhet.world import build_system

RULES = ("reached", "inverse-reach", "all")

# The system sections of the persistent-stragglers study (experiments/salf_persistent.toml).
SETTINGS = {
    "random 90%, depth >= 2 (Table II)": {
        "model": "straggler-ratio",
        "straggler_ratio": 0.9,
        "deadline": 1.0,
    },
    "fixed 90%, depth >= 2": {
        "model": "straggler-ratio",
        "straggler_ratio": 0.9,
        "fixed_stragglers": True,
        "deadline": 1.0,
    },
    "fixed 90%, depth >= 1": {
        "model": "straggler-ratio",
        "straggler_ratio": 0.9,
        "fixed_stragglers": True,
        "straggler_min_depth": 1,
        "deadline": 1.0,
    },
    "capabilities U(0.2, 1.8)": {
        "model": "exponential",
        "capability_profile": "uniform",
        "capability_low": 0.2,
        "capability_high": 1.8,
        "deadline": 1.0,  # time_per_sample_layer = 1 / (16 L): a full pass takes it at P_u = 1
    },
}


def client_weights(system_section: dict, rule: str, clients: int, layers: int, draws: int, seed: int):
    """(draws x L x U) array of U w_u^l: the weight SALF's ``rule`` gave client u on layer l,
    scaled so that the target (every client 1/U) is 1."""
    if system_section["model"] == "exponential":  # batch 16, L layers: a full pass is the deadline at P_u = 1
        system_section = {**system_section, "time_per_sample_layer": 1 / (16 * layers)}
    config = from_dict({
        "run": {"name": "bias", "seed": seed},
        "data": {"dataset": "digits", "num_clients": clients},
        "train": {"batch_size": 16, "local_steps": 1},
        "system": system_section,
        "algorithm": {"name": "salf", "normalize": rule},
    })  # fmt: skip
    system = build_system(config, clients, layers)
    entry = resolve("algorithm", "salf", "algorithm.name")
    algorithm = entry.cls.build(config.algorithm.options, AlgorithmContext(config.train))
    bounds = tuple((layer * clients, (layer + 1) * clients) for layer in range(layers))
    slices = LayerSlices(bounds)
    layout = ModelLayout(slices, LayerSlices(tuple((0, 0) for _ in range(layers))), ())
    params, buffers = torch.zeros(layers * clients), torch.zeros(0)
    out = np.zeros((draws, layers, clients))
    state: dict = {}
    for t in range(1, draws + 1):
        plan = algorithm.planner.plan(t, state, system, config.round_deadline)
        work = plan.workload()
        outcomes = system.sample(work, seeding.round_stream(seed, "system", t))
        context = RoundContext(plan, outcomes, system.marginals(work), clients, layers)
        updates = []
        for u in range(clients):
            task = algorithm.planner.client_task(context, u, state) if outcomes.participates[u] else None
            if task is None:
                continue
            depth = task.coverage.depth
            delta = torch.zeros((layers + 1 - depth) * clients)
            delta[u::clients] = 1.0  # client u's own element of every layer it reached
            updates.append(ClientUpdate(u, task.coverage, 1, 1, 0.0, delta))
        new, _ = algorithm.aggregation.aggregate(params, buffers, updates, state, context, layout)
        out[t - 1] = clients * new.view(layers, clients).double().numpy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000, help="rounds simulated per setting")
    parser.add_argument("--layers", type=int, default=3, help="L (3: the MLP, 4: the CNN)")
    parser.add_argument("--clients", type=int, nargs="+", default=[30, 10], help="U")
    parser.add_argument("--seed", type=int, default=1, help="run.seed (draws the straggler set)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"L = {args.layers}, {args.draws} rounds per setting, seed {args.seed}")
    print("E[U w_u^l] per layer (input first): mass (mean over clients) (min..max over clients) noise")
    for clients in args.clients:
        for name, section in SETTINGS.items():
            print(f"\n### U = {clients}, {name}\n")
            print("| rule | " + " | ".join(f"layer {layer}" for layer in range(1, args.layers + 1)) + " |")
            print("|---|" + "---|" * args.layers)
            for rule in RULES:
                w = client_weights(section, rule, clients, args.layers, args.draws, args.seed)
                mean, square = w.mean(axis=0), (w**2).mean(axis=0)  # L x U
                cells = [
                    f"{m.mean():.2f} ({m.min():.2f}..{m.max():.2f}) x{q.mean():.2f}"
                    for m, q in zip(mean, square, strict=True)
                ]
                print(f"| {rule} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
