"""AMSFL Fig. 1 ("accuracy distribution across 50 trials": AMSFL has a high median and the
least variance) as a test: the final accuracy of each method over the seeds, and for each
AMSFL variant and each baseline whether their variances differ, by the Pitman-Morgan test
on the seed pairs (the same seed gives every method the same data split and initial model)
and, as a check that needs no normality, the Brown-Forsythe test (Levene's around medians),
both Holm-corrected over the table.

    python experiments/amsfl_variance.py docs/results/data/amsfl-variance.csv \
        --figure docs/results/figures/amsfl-variance.png
    # from a finished grid (writes the committed per-run table first):
    python experiments/amsfl_variance.py docs/results/data/amsfl-variance.csv --runs runs/amsfl_variance
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedhet.results import RunDirectory
from fedhet.studies.stats import estimate, holm, paired_variance_p_value

BASELINES = ["fedavg", "fedprox", "fednova", "scaffold", "feddyn"]
COLUMNS = ["method", "seed", "final_test_accuracy", "rounds", "fedhet"]


def method(config: dict) -> str:
    """``fedavg`` .. ``feddyn``, or ``amsfl sqrt (GDA charged|free)``."""
    algorithm = config["algorithm"]
    if algorithm["name"] != "amsfl":
        return algorithm["name"]
    return f"amsfl {algorithm.get('allocation', 'marginal')} (GDA {algorithm.get('gda_cost', 'charged')})"


def write_table(runs: str, out: str) -> None:
    """One row per finished run of the grid: method, seed, final accuracy, rounds, build."""
    rows = []
    for path in sorted(Path(runs).iterdir()):
        run = RunDirectory(path)
        if not run.summary_path.exists() or not run.read_summary().get("finished"):
            continue
        summary = run.read_summary()
        config = tomllib.loads((path / "config.toml").read_text())
        rows.append(
            [
                method(config),
                config["run"]["seed"],
                f"{summary['final_test_accuracy']:.6f}",
                summary["rounds"],
                summary.get("fedhet", ""),
            ]
        )
    rows.sort(key=lambda r: (r[0], int(r[1])))
    with open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    print(f"{out}: {len(rows)} runs", file=sys.stderr)


def read_table(path: str) -> dict[str, dict[int, float]]:
    """{method: {seed: final accuracy}} from the per-run table."""
    table: dict[str, dict[int, float]] = defaultdict(dict)
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            table[row["method"]][int(row["seed"])] = float(row["final_test_accuracy"])
    return dict(table)


def order(methods) -> list[str]:
    return sorted(
        methods, key=lambda m: (m.startswith("amsfl"), BASELINES.index(m) if m in BASELINES else 0, m)
    )


def print_tables(table: dict[str, dict[int, float]]) -> None:
    from scipy.stats import levene

    print("| method | seeds | median | interquartile range | mean ± 95% CI | standard deviation |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in order(table):
        values = list(table[name].values())
        q1, q3 = np.percentile(values, [25, 75])
        e = estimate(values, "ci95")
        print(
            f"| {name} | {len(values)} | {statistics.median(values):.4f} | {q3 - q1:.4f} | "
            f"{e.mean:.4f} ± {e.spread:.4f} | {statistics.stdev(values):.4f} |"
        )
    print()
    pairs = [(a, b) for a in order(table) if a.startswith("amsfl") for b in BASELINES if b in table]
    pitman = [paired_variance_p_value(table[a], table[b]) for a, b in pairs]
    brown = [
        float(levene(list(table[a].values()), list(table[b].values()), center="median").pvalue)
        for a, b in pairs
    ]
    print(
        "| AMSFL variant | baseline | sd ratio (AMSFL / baseline) | Pitman-Morgan p | Holm | "
        "Brown-Forsythe p | Holm |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for (a, b), p, p_holm, q, q_holm in zip(pairs, pitman, holm(pitman), brown, holm(brown), strict=True):
        ratio = statistics.stdev(table[a].values()) / statistics.stdev(table[b].values())
        print(f"| {a} | {b} | {ratio:.2f} | {p:.3g} | {p_holm:.3g} | {q:.3g} | {q_holm:.3g} |")


def plot(table: dict[str, dict[int, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = order(table)
    values = [list(table[n].values()) for n in names]
    fig, (box, violin) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    box.boxplot(values)
    violin.violinplot(values, showmedians=True)
    for ax, title in ((box, "(A) box plot"), (violin, "(B) violin plot")):
        ax.set_xticks(range(1, len(names) + 1), [n.replace(" (", "\n(") for n in names], fontsize=8)
        ax.set_title(f"{title}, {len(values[0])} seeds")
        ax.grid(axis="y", alpha=0.3)
    box.set_ylabel("final test accuracy (NSL-KDD holdout)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the per-run table (read; written first with --runs)")
    parser.add_argument("--runs", help="a finished experiments/amsfl_variance.toml grid folder")
    parser.add_argument("--figure", help="write the box and violin plots here")
    args = parser.parse_args()
    if args.runs:
        write_table(args.runs, args.table)
    table = read_table(args.table)
    print_tables(table)
    if args.figure:
        plot(table, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
