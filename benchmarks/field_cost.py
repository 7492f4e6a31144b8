"""What a bench's field costs on this build: one seed run of every (scenario, method) of a
finished bench folder, run again here and, with ``--against COMMIT``, on that commit's
``src``, in alternating blocks (A B, B A, ...), each block a fresh process per side that runs
its share of the cells one after another on one thread (as a bench worker does).

The cells may also come from a suite instead of a folder: each pair's seed-1 run at the
first tuning's values of a published ``leaderboard.csv`` (``--tuned``, default the
committed field's). ``--against-set KEY=VALUE`` makes the other side this checkout (or
``--against``'s commit) with those settings changed, e.g. the evaluation cadence the field
ran with.

The figure of a run is its loop time (``summary.json``'s ``wall_time``); a side's figure is
the sum over its cells. With ``--against`` the ratio of the sums (and the median of the
blocks' ratios) says how much dearer or cheaper this build runs the field's mix of methods;
times the field's recorded wall time, it projects the field on this build. The cells' final
accuracies are compared too (event-driven rules' grouped starts differ within float
tolerance; anything else should be the same).

    python benchmarks/field_cost.py runs/bench-heterogeneity --against d75879c --blocks 8
    python benchmarks/field_cost.py runs/bench-heterogeneity --against COMMIT --methods fedbuff ringmaster
    python benchmarks/field_cost.py suites/heterogeneity.toml \
        --against-set run.eval_interval=0 run.eval_every=10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, load_average, release_tree, run_in_child, scratch  # noqa: E402

CHILD = """
import json, sys, tempfile, tomllib
from pathlib import Path
from fedhet.config import apply_overrides, from_dict
from fedhet.engine.launch import run
out = []
with tempfile.TemporaryDirectory() as folder:
    for k, path in enumerate(json.loads(sys.argv[1])):
        raw = apply_overrides(tomllib.loads(Path(path).read_text()), json.loads(sys.argv[2]))
        result = run(from_dict(raw), Path(folder) / f"run-{k}")
        out.append([float(result.summary["wall_time"]), result.summary.get("final_test_accuracy")])
print(json.dumps({"runs": out}))
"""


def label(run: Path) -> str:
    """``scenario/method`` of a seed run's folder (``.../seeds/<scenario>/<method>/...``)."""
    parts = run.parts[run.parts.index("seeds") + 1 :]
    return f"{parts[0]}/{parts[1]}"


def cells(folder: Path, tuning: str) -> list[Path]:
    """The seed-1 run folder of the given tuning of every (scenario, method) under
    ``folder``/seeds (tuning 1's seeds lie directly under the method's folder)."""
    found = []
    for method in sorted((folder / "seeds").glob("*/*")):
        run = method / ("seed-1" if tuning == "1" else f"tuning-{tuning}/seed-1")
        if (run / "config.toml").is_file() and (run / "summary.json").is_file():
            found.append(run)
    return found


def suite_cells(suite_path: Path, tuned: Path, into: Path) -> list[Path]:
    """Every pair of the suite that ran in ``tuned`` (a leaderboard.csv): its seed-1 run's
    configuration at the first tuning's values, written as ``into``/seeds/<scenario>/<method>/
    seed-1/config.toml."""
    import csv

    import tomli_w

    from fedhet.bench.suite import load_suite

    suite = load_suite(suite_path)
    rows = {(r["scenario"], r["method"]): r for r in csv.DictReader(tuned.open(encoding="utf-8"))}
    found = []
    for scenario, method in suite.pairs():
        row = rows.get((scenario.name, method.label))
        if row is None or row["status"] != "ok":
            continue
        values = json.loads(row["tuned"])[0]
        run = into / "seeds" / scenario.name / method.label / "seed-1"
        run.mkdir(parents=True)
        raw = suite.config(scenario, method, values, "seed", seed=1)
        (run / "config.toml").write_text(tomli_w.dumps(raw), encoding="utf-8")
        found.append(run)
    return found


def run_block(src: Path, overrides: list[str], runs: list[Path]) -> list[list]:
    """The block's runs in one fresh process on ``src`` with ``overrides``: [loop time, final
    accuracy] each."""
    code = CHILD.replace("json.loads(sys.argv[1])", repr([str(r / "config.toml") for r in runs]))
    code = code.replace("json.loads(sys.argv[2])", repr(list(overrides)))
    child = run_in_child(src, code, env={"OMP_NUM_THREADS": "1"}, timeout=6 * 3600)
    return child["runs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a finished bench folder (its seeds/ runs), or a suite")
    parser.add_argument("--against", metavar="COMMIT", help="compare with this commit's src")
    parser.add_argument(
        "--against-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="the other side's settings changed (this checkout unless --against)",
    )
    parser.add_argument(
        "--tuned",
        type=Path,
        default=REPO / "docs/results/data/leaderboard.csv",
        help="with a suite: the leaderboard.csv whose first tuning's values the cells take",
    )
    parser.add_argument("--blocks", type=int, default=8, help="blocks per side (default 8)")
    parser.add_argument("--tuning", default="1", help="which tuning's seed-1 runs (default 1)")
    parser.add_argument("--field-wall", type=float, help="the field's recorded wall time in hours")
    parser.add_argument("--methods", nargs="+", help="only these methods' cells (default: all)")
    args = parser.parse_args()
    with scratch() as tmp:
        found = (suite_cells(args.folder, args.tuned, Path(tmp) / "cells") if args.folder.suffix == ".toml"
                 else cells(args.folder, args.tuning))  # fmt: skip
        runs = [r for r in found if not args.methods or label(r).split("/")[1] in args.methods]
        if not runs:
            raise SystemExit(f"field_cost: no seed runs under {args.folder / 'seeds'}")
        random.Random(0).shuffle(runs)
        blocks = [runs[i :: args.blocks] for i in range(args.blocks)]
        recorded = {r: float(json.loads((r / "summary.json").read_text())["wall_time"])
                    for r in runs if (r / "summary.json").is_file()}  # fmt: skip
        print(f"machine: {os.cpu_count()} cores, load average {load_average():.2f}; {len(runs)} cells")
        other = args.against or (" ".join(args.against_set) if args.against_set else None)
        sides = {"this checkout": (REPO / "src", [])}
        if other:
            src = release_tree(args.against, Path(tmp)) if args.against else REPO / "src"
            sides[other] = (src, args.against_set)
        times: dict[str, dict[Path, list]] = {name: {} for name in sides}
        began = time.perf_counter()
        for k, block in enumerate(blocks):
            order = list(sides) if k % 2 == 0 else list(reversed(sides))
            for name in order:
                times[name].update(zip(block, run_block(*sides[name], block), strict=True))
        took = time.perf_counter() - began
        report(args, other, sides, times, blocks, recorded, took)


def report(args, other, sides, times, blocks, recorded, took: float) -> None:
    mine = times["this checkout"]
    if recorded:
        print(f"recorded in the field: {sum(recorded.values()):.1f} s of loop time for these cells")
    for name in sides:
        print(f"{name}: {sum(t for t, _ in times[name].values()):.1f} s of loop time")
    print(f"benchmark wall time {took / 60:.1f} min; load average now {load_average():.2f}")
    dearest = sorted(mine, key=lambda r: -mine[r][0])[:10]
    print("dearest cells here: " + ", ".join(f"{label(r)} {mine[r][0]:.1f} s" for r in dearest))
    if not other:
        return
    theirs = times[other]
    ratio = sum(t for t, _ in mine.values()) / sum(t for t, _ in theirs.values())
    per_block = [sum(mine[r][0] for r in b) / sum(theirs[r][0] for r in b) for b in blocks if b]
    print(
        f"this checkout / {other}: {ratio:.3f}x of the loop time (blocks: median "
        f"{statistics.median(per_block):.3f}x, {min(per_block):.3f}-{max(per_block):.3f}, n={len(per_block)})"
    )
    moved = [r for r in mine if _differs(mine[r][1], theirs[r][1])]
    print(f"final accuracies that differ by more than 1e-3: {len(moved)} of {len(mine)}: "
          + ", ".join(f"{label(r)} {theirs[r][1]} -> {mine[r][1]}" for r in moved))  # fmt: skip
    by_method: dict[str, list[float]] = {}
    for r in mine:
        share = mine[r][0] / theirs[r][0] if theirs[r][0] else 1.0
        by_method.setdefault(label(r).split("/")[1], []).append(share)
    medians = sorted((statistics.median(v), m) for m, v in by_method.items())
    print("median ratio by method: " + ", ".join(f"{m} {v:.2f}x" for v, m in medians))
    if args.field_wall:
        projected = args.field_wall * ratio
        print(f"projected field wall time: {args.field_wall:.2f} h x {ratio:.3f} = {projected:.2f} h")


def _differs(a, b) -> bool:
    if a is None or b is None:
        return a is not b
    return abs(float(a) - float(b)) > 1e-3


if __name__ == "__main__":
    main()
