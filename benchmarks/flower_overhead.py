"""Seconds per round: fedhet's embedded engine, fedhet on Flower's simulation runtime, and a
bare Flower app that sends every client the same model and gets it back untrained.

    python benchmarks/flower_overhead.py                 # quickstart and cnn2 / Fashion-MNIST
    python benchmarks/flower_overhead.py --rounds 20 --workloads quickstart

Per-round time is measured over rounds 2 to R-1 (start-up, the first round's warm-up and the
final evaluation excluded). What fedhet adds over the bare app is split into its
server side (planning, system model, aggregation, checkpoint and metrics: the round's time
outside waiting for replies) and the clients' round trip beyond the echo (their training,
bigger messages, client state); the clients' training alone is timed on the embedded engine.
fedhet evaluates only at the last round, which is not timed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

for _key, _value in {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}.items():
    os.environ.setdefault(_key, _value)

REPO = Path(__file__).resolve().parents[1]

WORKLOADS = {
    "quickstart": {
        "run": {"name": "bench-qs", "seed": 1, "threads": 1},
        "data": {"dataset": "digits", "partition": "iid", "num_clients": 20},
        "model": {"name": "mlp", "hidden": [32, 16]},
        "train": {"lr": 0.1, "batch_size": 16, "local_steps": 1},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.9, "deadline": 1.0},
        "algorithm": {"name": "salf"},
    },
    "cnn2-fmnist-30": {
        "run": {"name": "bench-cnn2", "seed": 1, "threads": 1},
        "data": {"dataset": "fmnist", "partition": "iid", "num_clients": 30},
        "model": {"name": "cnn2"},
        "train": {"lr": 0.05, "batch_size": 16, "local_steps": 1},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "salf"},
    },
}


def _config(workload: str, rounds: int, engine: str):
    from fedhet.config import from_dict

    document = {k: dict(v) for k, v in WORKLOADS[workload].items()}
    document["run"].update(rounds=rounds, eval_every=rounds, engine=engine)
    return from_dict(document)


class RoundTimer:
    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, row: dict) -> None:
        self.stamps.append(time.perf_counter())

    def per_round(self) -> float:
        """Rounds 2 .. R-1: no first-round warm-up, no final evaluation."""
        return (self.stamps[-2] - self.stamps[0]) / (len(self.stamps) - 2)


class ClientTime:
    """Wall time spent inside an engine's ``clients.run`` (the clients' work, as the server
    sees it), per round after the first."""

    def __init__(self, cls):
        self.cls, self.times = cls, []
        self.original = cls.run

        def run(clients, *args, **kwargs):
            start = time.perf_counter()
            out = list(self.original(clients, *args, **kwargs))  # a pool yields as it goes
            self.times.append(time.perf_counter() - start)
            return iter(out)

        cls.run = run

    def per_round(self) -> float:
        self.cls.run = self.original
        later = self.times[1:-1]
        return sum(later) / len(later)


def embedded(workload: str, rounds: int, out: Path) -> tuple[float, float]:
    """Seconds per round, and of those the clients' work."""
    from fedhet.engine.loop import RunLoop
    from fedhet.engine.pool import InProcessPool

    timer, clients = RoundTimer(), ClientTime(InProcessPool)
    RunLoop(_config(workload, rounds, "embedded"), out, on_round=timer).run(overwrite=True)
    return timer.per_round(), clients.per_round()


def on_flower(workload: str, rounds: int, out: Path, cpus: float) -> tuple[float, float]:
    """Seconds per round, and of those waiting for the clients' replies."""
    from fedhet.engine.flower import FlowerPool, run_simulation

    config = _config(workload, rounds, "flower")
    config.run.flower_cpus_per_client = cpus
    timer, clients = RoundTimer(), ClientTime(FlowerPool)
    run_simulation(config, out, overwrite=True, on_round=timer)
    return timer.per_round(), clients.per_round()


def bare_flower(workload: str, rounds: int, cpus: float) -> float:
    """A ServerApp that sends each client the model's arrays and a ClientApp that sends them
    straight back: Flower's own cost per round for the same clients and message sizes."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from fedhet.world import build_world

    config = _config(workload, rounds, "embedded")
    world = build_world(config)
    params = world.initial_params.numpy()
    stamps: list[float] = []
    server, client = ServerApp(), ClientApp()

    @client.train()
    def echo(msg: Message, context) -> Message:
        return Message(RecordDict({"arrays": msg.content["arrays"], "meta": ConfigRecord({"n": 1})}),
                       reply_to=msg)  # fmt: skip

    @server.main()
    def main(grid, context) -> None:
        nodes = list(grid.get_node_ids())
        while len(nodes) < config.data.num_clients:
            time.sleep(0.5)
            nodes = list(grid.get_node_ids())
        for _ in range(rounds):
            messages = [
                Message(RecordDict({"arrays": ArrayRecord({"params": Array(params)})}), node, "train")
                for node in nodes
            ]
            replies = list(grid.send_and_receive(messages))
            assert len(replies) == len(nodes)
            stamps.append(time.perf_counter())

    backend = {"client_resources": {"num_cpus": cpus, "num_gpus": 0.0},
               "init_args": {"log_to_driver": False, "include_dashboard": False}}  # fmt: skip
    for name in ("flwr", "ray"):
        logging.getLogger(name).setLevel(logging.ERROR)
    run_simulation(server, client, num_supernodes=config.data.num_clients, backend_config=backend)
    return (stamps[-2] - stamps[0]) / (len(stamps) - 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"cores: {os.cpu_count()}, torch threads: {torch.get_num_threads()}, "
          f"flower: {args.cpus_per_client} CPU per client, {args.rounds} rounds")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for workload in args.workloads:
            emb, emb_clients = embedded(workload, args.rounds, tmp / f"{workload}-embedded")
            fl, fl_clients = on_flower(
                workload, args.rounds, tmp / f"{workload}-flower", args.cpus_per_client
            )
            bare = bare_flower(workload, args.rounds, args.cpus_per_client)
            server = fl - fl_clients  # fedhet's server side: plan, aggregate, checkpoint, metrics
            exchange = fl_clients - bare  # the clients' round trip beyond bare Flower's echo
            print(
                f"{workload}: embedded {emb:.3f} s/round (clients' training {emb_clients:.3f}) | "
                f"fedhet on Flower {fl:.3f} s/round | bare Flower {bare:.3f} s/round\n"
                f"  fedhet adds {fl - bare:+.3f} s/round ({100 * (fl - bare) / bare:+.0f}% of bare Flower): "
                f"server side {server:.3f} s ({100 * server / bare:.0f}%), clients' round trip beyond "
                f"the echo {exchange:+.3f} s ({100 * exchange / bare:+.0f}%; their training alone takes "
                f"{emb_clients:.3f} s in one process)"
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
