"""Fig. 5 of SALF from the per-run tables of `fedhet reproduce experiments/salf_fig5.toml` and
`experiments/salf_fig5_fedbuff.toml` (the ``cells.csv`` each writes beside its runs): final
test accuracy against the deadline, one line per method, mean over seeds with a band of its
95% t-interval; prints the table.

    python experiments/salf_fig5_plot.py docs/results/data/salf-fig5.csv \
        docs/results/data/salf-fig5-fedbuff.csv [--out docs/results/figures/salf-fig5.png]

FedBuff has no deadline: its run with time budget 150 x deadline is placed at that deadline.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedhet.studies.plots import algorithm_color  # noqa: E402
from fedhet.studies.stats import estimate  # noqa: E402

ROUNDS = 150  # the synchronous methods' rounds: FedBuff's budget is ROUNDS x deadline


LABELS = {  # a run's algorithm -> its line on the page
    "drop": "drop",
    "salf": "SALF",
    "heterofl": "HeteroFL (multiply-adds)",
    "heterofl-rate-squared": "HeteroFL (r^2)",
    "asyncfl": "AsyncFL (stale)",
    "fedbuff": "FedBuff",
}


def collect(tables: list[str]) -> dict[str, dict[float, list[float]]]:
    """{algorithm: {deadline in ms: [final accuracy per seed]}} from the per-run tables; an
    algorithm with options set is named after them (``heterofl-rate-squared``). A table
    without ``system.deadline`` is FedBuff's, placed at its time budget / 150."""
    points: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in tables:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if "system.deadline" in row:
                    deadline = float(row["system.deadline"])
                    options = [
                        v
                        for k, v in row.items()
                        if k.startswith("algorithm.") and k != "algorithm.name" and v
                    ]
                    name = "-".join([row["algorithm.name"], *options])
                else:
                    deadline, name = float(row["run.time_budget"]) / ROUNDS, "fedbuff"
                points[name][round(deadline * 1e3, 6)].append(float(row["final_test_accuracy"]))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="per-run tables (cells.csv of the two grids)")
    parser.add_argument("--out", help="write the figure here (.png)")
    args = parser.parse_args()
    for path in args.tables:
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such per-run table")
    points = collect(args.tables)
    seeds = sorted({len(v) for by_deadline in points.values() for v in by_deadline.values()})
    print(f"Final test accuracy, mean ± 95% t-interval over {'/'.join(map(str, seeds))} seeds\n")
    deadlines = sorted({d for by_deadline in points.values() for d in by_deadline})
    print("| deadline (ms) | " + " | ".join(f"{d:g}" for d in deadlines) + " |")
    print("|---" * (len(deadlines) + 1) + "|")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    order = [a for a in LABELS if a in points] + sorted(set(points) - set(LABELS))
    for algorithm in order:
        by_deadline = points[algorithm]
        xs = sorted(by_deadline)
        estimates = [estimate(by_deadline[x], "ci95") for x in xs]
        means = np.array([e.mean for e in estimates])
        spreads = np.array([e.spread for e in estimates])
        cells = {x: f"{e.mean:.3f} ± {e.spread:.3f}" for x, e in zip(xs, estimates, strict=True)}
        label = LABELS.get(algorithm, algorithm)
        print(f"| {label} | " + " | ".join(cells.get(d, "") for d in deadlines) + " |")
        color = algorithm_color(algorithm)
        style = "--" if algorithm != algorithm.split("-")[0] else "-"
        ax.plot(xs, means, marker="o", label=label, color=color, linestyle=style)
        ax.fill_between(xs, means - spreads, means + spreads, color=color, alpha=0.15)
    ax.set_xlabel("deadline [ms] (slowest user's full pass: 1.9 ms)")
    ax.set_ylabel("final test accuracy (mean, 95% t-interval)")
    ax.set_ylim(0.0, 1.0)  # accuracy; a 3-seed t-interval can reach past either end
    ax.set_title("cnn2 on Fashion-MNIST, measured layer times, 30 users")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
