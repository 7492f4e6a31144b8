"""The comparisons docs/results/peers.md makes of suites/selection.toml's bench, from its
committed per-method table, with the leaderboard's own test (a paired t-test over the seeds
both ran: the suite tunes each method once), one Holm-corrected family per question:

- "selection against uniform": does Power-of-choice, Oort, TiFL or REFL's selection change a
  round rule's accuracy against the same rule asking 5 clients uniformly at random?
- "new rules against their baselines": FIARSE and FedRolex against HeteroFL, FedBalancer and
  REFL's aggregation against drop-stragglers (each with uniform selection), CA2FL and
  FedCompass against FedBuff.

    python experiments/selection_pairs.py docs/results/data/selection.csv
"""

from __future__ import annotations

import argparse
import sys

from leaderboard_pairs import entries, tests

SCENARIOS = ["devices-trace", "devices-correlated"]
RULES = [
    "fedavg",
    "drop",
    "salf",
    "fedprox",
    "fedstale",
    "heterofl",
    "fedrolex",
    "fiarse",
    "fedbalancer",
    "refl",
]
SELECTIONS = ["powd", "oort", "tifl", "refl-sel"]
BASELINES = [
    ("fiarse+uniform", "heterofl+uniform"),
    ("fedrolex+uniform", "heterofl+uniform"),
    ("fedbalancer+uniform", "drop+uniform"),
    ("refl+uniform", "drop+uniform"),
    ("ca2fl", "fedbuff"),
    ("fedcompass", "fedbuff"),
]
FAMILIES = {
    "selection against uniform": [
        (s, f"{rule}+{sel}", f"{rule}+uniform") for s in SCENARIOS for rule in RULES for sel in SELECTIONS
    ],
    "new rules against their baselines": [(s, a, b) for s in SCENARIOS for a, b in BASELINES],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the selection bench's leaderboard.csv")
    by_key = {key: e for key, e in entries(parser.parse_args().table).items() if e.status == "ok"}
    print("| family | scenario | method | vs | difference of means | p | p Holm |")
    print("|---|---|---|---|---:|---:|---:|")
    for family, pairs in FAMILIES.items():
        ran = [(s, a, b) for s, a, b in pairs if (s, a) in by_key and (s, b) in by_key]
        for scenario, a, b, gap, p, adjusted in tests(ran, by_key):
            print(f"| {family} | {scenario} | {a} | {b} | {gap:+.4f} | {p:.3g} | {adjusted:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
