"""Test accuracy at fractions of the time budget, averaged over the seeds of a grid.

    python experiments/accuracy_at_times.py runs/adelfl_fig2 [--fractions 0.1 0.25 0.5 1]
    # write the per-run table (one row per run: its accuracy at each fraction), then the table:
    python experiments/accuracy_at_times.py runs/adelfl_fig2 --csv docs/results/data/adelfl-fig2-times.csv
    # the table from the committed per-run table alone:
    python experiments/accuracy_at_times.py docs/results/data/adelfl-fig2-times.csv

Each run's accuracy at time t is its last evaluation at or before t (simulated clock).
Runs are grouped by cell name without its trailing seed (``...-1``, ``...-2``); a table
entry is the mean over the seeds with an evaluation by then ("-": none had one).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from pathlib import Path

from fedhet.results import RunDirectory


def accuracy_at(rows: list[dict], time: float) -> float | None:
    seen = [r for r in rows if r["test_accuracy"] is not None and r["sim_time"] <= time + 1e-9]
    return seen[-1]["test_accuracy"] if seen else None


def from_runs(grid: str, fractions: list[float]) -> list[dict]:
    """One row per run with a summary: cell (without the seed), seed, and its accuracy at
    each fraction of its budget (None: no evaluation by then)."""
    rows = []
    for path in sorted(Path(grid).iterdir()):
        if not (path / "summary.json").exists():
            continue
        run = RunDirectory(path)
        budget = run.read_summary()["time_budget"]
        metrics = run.read_metrics()
        row = {"cell": re.sub(r"-\d+$", "", path.name), "seed": path.name.rsplit("-", 1)[1]}
        row.update({f"{f:g}": accuracy_at(metrics, f * budget) for f in fractions})
        rows.append(row)
    return rows


def write(rows: list[dict], out: str) -> None:
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)


def read(path: str) -> tuple[list[dict], list[float]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    fractions = [float(key) for key in rows[0] if key not in ("cell", "seed")]
    for row in rows:
        for f in fractions:
            row[f"{f:g}"] = float(row[f"{f:g}"]) if row[f"{f:g}"] else None
    return rows, fractions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="folder of run directories, or a per-run table (.csv) written by --csv")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0])
    parser.add_argument("--csv", help="write the per-run table here (from a folder of runs)")
    args = parser.parse_args()
    if args.grid.endswith(".csv"):
        rows, fractions = read(args.grid)
    else:
        rows, fractions = from_runs(args.grid, args.fractions), args.fractions
        if args.csv:
            write(rows, args.csv)
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["cell"], []).append(row)
    head = ["cell", "n"] + [f"acc@{f:g}T" for f in fractions]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, runs in groups.items():
        cells = [name, str(len(runs))]
        for fraction in fractions:
            values = [r[f"{fraction:g}"] for r in runs if r[f"{fraction:g}"] is not None]
            cells.append(f"{statistics.mean(values):.3f}" if values else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
