"""A bench's leaderboard tables made again from its committed per-method table, by this
fedhet's statistics: how to read them (the model, the bootstrap intervals, the Holm families
and what survives a correction over all of them), the methods across scenarios (Friedman's
test and Nemenyi's critical difference) and each scenario's table (effects against the best
and the reference with intervals, the Kaplan-Meier time to target, the power line).

    python experiments/leaderboard_tables.py docs/results/data/leaderboard.csv --target 0.7
    python experiments/leaderboard_tables.py docs/results/data/selection.csv --target 0.6 \
        --reference fedavg+uniform --no-tuned

The page that quotes it (docs/results/leaderboard.md) states the bench's settings itself:
a table read back keeps the results, not the suite that made them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedhet.bench.leaderboard import across_lines, build, model_lines, read_csv, scenario_lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a bench's leaderboard.csv")
    parser.add_argument("--target", type=float, default=None, help="the suite's target score")
    parser.add_argument("--reference", default=None, help="the suite's reference (default: fedavg or drop)")
    parser.add_argument(
        "--no-tuned", action="store_true", help="leave out each tuning's values (the CSV keeps them)"
    )
    options = parser.parse_args()
    board = build(read_csv(Path(options.table)), reference=options.reference)
    lines = [*model_lines(board), "", "### Across scenarios", "", *across_lines(board)]
    for name, entries in board.scenarios.items():
        lines += ["", f"### {name}", ""]
        metric, tuned = board.score.metric, not options.no_tuned
        lines += scenario_lines(entries, options.target, board.alpha, metric, board.reference, tuned=tuned)
    print("\n".join(line.replace("## How to read", "### How to read") for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
