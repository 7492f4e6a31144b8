"""Power-of-choice's Fashion-MNIST setting (experiments/powd_fmnist.toml): each selection's
final test accuracy and the rounds it took to reach 70/75/80%, beside random selection, from
a per-run table; power-of-choice against random selection is one family of paired t-tests
over the seeds (same seed, same data partition and initial model), Holm-corrected.

    python experiments/powd_table.py docs/results/data/powd-fmnist.csv
    python experiments/powd_table.py docs/results/data/powd-fmnist.csv --runs runs/powd_fmnist
      (first writes the per-run table from the grid's run folders)
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from fedhet.studies.stats import difference_p_value, estimate, holm

TARGETS = (0.70, 0.75, 0.80)
FIELDS = [
    "rule",
    "candidates",
    "alpha",
    "seed",
    "final_test_accuracy",
    *[f"rounds_to_{t:.2f}" for t in TARGETS],
]


def rounds_to(metrics: Path, target: float) -> str:
    """The first evaluated round whose test accuracy reaches ``target`` ('' if none)."""
    with open(metrics, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["test_accuracy"] and float(row["test_accuracy"]) >= target:
                return row["round"]
    return ""


def collect(runs: Path, out: Path) -> None:
    """The per-run table from the grid's cells.csv and each run's metrics.csv."""
    with open(runs / "cells.csv", newline="") as fh:
        cells = list(csv.DictReader(fh))
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(FIELDS)
        for cell in cells:
            metrics = runs / cell["cell"] / "metrics.csv"
            rule = cell["selection.rule"]
            candidates = cell["selection.candidates"] if rule == "power-of-choice" else ""
            writer.writerow([rule, candidates, cell["data.alpha"], cell["seed"], cell["final_test_accuracy"],
                             *[rounds_to(metrics, t) for t in TARGETS]])  # fmt: skip


def load(table: Path) -> dict:
    """(alpha, setting) -> {seed: row}; a setting is "rand" or "pow-d d"."""
    out: dict = {}
    with open(table, newline="") as fh:
        for row in csv.DictReader(fh):
            setting = "rand" if row["rule"] == "uniform" else f"pow-d d={row['candidates']}"
            out.setdefault((row["alpha"], setting), {})[row["seed"]] = row
    return out


def median_rounds(rows: dict, target: float) -> str:
    """The median over seeds of the rounds to ``target`` (a seed that never reached it counts
    as beyond every round: '>' when the median is one of those)."""
    values = [
        float(r[f"rounds_to_{target:.2f}"]) if r[f"rounds_to_{target:.2f}"] else np.inf for r in rows.values()
    ]
    median = float(np.median(values))
    return f"{median:.0f}" if np.isfinite(median) else "not reached"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="the per-run table (written first with --runs)")
    parser.add_argument("--runs", type=Path, help="the grid's output folder, to write the table from")
    args = parser.parse_args()
    if args.runs:
        collect(args.runs, args.table)
    data = load(args.table)
    accuracy = {
        key: {s: float(r["final_test_accuracy"]) for s, r in rows.items()} for key, rows in data.items()
    }
    compared = [key for key in sorted(data) if key[1] != "rand"]
    p = [difference_p_value(accuracy[key], accuracy[(key[0], "rand")]) for key in compared]
    adjusted = dict(zip(compared, holm(p), strict=True))
    raw = dict(zip(compared, p, strict=True))
    heads = " | ".join(f"rounds to {t:.0%}" for t in TARGETS)
    print(f"| alpha | selection | final accuracy (95% CI) | vs rand | p | p Holm | {heads} |")
    print("|---|---|---:|---:|---:|---:|" + "---:|" * len(TARGETS))
    for key in sorted(data, key=lambda k: (float(k[0]), k[1] != "rand", len(k[1]), k[1])):
        e = estimate(list(accuracy[key].values()), "ci95")
        rounds = " | ".join(median_rounds(data[key], t) for t in TARGETS)
        if key[1] == "rand":
            print(f"| {key[0]} | {key[1]} | {e.mean:.4f} ± {e.spread:.4f} | | | | {rounds} |")
            continue
        base = accuracy[(key[0], "rand")]
        diff = float(np.mean([accuracy[key][s] - base[s] for s in accuracy[key] if s in base]))
        print(f"| {key[0]} | {key[1]} | {e.mean:.4f} ± {e.spread:.4f} | {diff:+.4f} | {raw[key]:.3g} | "
              f"{adjusted[key]:.3g} | {rounds} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
