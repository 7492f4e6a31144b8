"""Goal: with one core busy elsewhere, a run with the default ``run.threads = "auto"`` is at
most 1.5x slower than on an idle machine.

Two workloads, each run on an idle machine and while a child process keeps one core busy
(a pure-Python loop), with torch's default threads (``run.threads = 0``, one per core) and
with "auto":

- ``salf-digits``: 50 rounds of SALF on scikit-learn's digits (MLP, 10 clients, batch 16);
- ``cnn-fedstale``: 6 rounds of FedAvg with FedStale's CNN on Fashion-MNIST (10 clients,
  batch 128, 5 local steps): work large enough that "auto" uses every free core.

    python benchmarks/threads.py
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_header, scratch  # noqa: E402

WORKLOADS = {
    "salf-digits": {
        "run": {"rounds": 50, "eval_every": 10},
        "data": {"dataset": "digits", "partition": "iid", "num_clients": 10},
        "model": {"name": "mlp"},
        "train": {"lr": 0.1, "batch_size": 16, "local_steps": 1},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.9},
        "algorithm": {"name": "salf"},
    },
    "cnn-fedstale": {
        "run": {"rounds": 6, "eval_every": 6},
        "data": {"dataset": "fmnist", "partition": "iid", "num_clients": 10, "fraction": 0.2},
        "model": {"name": "cnn-fedstale"},
        "train": {"lr": 0.01, "batch_size": 128, "local_steps": 5},
        "system": {"model": "full"},
        "algorithm": {"name": "fedavg"},
    },
}


def _spin(stop) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def timed_run(workload: str, threads, out: Path) -> tuple[float, int]:
    """Wall seconds of the run (data loading excluded) and the threads it used."""
    import torch

    from fedhet.config import from_dict
    from fedhet.engine.loop import RunLoop

    document = {k: dict(v) for k, v in WORKLOADS[workload].items()}
    document["run"].update(name=workload, seed=1, threads=threads)
    torch.set_num_threads(torch.get_num_threads())
    result = RunLoop(from_dict(document), out).run(overwrite=True)
    return result.summary["wall_time"], torch.get_num_threads()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args()
    import torch

    default_threads = torch.get_num_threads()
    print(machine_header("busy: one child process spinning a pure-Python loop"))
    ratios = {}
    with scratch() as tmp:
        for workload in args.workloads:
            figures = {}
            for busy in (False, True):
                stop = multiprocessing.Event()
                spinner = multiprocessing.Process(target=_spin, args=(stop,), daemon=True) if busy else None
                if spinner:
                    spinner.start()
                    time.sleep(1.0)
                try:
                    for threads in (0, "auto"):
                        torch.set_num_threads(default_threads)  # every run starts from torch's default
                        wall, used = timed_run(workload, threads, Path(tmp) / workload)
                        figures[busy, threads] = wall
                        label = "torch default" if threads == 0 else '"auto"'
                        print(f"{workload:<13} {'busy' if busy else 'idle'}  {label:<14} {used} threads  "
                              f"{wall:7.2f} s")  # fmt: skip
                        sys.stdout.flush()
                finally:
                    if spinner:
                        stop.set()
                        spinner.join()
            ratios[workload] = figures[True, "auto"] / figures[False, "auto"]
            print(
                f'{workload}: busy/idle with "auto" {ratios[workload]:.2f}x (goal <= 1.5x); with torch\'s '
                f"default {figures[True, 0] / figures[False, 0]:.2f}x; busy, default/auto "
                f"{figures[True, 0] / figures[True, 'auto']:.1f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
