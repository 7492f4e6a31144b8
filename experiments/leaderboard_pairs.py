"""The comparisons docs/results/leaderboard.md makes beyond the leaderboard's own (each
paper's method against the baselines it claims to beat, in its own scenario, and each peer
the suite added against the rule it extends, in every scenario where both ran), from the
committed per-method table, with the leaderboard's own test (``fedhet.bench.leaderboard.
difference``: over the tunings' means, Welch, when each method was tuned more than once; a
paired t-test over the seeds both ran when tuned once), Holm-corrected within each paper's
family of comparisons, and over all the families' tests together.

    python experiments/leaderboard_pairs.py docs/results/data/leaderboard.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedhet.bench.leaderboard import Entry, build, difference, friedman_sentence, power_line, read_csv
from fedhet.studies.stats import holm

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
# The peers added to the suite, each against the rule it extends, in every scenario both ran
# in (a rule refused by a scenario, n/a, is left out of its family)
SCENARIOS = [*STRAGGLERS, "time-budget", "stale-participation", "per-step-budget"]
EXTENDS = {
    "FedRolex against HeteroFL": ("fedrolex", "heterofl"),
    "FIARSE against HeteroFL": ("fiarse", "heterofl"),
    "REFL against AsyncFL": ("refl", "asyncfl"),
    "FedBalancer against drop-stragglers": ("fedbalancer", "drop"),
    "CA2FL against FedBuff": ("ca2fl", "fedbuff"),
    "FedCompass against FedBuff": ("fedcompass", "fedbuff"),
    "FADAS against FedBuff": ("fadas", "fedbuff"),  # FedBuff's buffer with an AMSGrad server step
    "Ringmaster ASGD against FedBuff": ("ringmaster", "fedbuff"),  # each arrival at once, stale ones dropped
    "FedAWE against FedAvg": ("fedawe", "fedavg"),  # FedAvg when every client takes part every round
    "SLT against HeteroFL": ("slt", "heterofl"),  # HeteroFL's leading units, layer by layer
}
FAMILIES.update({family: [(s, a, b) for s in SCENARIOS] for family, (a, b) in EXTENDS.items()})


def entries(table: str | Path) -> dict[tuple[str, str], Entry]:
    """A bench's leaderboard.csv as its leaderboard's entries, by (scenario, method)."""
    board = build(read_csv(Path(table)))
    return {(e.scenario, e.method): e for listed in board.scenarios.values() for e in listed}


def tests(pairs: list[tuple[str, str, str]], by_key: dict[tuple[str, str], Entry]) -> list[tuple]:
    """(scenario, a, b, difference of means, p, Holm p) for each pair (scenario, a, b) whose
    two methods both ran there, the leaderboard's test, Holm-corrected over those pairs."""
    ran = {key for key, entry in by_key.items() if entry.status == "ok" and entry.mean is not None}
    pairs = [(s, a, b) for s, a, b in pairs if {(s, a), (s, b)} <= ran]
    p_values = [difference(by_key[(s, a)], by_key[(s, b)]) for s, a, b in pairs]
    out = []
    for (scenario, a, b), p, adjusted in zip(pairs, p_values, holm(p_values), strict=True):
        gap = (by_key[(scenario, a)].mean or 0.0) - (by_key[(scenario, b)].mean or 0.0)
        out.append((scenario, a, b, gap, p, adjusted))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a bench's leaderboard.csv")
    table = parser.parse_args().table
    by_key = entries(table)
    print("| family | scenario | method | vs | difference of means | p | p Holm | p Holm over all |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    done = [(family, *row) for family, pairs in FAMILIES.items() for row in tests(pairs, by_key)]
    over_all = holm([row[5] for row in done])
    for (family, scenario, a, b, gap, p, adjusted), total in zip(done, over_all, strict=True):
        print(f"| {family} | {scenario} | {a} | {b} | {gap:+.4f} | {p:.3g} | {adjusted:.3g} | {total:.3g} |")
    within = sum(1 for row in done if row[6] < 0.05)
    kept = sum(1 for row, total in zip(done, over_all, strict=True) if row[6] < 0.05 and total < 0.05)
    print()
    print(
        f"{len(FAMILIES)} families, {len(done)} tests: {within} significant within their family (Holm, "
        f"0.05), {kept} of them also when Holm's correction runs over all {len(done)} tests together."
    )
    board = build(read_csv(Path(table)))
    print_across(board.across)
    print()
    for name, listed in board.scenarios.items():
        print(f"- {name}: {power_line(listed, board.alpha, board.score.metric)}")
    return 0


def print_across(test) -> None:
    """Friedman's test over the scenarios and who Nemenyi's critical difference tells apart
    from the best mean rank (:mod:`fedhet.bench.aggregate`)."""
    print()
    print(friedman_sentence(test))
    if test is not None:
        best = min(test.mean_ranks, key=test.mean_ranks.__getitem__)
        apart = [m for m in test.methods if not test.near_best(m)]
        print(
            f"Told apart from the best mean rank ({best}, {test.mean_ranks[best]:.2f}) at that critical "
            f"difference: {', '.join(apart) or 'none'}; every other method of the test is within it."
        )


if __name__ == "__main__":
    sys.exit(main())
