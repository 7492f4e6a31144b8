"""How long a fresh Python process takes to be ready for its first client task: start the
interpreter, import fedhet's worker side (torch included) and build the run's world (the
dataset, its partition, the model) for a digits configuration. Every worker process of
``run.workers``, every Ray actor of the Flower simulation and every ClientApp process of a
Flower deployment (one per message there) pays it.

Each block is one fresh process (``python -c``), timed from the parent: wall seconds from
start to exit, and the child's own figures (import, build). With ``--against COMMIT`` the
same script runs on that commit's ``src`` (extracted with ``git archive``), alternating with
this checkout in short blocks (A B, B A, ...); the ratio is the median of the pairs.

    python benchmarks/process_start.py                      # this checkout, 7 blocks
    python benchmarks/process_start.py --against 505fae1    # against a past commit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, alternate, describe_ratio, load_average, release_tree, scratch  # noqa: E402

CONFIG = REPO / "examples" / "flower-app" / "fedhet.toml"

CHILD = """
import time
start = time.perf_counter()
import json, sys
from fedhet.config import load_config
from fedhet.engine.pool import bootstrap_worker
imported = time.perf_counter()
bootstrap_worker(load_config(sys.argv[1]).to_toml(), cores=1)
built = time.perf_counter()
heavy = sorted(m for m in ("sklearn", "scipy") if m in sys.modules)
print(json.dumps({"import": imported - start, "build": built - imported, "heavy": heavy}))
"""


def one_start(src: Path, last: dict) -> float:
    """One fresh process on ``src``: its wall seconds (its own figures go to ``last``)."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(CONFIG)], env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"process_start: the child on {src} failed: {done.stderr.strip().splitlines()[-1]}")
    last.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="COMMIT", help="compare with this commit's src")
    parser.add_argument("--pairs", type=int, default=7, help="blocks per side (default 7)")
    args = parser.parse_args()
    here = REPO / "src"
    python = sys.version.split()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load_average():.2f}; python {python}")
    mine: dict = {}
    if args.against is None:
        walls = [one_start(here, mine) for _ in range(args.pairs)]
        print(
            f"ready for a task (median of {len(walls)}): {statistics.median(walls):.2f} s "
            f"(min {min(walls):.2f}, max {max(walls):.2f}); last block: import {mine['import']:.2f} s, "
            f"build {mine['build']:.2f} s, imported {mine['heavy'] or 'neither scikit-learn nor SciPy'}"
        )
        return
    with scratch() as tmp:
        theirs_src = release_tree(args.against, Path(tmp))
        theirs: dict = {}
        figures = alternate(lambda: one_start(here, mine), lambda: one_start(theirs_src, theirs), args.pairs)
    print(describe_ratio(f"ready for a task, this checkout vs {args.against}", figures))
    for label, last in (("this checkout", mine), (args.against, theirs)):
        print(
            f"  {label}, last block: import {last['import']:.2f} s, build {last['build']:.2f} s, "
            f"imported {last['heavy'] or 'neither scikit-learn nor SciPy'}"
        )


if __name__ == "__main__":
    main()
