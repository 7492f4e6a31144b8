"""The comparisons docs/results/peers.md makes beyond the leaderboard's own: SALF against
each of its peers in every scenario both ran, from a bench's per-method table (the
leaderboard's test: a paired t-test over the seeds both ran, these benches having tuned each
method once), Holm-corrected over the whole table.

    python experiments/peers_pairs.py docs/results/data/peers.csv
    python experiments/peers_pairs.py docs/results/data/peers-cnn.csv
"""

from __future__ import annotations

import argparse
import sys

from leaderboard_pairs import entries, tests

REFERENCE = "salf"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a bench's leaderboard.csv")
    parser.add_argument("--reference", default=REFERENCE, help="the method compared with the others")
    args = parser.parse_args()
    by_key = {key: e for key, e in entries(args.table).items() if e.status == "ok"}
    pairs = [
        (scenario, args.reference, method) for scenario, method in by_key
        if method != args.reference and (scenario, args.reference) in by_key
    ]  # fmt: skip
    print(f"| scenario | {args.reference} vs | difference of means | p | p Holm |")
    print("|---|---|---:|---:|---:|")
    for scenario, _, b, difference, p, adjusted in tests(pairs, by_key):
        print(f"| {scenario} | {b} | {difference:+.4f} | {p:.3g} | {adjusted:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
