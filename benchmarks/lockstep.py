"""What one more seed costs when a bench's seed runs train as one computation
(:mod:`fedhet.engine.cohort`): a cohort of ``--seeds`` runs of the leaderboard's shape in
lockstep against one run alone.

Workload: benchmarks/overhead.py's ``leaderboard`` (Fashion-MNIST with 20% held out, 20
Dirichlet(0.5) clients, the 25,818-parameter MLP, SALF at 50% stragglers, one step of batch
16, 150 rounds, evaluation every 10 rounds on the 12,000 validation images), one torch
thread, the batched pool on both sides (what ``run.pool = "auto"`` picks for it), the data
loaded before timing.

Sides alternate (alone, cohort; cohort, alone; ...) for ``--pairs`` pairs; per pair the
figure is (T_cohort - T_alone) / ((k - 1) T_alone), the cost of one more seed as a share of
a run alone, reported as the median with its range. Run it on one core for the figure
docs/performance.md quotes (the cohort's threads then share it, as a run alone has it):

    taskset -c 0 python benchmarks/lockstep.py --pairs 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_header, rotate  # noqa: E402
from overhead import LEADERBOARD  # noqa: E402


def _config(seed: int):
    from fedhet.config import from_dict

    document = copy.deepcopy(LEADERBOARD)
    document["run"].update(seed=seed, pool="batched")
    return from_dict(document)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="runs in the cohort (k >= 2)")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    if args.seeds < 2:
        parser.error("--seeds: a cohort has two runs or more")
    torch.set_num_threads(1)
    from fedhet.engine.cohort import CohortRun
    from fedhet.engine.launch import run, run_together
    from fedhet.world import open_configured_dataset

    print(machine_header(f"lockstep, leaderboard shape, {args.seeds} seeds, one thread"))
    open_configured_dataset(_config(1))
    with tempfile.TemporaryDirectory(prefix="fedhet-lockstep-") as folder:
        scratch = Path(folder)

        def alone() -> float:
            start = time.perf_counter()
            run(_config(1), scratch / "alone", overwrite=True)
            return time.perf_counter() - start

        def together() -> float:
            runs = [CohortRun(_config(s), scratch / f"seed-{s}") for s in range(1, args.seeds + 1)]
            start = time.perf_counter()
            results = run_together(runs)
            elapsed = time.perf_counter() - start
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
            return elapsed

        alone()  # warm-up
        times, before, after = rotate({"alone": alone, "cohort": together}, args.pairs)
    shares = sorted(
        (c - a) / ((args.seeds - 1) * a) for a, c in zip(times["alone"], times["cohort"], strict=True)
    )
    median = statistics.median(shares)
    alone_s, cohort_s = statistics.median(times["alone"]), statistics.median(times["cohort"])
    print(
        f"one more seed: {median:.2f}x a run alone (pairs {shares[0]:.2f}-{shares[-1]:.2f}, "
        f"n={len(shares)}); "
        f"a run alone {alone_s:.3f} s, {args.seeds} in lockstep {cohort_s:.3f} s; "
        f"load {before:.2f} -> {after:.2f}"
    )


if __name__ == "__main__":
    main()
