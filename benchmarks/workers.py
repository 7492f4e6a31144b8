"""Goals: ``run.workers = 2`` >= 1.7x ``run.workers = 1`` on SALF's Table II CNN workload and
on pfl-research's CIFAR-10 benchmark shape; with evaluation every round, the Table II
workload at ``workers = 2`` within 1.3x of the same run evaluating every 10 rounds. Also: a
model of run time against workers, fitted from these figures, and what it predicts for 16
and 64 cores.

Workloads:
- ``table2``: cnn2 on Fashion-MNIST, 30 IID clients, one SGD step of batch 16 (momentum 0.5
  kept per client), 90% stragglers, SALF (SALF Sec. IV-A), evaluation every 10 rounds.
- ``cifar-shape``: pfl-research's CIFAR-10 benchmark shape (benchmarks/pfl_research.py):
  simple-cnn, 1,000 clients x 50 images, cohort 50, 5 steps of batch 10, FedAvg; random
  images in CIFAR-10's format (timing only).

Each side is one block: a fresh run of ``--rounds`` rounds in this process; its figure is
the time per round after the first (steady state: the workers' start-up is reported apart).
Sides alternate (A B, B A, ...) for ``--pairs`` pairs; the ratio is the median of the
per-pair ratios. ``workers = 1`` runs with ``run.threads = "auto"`` (its best on this
machine: one thread under 50 MFLOP per step, else the free cores).

    python benchmarks/workers.py                       # every figure, 5 pairs
    python benchmarks/workers.py --workload table2 --pairs 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TABLE2_CNN, alternate, describe_ratio, machine_header, ratio, rotate, with_workers  # noqa: E402

TABLE2 = """
[run]
name = "table2"
seed = 1
rounds = {rounds}
eval_every = {eval_every}
threads = "auto"
workers = {workers}
{table2}straggler_ratio = 0.9

[algorithm]
name = "salf"
"""


def table2_config(rounds: int, workers: int, eval_every: int = 10):
    from fedhet.config import from_dict

    text = TABLE2.format(rounds=rounds, workers=workers, eval_every=eval_every, table2=TABLE2_CNN)
    return from_dict(tomllib.loads(text))


def cifar_config(rounds: int, workers: int, data_dir: str, threads="auto"):
    from pfl_research import fedhet_config

    config = fedhet_config("cifar10", data_dir, rounds, 0, seed=1)
    return with_workers(config, workers, threads=threads)


class Block:
    """One run of a configuration; records its steady-state time per round, its start-up
    (construction to first round) and this process's CPU time per round (the serial part:
    planning, transfers, aggregation)."""

    count = 0  # runs of every block, for fresh folder names

    def __init__(self, make_config, scratch: Path):
        self.make_config = make_config
        self.scratch = scratch
        self.runs = 0
        self.startup: list[float] = []
        self.serial: list[float] = []

    def __call__(self) -> float:
        from fedhet.engine.loop import RunLoop

        self.runs += 1
        Block.count += 1
        out = self.scratch / f"run-{Block.count}"
        stamps: list[tuple[float, float]] = []
        started = time.perf_counter()
        RunLoop(
            self.make_config(),
            out,
            on_round=lambda row: stamps.append((time.perf_counter(), time.process_time())),
        ).run()
        (wall0, cpu0), (wall1, cpu1) = stamps[0], stamps[-1]
        rounds = len(stamps) - 1
        self.startup.append(wall0 - started)
        self.serial.append((cpu1 - cpu0) / rounds)
        return (wall1 - wall0) / rounds


def scaling_model(t1: float, t2: float, serial: float, tasks: int) -> str:
    """T(W) = a + b / W through the two measured points (Amdahl), floored by this process's
    CPU per round (it hands out every task and adds every update: no number of workers
    makes a round shorter than that)."""
    b = 2 * (t1 - t2)
    a = t1 - b
    if b <= 0:
        return "  model: no gain from a second worker to fit (the one-worker side already uses both cores)"
    lines = [
        f"  model: T(W) = {a * 1e3:.1f} ms + {b * 1e3:.1f} ms / W, floored at the run process's "
        f"{serial * 1e3:.1f} ms of CPU per round ({serial / tasks * 1e3:.2f} ms per task)"
    ]
    for w in (1, 2, 4, 8, 16, 64):
        t = max(a + b / w, serial)
        lines.append(f"  W = {w:>2}: {t * 1e3:7.1f} ms per round, {t1 / t:5.2f}x one worker")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("table2", "cifar-shape", "all"), default="all")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--cifar-rounds", type=int, default=6)
    args = parser.parse_args()
    print(machine_header("this process: 1 torch thread with workers; workers: 1 thread each"))
    with tempfile.TemporaryDirectory(prefix="fedhet-bench-") as tmp:
        scratch = Path(tmp)
        if args.workload in ("table2", "all"):
            one = Block(lambda: table2_config(args.rounds, 1), scratch)
            two = Block(lambda: table2_config(args.rounds, 2), scratch)
            figures = alternate(one, two, args.pairs)
            print(describe_ratio("table2 (cnn2, 30 clients, batch 16): workers 2 vs 1, s/round", figures))
            startup = [statistics.median(block.startup) for block in (one, two)]
            print(
                f"  start-up to the first round (median): workers 1 {startup[0]:.2f} s, 2 {startup[1]:.2f} s"
            )
            t1, t2 = statistics.median(figures["first"]), statistics.median(figures["second"])
            print(scaling_model(t1, t2, statistics.median(two.serial), tasks=30))
            every = Block(lambda: table2_config(args.rounds, 2, eval_every=1), scratch)
            tenth = Block(lambda: table2_config(args.rounds, 2, eval_every=10), scratch)
            figures = alternate(every, tenth, args.pairs)
            print(describe_ratio("table2 at workers 2: evaluation every round vs every 10, s/round", figures))
            one_every = Block(lambda: table2_config(args.rounds, 1, eval_every=1), scratch)
            figures = alternate(one_every, every, args.pairs)
            print(describe_ratio("table2, evaluation every round: workers 2 vs 1, s/round", figures))
        if args.workload in ("cifar-shape", "all"):
            from pfl_research import synthetic_cifar

            data_dir = str(synthetic_cifar(scratch / "cifar"))
            sides = {
                "workers 1, threads auto": Block(
                    lambda: cifar_config(args.cifar_rounds, 1, data_dir), scratch
                ),
                "workers 1, 1 thread": Block(
                    lambda: cifar_config(args.cifar_rounds, 1, data_dir, 1), scratch
                ),
                "workers 2": Block(lambda: cifar_config(args.cifar_rounds, 2, data_dir), scratch),
            }
            times, before, after = rotate(sides, args.pairs)
            shape = "cifar-shape (simple-cnn, cohort 50, 5 steps of 10)"
            for base in list(sides)[:2]:
                figures = ratio(times[base], times["workers 2"], (before, after))
                print(describe_ratio(f"{shape}: workers 2 vs {base}, s/round", figures))
            t1, t2 = statistics.median(times["workers 1, 1 thread"]), statistics.median(times["workers 2"])
            print(scaling_model(t1, t2, statistics.median(sides["workers 2"].serial), tasks=50))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
