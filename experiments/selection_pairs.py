"""The comparisons docs/results/peers.md makes of suites/selection.toml's bench, from its
committed per-method table, one Holm-corrected family per question:

- "selection against uniform, across rules": does Power-of-choice, Oort, TiFL or REFL's
  selection change accuracy against asking 5 clients uniformly at random, over the round
  rules? In each scenario, each rule that ran with both gives one difference (its mean over
  the seeds with the selection, less its mean with uniform); the test is a one-sample
  t-test of those differences against 0, the rules being the unit.
- "new rules against their baselines": FIARSE and FedRolex against HeteroFL, FedBalancer and
  REFL's aggregation against drop-stragglers (each with uniform selection), CA2FL and
  FedCompass against FedBuff, with the leaderboard's own test (a paired t-test over the
  seeds both ran: the suite tunes each method once).

The rules and selections are read from the table (every ``<rule>+uniform`` and every
``<rule>+<selection>`` beside it).

    python experiments/selection_pairs.py docs/results/data/selection.csv
"""

from __future__ import annotations

import argparse
import sys

from leaderboard_pairs import entries, tests
from scipy import stats

from fedhet.studies.stats import holm

UNIFORM = "uniform"
BASELINES = [
    ("fiarse+uniform", "heterofl+uniform"),
    ("fedrolex+uniform", "heterofl+uniform"),
    ("fedbalancer+uniform", "drop+uniform"),
    ("refl+uniform", "drop+uniform"),
    ("ca2fl", "fedbuff"),
    ("fedcompass", "fedbuff"),
]


def across_rules(by_key: dict) -> list[tuple]:
    """(scenario, selection, rules, mean difference, rules above uniform, p) for each
    scenario and selection: the differences from uniform over the rules that ran both."""
    scenarios = list(dict.fromkeys(s for s, _ in by_key))
    selections = list(dict.fromkeys(m.partition("+")[2] for _, m in by_key if "+" in m))
    out = []
    for scenario in scenarios:
        rules = [m.partition("+")[0] for s, m in by_key if s == scenario and m.endswith(f"+{UNIFORM}")]
        for selection in [s for s in selections if s != UNIFORM]:
            gaps = [
                by_key[(scenario, f"{r}+{selection}")].mean - by_key[(scenario, f"{r}+{UNIFORM}")].mean
                for r in rules
                if (scenario, f"{r}+{selection}") in by_key
            ]
            p = float(stats.ttest_1samp(gaps, 0.0).pvalue) if len(gaps) > 1 else float("nan")
            out.append((scenario, selection, len(gaps), sum(gaps) / len(gaps), sum(g > 0 for g in gaps), p))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the selection bench's leaderboard.csv")
    by_key = {key: e for key, e in entries(parser.parse_args().table).items() if e.status == "ok"}
    rows = across_rules(by_key)
    print("| family | scenario | selection | rules | mean difference from uniform | rules above uniform "
          "| p | p Holm |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (scenario, selection, n, gap, above, p), adjusted in zip(
        rows, holm([r[-1] for r in rows]), strict=True
    ):
        print(f"| selection against uniform, across rules | {scenario} | {selection} | {n} | {gap:+.4f} "
              f"| {above} | {p:.3g} | {adjusted:.3g} |")  # fmt: skip
    print()
    print("| family | scenario | method | vs | difference of means | p | p Holm |")
    print("|---|---|---|---|---:|---:|---:|")
    scenarios = list(dict.fromkeys(s for s, _ in by_key))
    pairs = [(s, a, b) for s in scenarios for a, b in BASELINES if (s, a) in by_key and (s, b) in by_key]
    for scenario, a, b, gap, p, adjusted in tests(pairs, by_key):
        print(f"| new rules against their baselines | {scenario} | {a} | {b} | {gap:+.4f} | {p:.3g} "
              f"| {adjusted:.3g} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
