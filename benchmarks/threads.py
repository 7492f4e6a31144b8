"""Goal: with one core busy elsewhere, a run with the default ``run.threads = "auto"`` is at
most 1.5x slower than on an idle machine.

Two workloads, each run on an idle machine and while a child process keeps one core busy
(a pure-Python loop), with torch's default threads (``run.threads = 0``, one per core) and
with "auto":

- ``salf-digits``: 50 rounds of SALF on scikit-learn's digits (MLP, 10 clients, batch 16);
- ``cnn-fedstale``: 6 rounds of FedAvg with FedStale's CNN on Fashion-MNIST (10 clients,
  batch 128, 5 local steps): work large enough that "auto" uses every free core.

The four settings rotate (each block a fresh run) for ``--pairs`` passes; each ratio is the
median of the per-pass ratios.

    python benchmarks/threads.py [--pairs 5]
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
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    import torch
    from _common import describe_ratio, ratio, rotate

    default_threads = torch.get_num_threads()
    print(machine_header("busy: one child process spinning a pure-Python loop"))
    with scratch() as tmp:
        for workload in args.workloads:

            def side(busy: bool, threads, workload=workload):
                def block() -> float:
                    stop = multiprocessing.Event()
                    spinner = (
                        multiprocessing.Process(target=_spin, args=(stop,), daemon=True) if busy else None
                    )
                    if spinner:
                        spinner.start()
                        time.sleep(1.0)
                    try:
                        torch.set_num_threads(default_threads)  # every run starts from torch's default
                        wall, used = timed_run(workload, threads, Path(tmp) / workload)
                    finally:
                        if spinner:
                            stop.set()
                            spinner.join()
                    label = "torch default" if threads == 0 else '"auto"'
                    print(f"  {workload:<13} {'busy' if busy else 'idle'}  {label:<14} {used} threads  "
                          f"{wall:7.2f} s", flush=True)  # fmt: skip
                    return wall

                return block

            sides = {
                (busy, threads): side(busy, threads) for busy in (False, True) for threads in (0, "auto")
            }
            times, before, after = rotate(sides, args.pairs)
            load = (before, after)
            print(describe_ratio(f'{workload}: busy/idle with "auto" (goal <= 1.5x)',
                                 ratio(times[True, "auto"], times[False, "auto"], load)))  # fmt: skip
            print(describe_ratio(f"{workload}: busy/idle with torch's default",
                                 ratio(times[True, 0], times[False, 0], load)))  # fmt: skip
            print(describe_ratio(f'{workload}: busy, torch\'s default / "auto"',
                                 ratio(times[True, 0], times[True, "auto"], load)))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
