"""Goal: ``fedhet reproduce --jobs 2`` completes a grid >= 1.8x faster than ``--jobs 1`` on a
2-core machine.

The grid: SALF's Table II CNN setting (cnn2 on Fashion-MNIST, 30 clients,
batch 16, one step per round, 150 rounds, evaluation every 20 rounds) for drop-stragglers
and SALF at 50% and 90% stragglers, seeds 1-2: 8 cells of about 4 s each, threads
"auto" (one per job here). Each setting runs the whole grid from scratch in a fresh folder,
with ``fedhet reproduce`` in a fresh process; the wall time includes starting Python, loading
the data and starting the worker processes.

Blocks rotate (jobs 1; jobs 2; jobs 2 with run.workers = 2, which a job's share of the
cores caps at one worker each) for ``--pairs`` passes; each ratio is the median of the
per-pass ratios.

    python benchmarks/grid_jobs.py [--jobs 2] [--rounds 150] [--seeds 2] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TABLE2_CNN, machine_header, scratch  # noqa: E402

GRID = """
[experiment]
name = "grid-jobs"

[run]
rounds = {rounds}
eval_every = 20

{table2}
[algorithm]
name = "salf"

[grid]
"system.straggler_ratio" = [0.5, 0.9]
algorithm = [{{ name = "drop" }}, {{ name = "salf" }}]
"run.seed" = {seeds}

[report]
rows = ["system.straggler_ratio"]
columns = ["algorithm"]
value = "final_test_accuracy"
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=2, help="seeds per setting (4 cells each)")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    print(machine_header("each block: `fedhet reproduce` in a fresh process, from an empty folder"))
    from _common import describe_ratio, ratio, rotate

    with scratch() as tmp:
        blocks = {"n": 0}

        def grid(jobs: int, workers: int):
            def block() -> float:
                blocks["n"] += 1
                path = Path(tmp) / f"grid-{blocks['n']}.toml"
                text = GRID.format(
                    rounds=args.rounds, seeds=list(range(1, args.seeds + 1)), table2=TABLE2_CNN
                )
                path.write_text(text.replace("[run]\n", f"[run]\nworkers = {workers}\n", 1))
                out = Path(tmp) / f"out-{blocks['n']}"
                started = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "fedhet", "reproduce", str(path), "--out", str(out),
                     "--jobs", str(jobs), "--quiet"],
                    check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                wall = time.perf_counter() - started
                cells = [json.loads(p.read_text())["wall_time"] for p in out.glob("*/summary.json")]
                print(f"  --jobs {jobs}, run.workers = {workers}: {len(cells)} cells in {wall:.1f} s "
                      f"(cells' own run times add up to {sum(cells):.1f} s)", flush=True)  # fmt: skip
                return wall

            return block

        sides = {
            "jobs 1": grid(1, 1),
            f"jobs {args.jobs}": grid(args.jobs, 1),
            f"jobs {args.jobs}, workers {args.jobs} (capped to the cores)": grid(args.jobs, args.jobs),
        }
        times, before, after = rotate(sides, args.pairs)
        names = list(sides)
        for name in names[1:]:
            print(
                describe_ratio(
                    f"{name} vs jobs 1 (grid wall time)", ratio(times[names[0]], times[name], (before, after))
                )
            )
        print("goal: >= 1.8x for --jobs 2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
