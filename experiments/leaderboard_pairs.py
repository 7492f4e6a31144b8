"""The paired comparisons docs/results/leaderboard.md makes beyond the leaderboard's own
(each paper's method against the baselines it claims to beat, in its own scenario), from
the committed per-method table: a paired t-test over the seeds both ran, Holm-corrected
within each paper's family of comparisons.

    python experiments/leaderboard_pairs.py docs/results/data/leaderboard.csv
"""

from __future__ import annotations

import argparse
import csv
import sys

from fedhet.studies.stats import difference_p_value, holm

STRAGGLERS = ["random-50", "random-90", "persistent-50", "persistent-90"]
FAMILIES = {
    "SALF against drop-stragglers": [(s, "salf", "drop") for s in STRAGGLERS],
    "SALF against FedAvg": [(s, "salf", "fedavg") for s in STRAGGLERS],
    "ADEL-FL": [("time-budget", "adel-fl", m) for m in ("salf", "drop", "fedavg", "heterofl")],
    "FedStale": [("stale-participation", "fedstale", m) for m in ("u-fedavg", "fedvarp", "fedavg")],
    "AMSFL": [
        ("per-step-budget", "amsfl", m) for m in ("fedavg", "fedprox", "fednova", "scaffold", "feddyn")
    ],
}


def accuracy_by_seed(row: dict) -> dict[int, float]:
    """A leaderboard row's ``accuracy_by_seed`` ("1:0.78;2:0.79;...") as {seed: accuracy}."""
    return {int(k): float(v) for k, v in (pair.split(":") for pair in row["accuracy_by_seed"].split(";"))}


def paired_tests(pairs: list[tuple[str, str, str]], seeds) -> list[tuple]:
    """(scenario, a, b, difference of means, p, Holm p) for each pair (scenario, a, b): a
    paired t-test over the seeds both ran (``seeds(scenario, method)`` -> {seed: value}),
    Holm-corrected over ``pairs``."""
    p_values = [difference_p_value(seeds(s, a), seeds(s, b)) for s, a, b in pairs]
    out = []
    for (scenario, a, b), p, adjusted in zip(pairs, p_values, holm(p_values), strict=True):
        x, y = seeds(scenario, a), seeds(scenario, b)
        out.append((scenario, a, b, sum(x.values()) / len(x) - sum(y.values()) / len(y), p, adjusted))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a bench's leaderboard.csv")
    rows = {(r["scenario"], r["method"]): r for r in csv.DictReader(open(parser.parse_args().table))}

    def seeds(scenario: str, method: str) -> dict[int, float]:
        return accuracy_by_seed(rows[(scenario, method)])

    print("| family | scenario | method | vs | difference of means | p | p Holm |")
    print("|---|---|---|---|---:|---:|---:|")
    for family, pairs in FAMILIES.items():
        for scenario, a, b, difference, p, adjusted in paired_tests(pairs, seeds):
            print(f"| {family} | {scenario} | {a} | {b} | {difference:+.4f} | {p:.3g} | {adjusted:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
