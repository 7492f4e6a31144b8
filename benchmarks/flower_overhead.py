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

Each block is one run in a fresh child process; per workload the three runs rotate
(embedded, fedhet on Flower, bare Flower; then fedhet on Flower, bare Flower, embedded; ...)
for --pairs passes, and every share of bare Flower's round is the median of the per-pass
shares, with min-max and the machine's load before and after (benchmarks/_common.py).

    python benchmarks/flower_overhead.py --rounds 12 --pairs 5
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUIET_FLOWER, machine_header, ratio, rotate  # noqa: E402

for _key, _value in QUIET_FLOWER.items():
    os.environ.setdefault(_key, _value)

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


def _config(workload: str, rounds: int, engine: str, **run):
    from fedhet.config import from_dict

    document = {k: dict(v) for k, v in WORKLOADS[workload].items()}
    document["run"].update(rounds=rounds, eval_every=rounds, engine=engine, **run)
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

    config = _config(workload, rounds, "flower", flower_cpus_per_client=cpus)
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


def child_block(args) -> int:
    """One run in this (child) process; prints its figures as JSON."""
    import json

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("FLWR_HOME", tmp)
        out = Path(tmp) / "run"
        if args.side == "embedded":
            per_round, clients = embedded(args.workload, args.rounds, out)
        elif args.side == "flower":
            per_round, clients = on_flower(args.workload, args.rounds, out, args.cpus_per_client)
        else:
            per_round, clients = bare_flower(args.workload, args.rounds, args.cpus_per_client), 0.0
    print(json.dumps({"per_round": per_round, "clients": clients}))
    return 0


def block(side: str, workload: str, args, figures: dict):
    def run_once() -> float:
        import json
        import subprocess

        command = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--workloads", workload,
                   "--rounds", str(args.rounds), "--cpus-per-client", str(args.cpus_per_client)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{side} {workload} failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        figures.setdefault(side, []).append(result)
        return result["per_round"]

    return run_once


def _spread(values: list[float]) -> str:
    """median (min-max) of per-pass percentages."""
    return f"{statistics.median(values):+.0f}% ({min(values):+.0f} to {max(values):+.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=5, help="passes over the three runs (>= 5 for a figure)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    parser.add_argument("--side", choices=["embedded", "flower", "bare"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        args.workload = args.workloads[0]
        return child_block(args)
    print(machine_header(f"torch threads 1; Flower: {args.cpus_per_client} CPU per client; "
                         f"{args.rounds} rounds per run, {args.pairs} rotated passes"))  # fmt: skip
    for workload in args.workloads:
        figures: dict[str, list[dict]] = {}
        sides = {side: block(side, workload, args, figures) for side in ("embedded", "flower", "bare")}
        times, before, after = rotate(sides, args.pairs)
        emb, fl, bare = times["embedded"], times["flower"], times["bare"]
        fl_clients = [f["clients"] for f in figures["flower"]]
        emb_clients = [f["clients"] for f in figures["embedded"]]
        adds = [100 * (f - b) / b for f, b in zip(fl, bare, strict=True)]
        server = [100 * (f - c) / b for f, c, b in zip(fl, fl_clients, bare, strict=True)]
        exchange = [100 * (c - b) / b for c, b in zip(fl_clients, bare, strict=True)]
        training = [100 * e / b for e, b in zip(emb_clients, bare, strict=True)]
        on_flower_vs_embedded = ratio(fl, emb)
        med = statistics.median
        print(
            f"{workload}: embedded {med(emb):.3f} s/round (clients' training {med(emb_clients):.3f}) | "
            f"fedhet on Flower {med(fl):.3f} s/round | bare Flower {med(bare):.3f} s/round (medians)\n"
            f"  fedhet on Flower adds {_spread(adds)} of bare Flower's round; its server side "
            f"{_spread(server)}; the clients' round trip beyond the echo {_spread(exchange)} (their "
            f"training alone, in one process: {_spread(training)})\n"
            f"  fedhet on Flower / embedded: {on_flower_vs_embedded['median']:.1f}x "
            f"(pairs {on_flower_vs_embedded['min']:.1f}-{on_flower_vs_embedded['max']:.1f}); "
            f"load {before:.2f} -> {after:.2f}"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
