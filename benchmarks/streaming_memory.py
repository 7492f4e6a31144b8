"""Peak memory of one FedAvg round: streaming aggregation vs the list of the whole cohort.

Each measurement runs in a fresh process: 200 cnn-fedstale clients on Fashion-MNIST, the
``full`` system model, a cohort of K clients drawn per round (K = 1 or 200), one local step
at batch 16. A run callback (a ``callback`` plug-in given by module path, like a user's)
resets the process's peak resident memory (Linux ``/proc/self/clear_refs``) when the run
starts (data loaded, model built) and reads it at the end of round 1: the figure is that
peak minus the memory held at the start, i.e. what the round itself added (the first
round of a fresh process: memory freed by an earlier round could stay with the allocator
and hide the next one's). "list" runs the same rule as a subclass
that overrides ``aggregate`` only, which fedhet aggregates from the list of updates.
The four runs (streaming and list, cohort 1 and 200) rotate over --pairs passes; each ratio
is the median of the per-pass ratios, with min-max, and the load before and after
(benchmarks/_common.py).

    python benchmarks/streaming_memory.py [--clients 200] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, describe_ratio, machine_header, ratio, rotate  # noqa: E402

from fedhet.algorithms.fedavg import FedAvg  # noqa: E402
from fedhet.engine.callbacks import Callback  # noqa: E402


class ListFedAvg(FedAvg):
    """FedAvg with its own ``aggregate``: aggregated from the whole list of updates."""

    name = "list-fedavg"

    def aggregate(self, params, buffers, updates, state, context, layout):
        return super().aggregate(params, buffers, updates, state, context, layout)


def _status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


class PeakMemory(Callback):
    """Peak resident memory added during round 2."""

    name = "peak-memory"
    result: dict = {}

    def on_start(self, state) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        PeakMemory.result["before"] = _status("VmRSS")

    def on_round_end(self, state, row: dict) -> None:
        if row["round"] == 1:
            PeakMemory.result["peak"] = _status("VmHWM")
            PeakMemory.result["participants"] = row["participants"]


CONFIG = """
[run]
name = "memory"
rounds = 2
eval_every = 100
threads = 1
callbacks = [{{ name = "streaming_memory:PeakMemory" }}]
[data]
dataset = "fmnist"
num_clients = {clients}
fraction = 0.1
[model]
name = "cnn-fedstale"
[train]
lr = 0.01
batch_size = 16
[system]
model = "full"
participation = "cohort"
cohort_size = {cohort}
[algorithm]
name = "{algorithm}"
"""


def measure(clients: int, cohort: int, algorithm: str, out: str) -> dict:
    import torch

    from fedhet.config import from_dict
    from fedhet.engine.loop import RunLoop

    torch.set_num_threads(1)
    config = from_dict(tomllib.loads(CONFIG.format(clients=clients, cohort=cohort, algorithm=algorithm)))
    RunLoop(config, out).run(overwrite=True)
    import importlib

    return dict(importlib.import_module("streaming_memory").PeakMemory.result)  # the class the run loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--out", default="runs/benchmarks/streaming_memory")
    parser.add_argument("--pairs", type=int, default=5, help="passes over the four runs (>= 5 for a figure)")
    parser.add_argument("--child", nargs=3, metavar=("COHORT", "ALGORITHM", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        cohort, algorithm, out = args.child
        print(json.dumps(measure(args.clients, int(cohort), algorithm, out)))
        return
    print(machine_header(f"each figure from a fresh process, torch threads 1; {args.pairs} rotated passes"))
    rules = {"streaming": "fedavg", "list": "streaming_memory:ListFedAvg"}
    results: dict[tuple[str, int], list[dict]] = {}

    def block(label: str, cohort: int):
        def measure_once() -> float:
            command = [sys.executable, __file__, "--clients", str(args.clients), "--child", str(cohort),
                       rules[label], f"{args.out}/{label}-{cohort}"]  # fmt: skip
            env_path = f"{Path(__file__).resolve().parent}:{REPO / 'src'}"
            done = subprocess.run(command, capture_output=True, text=True, env={"PYTHONPATH": env_path})
            if done.returncode:
                sys.exit(done.stderr.strip().splitlines()[-1])
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["added"] = max(result["peak"] - result["before"], 0.1 * 2**20) / 2**20
            results.setdefault((label, cohort), []).append(result)
            return result["added"]

        return measure_once

    sides = {(label, cohort): block(label, cohort) for label in rules for cohort in (1, args.clients)}
    added, before, after = rotate(sides, args.pairs)
    for (label, cohort), runs in results.items():
        trained = runs[0]["participants"]
        print(f"{label:9} cohort {cohort:4}: {trained:4} trained, the round added "
              f"{statistics.median(added[label, cohort]):8.1f} MiB (median of {len(runs)})")  # fmt: skip
    for label in rules:
        r = ratio(added[label, args.clients], added[label, 1], (before, after))
        print(describe_ratio(f"{label}: cohort {args.clients} / cohort 1", r, unit="MiB"))


if __name__ == "__main__":
    main()
