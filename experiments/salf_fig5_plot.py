"""Fig. 5 of SALF from `fedhet reproduce experiments/salf_fig5.toml`: final test accuracy
against the deadline, one line per method.

    python experiments/salf_fig5_plot.py [runs/salf_fig5] [--out docs/results/figures/salf-fig5.png]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedhet.studies.plots import algorithm_color  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default="runs/salf_fig5")
    parser.add_argument("--out", default="docs/results/figures/salf-fig5.png")
    args = parser.parse_args()
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for summary_path in sorted(Path(args.runs).glob("*/summary.json")):
        summary = json.loads(summary_path.read_text())
        config = (summary_path.parent / "config.toml").read_text()
        deadline = float(
            next(line.split("=")[1] for line in config.splitlines() if line.startswith("deadline"))
        )
        points[summary["algorithm"]].append((deadline * 1e3, summary["final_test_accuracy"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for algorithm, values in sorted(points.items()):
        values.sort()
        ax.plot([x for x, _ in values], [y for _, y in values], marker="o", label=algorithm,
                color=algorithm_color(algorithm))  # fmt: skip
    ax.set_xlabel("deadline [ms] (slowest user's full pass: 1.9 ms)")
    ax.set_ylabel("final test accuracy")
    ax.set_title("cnn2 on Fashion-MNIST, measured layer times, 30 users")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
