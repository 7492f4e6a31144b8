"""Goal: ``fedhet reproduce --jobs 2`` completes a grid >= 1.8x faster than ``--jobs 1`` on a
2-core machine.

The grid: SALF's Table II CNN setting (cnn2 on Fashion-MNIST, 30 clients,
batch 16, one step per round, 150 rounds, evaluation every 20 rounds) for drop-stragglers
and SALF at 50% and 90% stragglers, seeds 1-2: 8 cells of about 4 s each, threads
"auto" (one per job here). Each setting runs the whole grid from scratch in a fresh folder,
with ``fedhet reproduce`` in a fresh process; the wall time includes starting Python, loading
the data and starting the worker processes.

    python benchmarks/grid_jobs.py [--jobs 2] [--rounds 150] [--seeds 2]
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
    args = parser.parse_args()
    print(machine_header("each setting: `fedhet reproduce` in a fresh process, from an empty folder"))
    with scratch() as tmp:
        path = Path(tmp) / "grid.toml"
        path.write_text(
            GRID.format(rounds=args.rounds, seeds=list(range(1, args.seeds + 1)), table2=TABLE2_CNN)
        )
        times = {}
        for jobs in (1, args.jobs):
            out = Path(tmp) / f"jobs-{jobs}"
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "fedhet", "reproduce", str(path), "--out", str(out),
                 "--jobs", str(jobs), "--quiet"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            times[jobs] = time.perf_counter() - started
            walls = [json.loads(p.read_text())["wall_time"] for p in out.glob("*/summary.json")]
            print(f"--jobs {jobs}: {len(walls)} cells in {times[jobs]:.1f} s "
                  f"(the cells' own run times add up to {sum(walls):.1f} s)")  # fmt: skip
            sys.stdout.flush()
        print(f"speed-up --jobs {args.jobs} over --jobs 1: {times[1] / times[args.jobs]:.2f}x (goal >= 1.8x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
