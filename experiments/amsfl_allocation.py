"""Does an allocation driven by GDA's estimates beat Theorem 3.4's plain sqrt rule? AMSFL
`gda-sqrt` against `sqrt`, GDA charged and free, paired by seed on each dataset: the
difference of final accuracy with its 95% t-interval and a two-sided paired t-test,
Holm-corrected over the table; and the mean local steps per client and round.

    python experiments/amsfl_allocation.py docs/results/data/amsfl-allocation.csv \
        --runs runs/amsfl_allocation_nslkdd
    python experiments/amsfl_allocation.py docs/results/data/amsfl-allocation.csv   # from the table
"""

from __future__ import annotations

import argparse
import csv
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedhet.results import RunDirectory
from fedhet.studies.stats import difference_p_value, estimate, holm

COLUMNS = [
    "dataset",
    "allocation",
    "gda_cost",
    "seed",
    "final_test_accuracy",
    "rounds",
    "mean_steps",
    "fedhet",
]


def write_table(folders: list[str], out: str) -> None:
    rows = []
    for folder in folders:
        for path in sorted(Path(folder).iterdir()):
            run = RunDirectory(path)
            if not run.summary_path.exists() or not run.read_summary().get("finished"):
                continue
            summary = run.read_summary()
            config = tomllib.loads((path / "config.toml").read_text())
            steps = [float(r["mean_steps"]) for r in run.read_metrics() if r.get("mean_steps") is not None]
            algorithm = config["algorithm"]
            rows.append([
                config["data"]["dataset"], algorithm["allocation"], algorithm.get("gda_cost", "charged"),
                config["run"]["seed"], f"{summary['final_test_accuracy']:.6f}", summary["rounds"],
                f"{np.mean(steps):.4f}", summary.get("fedhet", ""),
            ])  # fmt: skip
    rows.sort(key=lambda r: (r[0], r[1], r[2], int(r[3])))
    with open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    print(f"{out}: {len(rows)} runs", file=sys.stderr)


def print_tables(path: str) -> None:
    accuracy: dict[tuple, dict[int, float]] = defaultdict(dict)
    steps: dict[tuple, list[float]] = defaultdict(list)
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            key = (row["dataset"], row["gda_cost"], row["allocation"])
            accuracy[key][int(row["seed"])] = float(row["final_test_accuracy"])
            steps[key].append(float(row["mean_steps"]))
    cells = sorted({(d, c) for d, c, _ in accuracy}, key=lambda k: (k[0] != "nsl-kdd", k[1]))
    p_values = [difference_p_value(accuracy[(*k, "gda-sqrt")], accuracy[(*k, "sqrt")]) for k in cells]
    print(
        "| dataset | GDA | seeds | sqrt | gda-sqrt | gda-sqrt - sqrt | p | p Holm "
        "| mean steps, sqrt / gda-sqrt |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (dataset, cost), p, adjusted in zip(cells, p_values, holm(p_values), strict=True):
        plain, driven = accuracy[(dataset, cost, "sqrt")], accuracy[(dataset, cost, "gda-sqrt")]
        a, b = estimate(list(plain.values()), "ci95"), estimate(list(driven.values()), "ci95")
        d = estimate([driven[s] - plain[s] for s in plain], "ci95")
        shown = (f"{np.mean(steps[(dataset, cost, 'sqrt')]):.2f} / "
                 f"{np.mean(steps[(dataset, cost, 'gda-sqrt')]):.2f}")  # fmt: skip
        print(
            f"| {dataset} | {cost} | {a.n} | {a.mean:.4f} ± {a.spread:.4f} | {b.mean:.4f} ± {b.spread:.4f} | "
            f"{d.mean:+.4f} ± {d.spread:.4f} | {p:.3g} | {adjusted:.3g} | {shown} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the per-run table (written with --runs, read otherwise)")
    parser.add_argument("--runs", nargs="+", help="finished grid folders")
    args = parser.parse_args()
    if args.runs:
        write_table(args.runs, args.table)
    print_tables(args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
