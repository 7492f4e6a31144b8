"""The paired comparisons docs/results/peers.md makes beyond the leaderboard's own: SALF
against each of its peers in every scenario both ran, from a bench's per-method table (a
paired t-test over the seeds both ran), Holm-corrected over the whole table.

    python experiments/peers_pairs.py docs/results/data/peers.csv
    python experiments/peers_pairs.py docs/results/data/peers-cnn.csv
"""

from __future__ import annotations

import argparse
import csv
import sys

from leaderboard_pairs import accuracy_by_seed, paired_tests

REFERENCE = "salf"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a bench's leaderboard.csv")
    parser.add_argument("--reference", default=REFERENCE, help="the method compared with the others")
    args = parser.parse_args()
    with open(args.table, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok"]
    by_key = {(r["scenario"], r["method"]): r for r in rows}

    def seeds(scenario: str, method: str) -> dict[int, float]:
        return accuracy_by_seed(by_key[(scenario, method)])

    pairs = [
        (r["scenario"], args.reference, r["method"]) for r in rows
        if r["method"] != args.reference and (r["scenario"], args.reference) in by_key
    ]  # fmt: skip
    print(f"| scenario | {args.reference} vs | difference of means | p | p Holm |")
    print("|---|---|---:|---:|---:|")
    for scenario, _, b, difference, p, adjusted in paired_tests(pairs, seeds):
        print(f"| {scenario} | {b} | {difference:+.4f} | {p:.3g} | {adjusted:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
