"""The tables of docs/results/baselines.md, recomputed from the grids' committed per-run tables.

    python experiments/baselines_tables.py docs/results/data/baselines-steps.csv \
        --times docs/results/data/baselines-steps-times.csv \
        --tuned docs/results/data/baselines-tuned.csv

The first table is the final test accuracy of `fedhet reproduce experiments/baselines_steps.toml`
(the ``cells.csv`` it writes), one row per algorithm and one column per learning rate: mean ±
95% t-interval over the seeds, then each seed. ``--times`` (the per-run table
`experiments/accuracy_at_times.py --csv` writes from the same runs) adds the accuracy at
fractions of the budget, ``--tuned`` (the ``cells.csv`` of `experiments/baselines_tuned.toml`)
the tuned runs. A run that stopped before its budget (a non-finite loss) is marked with how it
stopped.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from fedhet.studies.stats import estimate

NAMES = {  # algorithm -> its row on the page
    "fedavg": "fedavg (wait for all)",
    "drop": "drop-stragglers",
    "fedprox": "fedprox",
    "fednova": "fednova",
    "scaffold": "scaffold",
    "feddyn": "feddyn",
}
FINISHED = {"budget", "rounds", "time_budget", "time-budget"}


def read(path: str) -> list[dict]:
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such per-run table")
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def seed_text(row: dict) -> str:
    """A run's final accuracy, with how it stopped when that was not its budget."""
    value = f"{float(row['final_test_accuracy']):.3f}"
    stopped = row.get("stopped_by") or ""
    return value if not stopped or stopped in FINISHED else f"{value} (stopped: {stopped})"


def cell_text(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: int(r["seed"]))
    e = estimate([float(r["final_test_accuracy"]) for r in rows], "ci95")
    return f"{e.mean:.3f} ± {e.spread:.3f} (" + ", ".join(seed_text(r) for r in rows) + ")"


def steps_table(rows: list[dict]) -> None:
    by_cell: dict = defaultdict(list)
    for row in rows:
        by_cell[row["algorithm.name"], float(row["train.lr"])].append(row)
    rates = sorted({lr for _, lr in by_cell}, reverse=True)
    seeds = sorted({int(r["seed"]) for r in rows})
    print(f"Final test accuracy, mean ± 95% t-interval over seeds {seeds[0]}-{seeds[-1]}, then each seed\n")
    print("| algorithm | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |")
    print("|---|" + "---|" * len(rates))
    for name, label in NAMES.items():
        cells = [cell_text(by_cell[name, lr]) if by_cell.get((name, lr)) else "" for lr in rates]
        print(f"| {label} | " + " | ".join(cells) + " |")


def times_table(rows: list[dict]) -> None:
    """Mean over the seeds of each run's accuracy at each fraction of the budget."""
    fractions = [k for k in rows[0] if k not in ("cell", "seed")]
    by_cell: dict = defaultdict(list)
    for row in rows:
        by_cell[row["cell"]].append(row)
    print("\nAccuracy at fractions T of the budget (mean over the seeds with an evaluation by then)\n")
    print("| algorithm | lr | " + " | ".join(f"{f} T" for f in fractions) + " |")
    print("|---|---|" + "---|" * len(fractions))
    cells = sorted(by_cell, key=lambda c: (-float(c.split("-")[0]), list(NAMES).index(c.split("-")[1])))
    for cell in cells:
        lr, name = cell.split("-")[:2]
        out = []
        for fraction in fractions:
            seen = [float(r[fraction]) for r in by_cell[cell] if r[fraction] not in ("", "None")]
            out.append(f"{sum(seen) / len(seen):.3f}" if seen else "-")
        print(f"| {name} | {lr} | " + " | ".join(out) + " |")


def tuned_table(rows: list[dict]) -> None:
    by_name: dict = defaultdict(list)
    for row in rows:
        by_name[row["algorithm.name"]].append(row)
    seeds = sorted({int(r["seed"]) for r in rows})
    span = f"{seeds[0]}-{seeds[-1]}"
    print(f"\nTuned, final test accuracy, mean ± 95% t-interval over seeds {span}, then each seed\n")
    print("| algorithm | tuned |")
    print("|---|---|")
    for name, label in NAMES.items():
        if by_name.get(name):
            print(f"| {label} | {cell_text(by_name[name])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", help="per-run table of experiments/baselines_steps.toml")
    parser.add_argument("--times", help="per-run table of accuracy_at_times.py --csv")
    parser.add_argument("--tuned", help="per-run table of experiments/baselines_tuned.toml")
    args = parser.parse_args()
    steps_table(read(args.steps))
    if args.times:
        times_table(read(args.times))
    if args.tuned:
        tuned_table(read(args.tuned))


if __name__ == "__main__":
    main()
