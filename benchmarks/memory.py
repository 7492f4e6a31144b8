"""Peak resident memory and start-up of one leaderboard-shape run (benchmarks/overhead.py's
``leaderboard`` workload: Fashion-MNIST, 20% held out for validation, the 25,818-parameter
MLP, SALF, 150 rounds), each in a fresh process as ``fedhet run`` starts it.

The child times and measures its parts: importing fedhet and torch, loading the dataset
(decoding and normalising it), building the run's world, and the run; it reads its resident
memory (``VmRSS``) after each part and its peak (``VmHWM``) at the end. The parent reads the
child's peak from ``wait4``. With ``--against COMMIT`` the same child runs on that commit's
``src`` (``git archive``), alternating with this checkout (A B, B A, ...); the ratios are
the medians of the pairs.

    python benchmarks/memory.py --pairs 5
    python benchmarks/memory.py --against 399b68c --pairs 5
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
from overhead import LEADERBOARD  # noqa: E402

CHILD = """
import json, sys, tempfile, time
from pathlib import Path

def rss(field="VmRSS"):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
start = time.perf_counter()
import torch
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.world import open_configured_dataset
parts = {"import": [time.perf_counter() - start, rss()]}
config = from_dict(json.loads(sys.argv[1]))
began = time.perf_counter()
open_configured_dataset(config)
parts["dataset"] = [time.perf_counter() - began, rss()]
began = time.perf_counter()
result = run(config, Path(tempfile.mkdtemp()) / "run")
parts["run"] = [time.perf_counter() - began, rss()]
parts["loop"] = [float(result.summary["wall_time"]), rss()]
print(json.dumps({"parts": parts, "peak": rss("VmHWM"), "accuracy": result.metrics[-1]["test_accuracy"]}))
"""


def one_run(src: Path, last: dict) -> float:
    """One fresh process on ``src``: its peak RSS in MB from ``wait4`` (its own figures go
    to ``last``)."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(LEADERBOARD)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status, usage = os.wait4(child.pid, 0)
    out, err = child.stdout.read(), child.stderr.read()  # type: ignore[union-attr]
    if status != 0:
        raise SystemExit(f"memory: the child on {src} failed: {(err.strip().splitlines() or ['?'])[-1]}")
    last.update(json.loads(out.strip().splitlines()[-1]), wall=time.perf_counter() - began)
    return usage.ru_maxrss / 1024


def describe(label: str, last: dict) -> str:
    parts = ", ".join(f"{name} {t:.2f} s (RSS {mb:.0f} MB)" for name, (t, mb) in last["parts"].items())
    return (
        f"  {label}, last block: {parts}; process {last['wall']:.2f} s; final accuracy {last['accuracy']:.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="COMMIT", help="compare with this commit's src")
    parser.add_argument("--pairs", type=int, default=5, help="blocks per side (default 5)")
    args = parser.parse_args()
    here = REPO / "src"
    print(
        f"machine: {os.cpu_count()} cores, load average {load_average():.2f}; python {sys.version.split()[0]}"
    )
    mine: dict = {}
    if args.against is None:
        peaks = [one_run(here, mine) for _ in range(args.pairs)]
        print(
            f"peak RSS (median of {len(peaks)}): {statistics.median(peaks):.0f} MB "
            f"(min {min(peaks):.0f}, max {max(peaks):.0f})"
        )
        print(describe("this checkout", mine))
        return
    with scratch() as tmp:
        theirs_src = release_tree(args.against, Path(tmp))
        theirs: dict = {}
        walls: dict = {"mine": [], "theirs": []}

        def side(src: Path, last: dict, key: str):
            def block() -> float:
                peak = one_run(src, last)
                walls[key].append(last["wall"])
                return peak

            return block

        figures = alternate(side(here, mine, "mine"), side(theirs_src, theirs, "theirs"), args.pairs)
    print(describe_ratio(f"peak RSS, this checkout vs {args.against}", figures, unit="MB"))
    ratios = [a / b for a, b in zip(walls["mine"], walls["theirs"], strict=True)]
    print(
        f"process wall time, this checkout vs {args.against}: {statistics.median(ratios):.2f}x "
        f"(pairs {min(ratios):.2f}-{max(ratios):.2f}); medians {statistics.median(walls['mine']):.2f} vs "
        f"{statistics.median(walls['theirs']):.2f} s"
    )
    for label, last in (("this checkout", mine), (args.against, theirs)):
        print(describe(label, last))


if __name__ == "__main__":
    main()
