"""Goal: on SALF's Table II CNN workload, the embedded engine runs >= 20x faster than a plain
Flower simulation app doing the same training.

The workload: cnn2 on Fashion-MNIST, 30 IID clients, one SGD step of batch 16 per client per
round (lr 0.1), every client every round, FedAvg. The plain Flower app is what a Flower user
writes: a ClientApp that loads the model's arrays into a PyTorch cnn2, takes one step on a
batch of its partition and sends the arrays back, and Flower's own FedAvg strategy
(``flwr.serverapp.strategy.FedAvg``) on the Ray simulation runtime, 1 CPU per client. The
embedded engine runs the same configuration (and, for reference, SALF with 90% stragglers,
whose stragglers compute less), with ``run.workers`` 1 and 2. Both: one torch thread per
client process; time per round over rounds 2..R, no evaluation. Each block is one run in a
fresh child process; the blocks rotate (A B C ..., B C ... A, ...) for ``--pairs`` passes and
each ratio is the median of the per-pass ratios.

    python benchmarks/flower_speed.py [--rounds 10] [--pairs 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUIET_FLOWER, machine_header, with_workers  # noqa: E402

for _key, _value in QUIET_FLOWER.items():
    os.environ.setdefault(_key, _value)

CLIENTS, BATCH, LR = 30, 16, 0.1


def config(rounds: int, salf: bool = False, memory_format: str = "contiguous"):
    from fedhet.config import from_dict

    system = (
        {"model": "straggler-ratio", "straggler_ratio": 0.9, "deadline": 1.0} if salf else {"model": "full"}
    )
    return from_dict(
        {
            "run": {
                "name": "flower-speed",
                "seed": 1,
                "rounds": rounds,
                "eval_every": rounds,
                "threads": 1,
                "memory_format": memory_format,
            },  # fmt: skip
            "data": {"dataset": "fmnist", "partition": "iid", "num_clients": CLIENTS},
            "model": {"name": "cnn2"},
            "train": {"lr": LR, "batch_size": BATCH, "local_steps": 1},
            "system": system,
            "algorithm": {"name": "salf" if salf else "fedavg"},
        }
    )


def embedded(rounds: int, salf: bool, memory_format: str = "contiguous", workers: int = 1) -> float:
    from fedhet.engine.loop import RunLoop

    stamps: list[float] = []
    run_config = with_workers(config(rounds, salf, memory_format), workers)
    with tempfile.TemporaryDirectory() as out:
        RunLoop(run_config, out, on_round=lambda row: stamps.append(time.perf_counter())).run()
    return (stamps[-2] - stamps[0]) / (len(stamps) - 2)  # the last round also evaluates


_CLIENT_DATA: dict = {}


def _client_side(partition: int):
    """The client's model and data, built once per Ray worker process."""
    import numpy as np
    import torch

    from fedhet.data import load_dataset, partition_indices
    from fedhet.models import build_model

    if "data" not in _CLIENT_DATA:
        torch.set_num_threads(1)
        dataset = load_dataset("fmnist")
        parts = partition_indices(dataset.y_train.numpy(), CLIENTS, "iid", np.random.default_rng(1))
        _CLIENT_DATA.update(data=dataset, parts=parts, model=build_model("cnn2", (1, 28, 28), 10))
    return _CLIENT_DATA["model"], _CLIENT_DATA["data"], _CLIENT_DATA["parts"][partition]


def plain_flower(rounds: int) -> float:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from fedhet.models import build_model

    client, server = ClientApp(), ServerApp()
    stamps: list[float] = []

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        model, data, indices = _client_side(int(context.node_config["partition-id"]))
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.train()
        rng = np.random.default_rng(int(context.node_id) % 2**32 + int(msg.content["config"]["server-round"]))
        chosen = indices[rng.choice(len(indices), BATCH, replace=False)]
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        optimizer.zero_grad()
        F.cross_entropy(model(data.x_train[chosen]), data.y_train[chosen]).backward()
        optimizer.step()
        content = RecordDict(
            {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": BATCH})}
        )
        return Message(content=content, reply_to=msg)

    class TimedFedAvg(FedAvg):
        def aggregate_train(self, server_round, replies):
            out = super().aggregate_train(server_round, replies)
            stamps.append(time.perf_counter())
            return out

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = TimedFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=CLIENTS,
                               min_available_nodes=CLIENTS)  # fmt: skip
        model = build_model("cnn2", (1, 28, 28), 10)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds)

    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"log_to_driver": False, "include_dashboard": False}}  # fmt: skip
    for name in ("flwr", "ray"):
        logging.getLogger(name).setLevel(logging.ERROR)
    run_simulation(server, client, num_supernodes=CLIENTS, backend_config=backend)
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


SIDES = {
    # name: (what, run.workers, salf, memory_format)
    "plain Flower app (Ray), FedAvg": ("flower", 1, False, "contiguous"),
    "embedded FedAvg, workers 1": ("embedded", 1, False, "contiguous"),
    "embedded FedAvg, workers 2": ("embedded", 2, False, "contiguous"),
    "embedded FedAvg, workers 2, channels_last": ("embedded", 2, False, "channels_last"),
    "embedded SALF 90%, workers 2": ("embedded", 2, True, "contiguous"),
}


def child_block(args) -> int:
    """One block in this (child) process; prints its seconds per round as JSON."""
    import json

    import torch

    torch.set_num_threads(1)
    what, workers, salf, memory_format = SIDES[args.side]
    with tempfile.TemporaryDirectory() as home:
        os.environ.setdefault("FLWR_HOME", home)
        if what == "flower":
            per_round = plain_flower(args.rounds)
        else:
            per_round = embedded(args.rounds, salf, memory_format, workers)
    print(json.dumps({"per_round": per_round}))
    return 0


def block(side: str, rounds: int) -> float:
    import json
    import subprocess

    command = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--rounds", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["per_round"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return child_block(args)
    from _common import describe_ratio, ratio, rotate

    print(machine_header(f"{args.rounds} rounds per block; Flower: 1 CPU per client on Ray"))
    times, before, after = rotate(
        {name: (lambda n=name: block(n, args.rounds)) for name in SIDES}, args.pairs
    )
    flower = next(iter(SIDES))
    for name in list(SIDES)[1:]:
        print(describe_ratio(f"{name} vs {flower} (Flower s/round / embedded)",
                             ratio(times[flower], times[name], (before, after))))  # fmt: skip
    print("goal: >= 20x on the same training (FedAvg)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
