"""Test accuracy at fractions of the time budget, averaged over the seeds of a grid.

    python experiments/accuracy_at_times.py runs/adelfl_fig2 [--fractions 0.1 0.25 0.5 1]

Each run's accuracy at time t is its last evaluation at or before t (simulated clock).
Runs are grouped by cell name without its trailing seed (``...-1``, ``...-2``).
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from fedhet.results import RunDirectory


def accuracy_at(rows: list[dict], time: float) -> float | None:
    seen = [r for r in rows if r["test_accuracy"] is not None and r["sim_time"] <= time + 1e-9]
    return seen[-1]["test_accuracy"] if seen else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="folder of run directories")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0])
    args = parser.parse_args()
    groups: dict[str, list[RunDirectory]] = {}
    for path in sorted(Path(args.grid).iterdir()):
        if (path / "summary.json").exists():
            groups.setdefault(re.sub(r"-\d+$", "", path.name), []).append(RunDirectory(path))
    head = ["cell", "n"] + [f"acc@{f:g}T" for f in args.fractions]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, runs in groups.items():
        budget = runs[0].read_summary()["time_budget"]
        cells = [name, str(len(runs))]
        for fraction in args.fractions:
            values = [accuracy_at(r.read_metrics(), fraction * budget) for r in runs]
            values = [v for v in values if v is not None]
            cells.append(f"{statistics.mean(values):.3f}" if values else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
