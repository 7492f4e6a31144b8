"""The comparisons docs/results/peers.md makes of suites/selection.toml's bench, from its
committed per-method table, one Holm-corrected family per question:

- "selection against uniform, across rules": does Power-of-choice, Oort, TiFL or REFL's
  selection change accuracy against asking 5 clients uniformly at random, over the round
  rules? In each scenario, each rule r that ran with both gives a difference per seed s,
  d[r, s] = its accuracy with the selection less with uniform. The model is
  d[r, s] = mu + u_s + e[r, s]: every rule's seed s shares its split, devices and
  availability, so the seed is a random effect and the rules are not independent units.
  In this balanced design the test of mu = 0 is the one-sample t-test of the seeds' mean
  differences (over the rules), with S - 1 degrees of freedom (the mixed model's F-test on
  the fixed intercept). The rules-as-units p, which pseudo-replicates, is printed beside it
  and used for nothing.
- "new rules against their baselines": FIARSE and FedRolex against HeteroFL, FedBalancer and
  REFL's aggregation against drop-stragglers (each with uniform selection), CA2FL and
  FedCompass against FedBuff, with the leaderboard's own test (a paired t-test over the
  seeds both ran: the suite tunes each method once).

Rows made before a rule's fix (``PRE_FIX``: TimelyFL's, whose time draws went through the
selection) are left out of the first family. The rules and selections are read from the
table (every ``<rule>+uniform`` and every ``<rule>+<selection>`` beside it).

    python experiments/selection_pairs.py docs/results/data/selection.csv
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
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


PRE_FIX = {
    "timelyfl": "its rows with any selection were made before TimelyFL's time draws stopped going through it"
}


def seed_differences(by_key: dict, scenario: str, rule: str, selection: str) -> dict[int, float]:
    """Per seed both ran: the rule's accuracy with ``selection`` less with uniform."""
    chosen, uniform = by_key[(scenario, f"{rule}+{selection}")], by_key[(scenario, f"{rule}+{UNIFORM}")]
    a, b = chosen.units(), uniform.units()
    return {seed: a[seed] - b[seed] for seed in sorted(set(a) & set(b))}


def across_rules(by_key: dict) -> list[tuple]:
    """(scenario, selection, rules, mean difference, rules above uniform, p with the seed a
    random effect, p with the rules as units) for each scenario and selection."""
    scenarios = list(dict.fromkeys(s for s, _ in by_key))
    selections = list(dict.fromkeys(m.partition("+")[2] for _, m in by_key if "+" in m))
    out = []
    for scenario in scenarios:
        rules = [m.partition("+")[0] for s, m in by_key if s == scenario and m.endswith(f"+{UNIFORM}")]
        rules = [r for r in rules if r not in PRE_FIX]
        for selection in [s for s in selections if s != UNIFORM]:
            ran = [r for r in rules if (scenario, f"{r}+{selection}") in by_key]
            per_rule = {r: seed_differences(by_key, scenario, r, selection) for r in ran}
            gaps = [sum(d.values()) / len(d) for d in per_rule.values() if d]
            seeds = sorted({s for d in per_rule.values() for s in d})
            seed_means = [float(np.mean([d[s] for d in per_rule.values() if s in d])) for s in seeds]
            p_seed = float(stats.ttest_1samp(seed_means, 0.0).pvalue) if len(seed_means) > 1 else float("nan")
            p_rules = float(stats.ttest_1samp(gaps, 0.0).pvalue) if len(gaps) > 1 else float("nan")
            out.append((scenario, selection, len(gaps), float(np.mean(gaps)), sum(g > 0 for g in gaps),
                        p_seed, p_rules))  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the selection bench's leaderboard.csv")
    by_key = {key: e for key, e in entries(parser.parse_args().table).items() if e.status == "ok"}
    rows = across_rules(by_key)
    print(f"Left out of the first family: {', '.join(f'{r} ({why})' for r, why in PRE_FIX.items())}.")
    print()
    print("| family | scenario | selection | rules | mean difference from uniform | rules above uniform "
          "| p (seed a random effect) | p Holm | p if rules were independent (not used) |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for (scenario, selection, n, gap, above, p, p_rules), adjusted in zip(
        rows, holm([r[5] for r in rows]), strict=True
    ):
        print(f"| selection against uniform, across rules | {scenario} | {selection} | {n} | {gap:+.4f} "
              f"| {above} | {p:.3g} | {adjusted:.3g} | {p_rules:.3g} |")  # fmt: skip
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
