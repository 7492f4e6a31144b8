"""The comparisons docs/results/peers.md makes of suites/selection.toml's bench, from its
committed per-method table, one Holm-corrected family per question:

- "selection against uniform, across rules": does Power-of-choice, Oort, TiFL or REFL's
  selection change accuracy against asking 5 clients uniformly at random, over the round
  rules? In each scenario, each rule r that ran with both gives a difference per seed s,
  d[r, s] = its accuracy with the selection less with uniform, each side averaged over its
  tunings at that seed. The model is d[r, s] = mu + u_s + e[r, s]: every rule's seed s
  shares its split, devices and availability, so the seed is a random effect and the rules
  are not independent units. In this balanced design the test of mu = 0 is the one-sample
  t-test of the seeds' mean differences (over the rules), with S - 1 degrees of freedom (the
  mixed model's F-test on the fixed intercept); it holds the tuned settings fixed. The
  interval beside it is the bench's hierarchical bootstrap (fedhet.bench.model: seeds drawn
  once for every method, each method's tunings drawn on their own), which lets the tunings
  vary too. The rules-as-units p, which pseudo-replicates, is printed beside them and used
  for nothing.
- "new rules against their baselines": FIARSE and FedRolex against HeteroFL, FedBalancer and
  REFL's aggregation against drop-stragglers (each with uniform selection), CA2FL and
  FedCompass against FedBuff, with the leaderboard's own test (Welch's t-test over the
  tunings' means: the suite tunes each method five times).

Rows made before a rule's fix (``PRE_FIX``, rule -> why; none in the committed table, whose
TimelyFL rows were made after its time draws stopped going through the selection) are left
out of the first family. The rules and selections are read from the table (every
``<rule>+uniform`` and every ``<rule>+<selection>`` beside it).

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


PRE_FIX: dict[str, str] = {}


def seed_scores(entry) -> dict[int, float]:
    """Seed -> the entry's test score at that seed, averaged over its tunings that ran it."""
    by_seed: dict[int, list[float]] = {}
    for tuned in entry.tunings:
        for seed, value in tuned.scores.items():
            by_seed.setdefault(seed, []).append(value)
    return {seed: float(np.mean(values)) for seed, values in sorted(by_seed.items())}


def seed_differences(by_key: dict, scenario: str, rule: str, selection: str) -> dict[int, float]:
    """Per seed both ran: the rule's accuracy with ``selection`` less with uniform (each
    averaged over its tunings)."""
    a = seed_scores(by_key[(scenario, f"{rule}+{selection}")])
    b = seed_scores(by_key[(scenario, f"{rule}+{UNIFORM}")])
    return {seed: a[seed] - b[seed] for seed in sorted(set(a) & set(b))}


def bootstrap_gap(by_key: dict, scenario: str, rules: list[str], selection: str) -> tuple[float, float]:
    """The 95% hierarchical-bootstrap interval of the mean over ``rules`` of (with
    ``selection`` less with uniform): seeds drawn once for every method (paired), each
    method's tunings drawn on their own (fedhet.bench.model)."""
    from fedhet.bench.model import replicate_means, score_matrix

    names = [f"{r}+{sel}" for r in rules for sel in (selection, UNIFORM)]
    seeds = sorted({seed for n in names for t in by_key[(scenario, n)].tunings for seed in t.scores})
    tables = {n: score_matrix([t for t in by_key[(scenario, n)].tunings if t.scores], seeds) for n in names}
    draws = replicate_means(tables, len(seeds), scenario)
    gaps = np.mean([draws[f"{r}+{selection}"] - draws[f"{r}+{UNIFORM}"] for r in rules], axis=0)
    low, high = np.nanpercentile(gaps, [2.5, 97.5])
    return float(low), float(high)


def across_rules(by_key: dict) -> list[tuple]:
    """(scenario, selection, rules, mean difference, its bootstrap interval, rules above
    uniform, p with the seed a random effect, p with the rules as units) for each scenario
    and selection."""
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
            interval = bootstrap_gap(by_key, scenario, [r for r in ran if per_rule[r]], selection)
            above = sum(g > 0 for g in gaps)
            gap = float(np.mean(gaps))
            out.append((scenario, selection, len(gaps), gap, interval, above, p_seed, p_rules))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the selection bench's leaderboard.csv")
    by_key = {key: e for key, e in entries(parser.parse_args().table).items() if e.status == "ok"}
    rows = across_rules(by_key)
    if PRE_FIX:
        print(f"Left out of the first family: {', '.join(f'{r} ({why})' for r, why in PRE_FIX.items())}.")
        print()
    print("| family | scenario | selection | rules | mean difference from uniform | 95% interval (bootstrap) "
          "| rules above uniform | p (seed a random effect) | p Holm "
          "| p if rules were independent (not used) |")  # fmt: skip
    print("|---|---|---|---:|---:|---|---:|---:|---:|---:|")
    for (scenario, selection, n, gap, (low, high), above, p, p_rules), adjusted in zip(
        rows, holm([r[6] for r in rows]), strict=True
    ):
        print(f"| selection against uniform, across rules | {scenario} | {selection} | {n} | {gap:+.4f} "
              f"| {low:+.4f} to {high:+.4f} | {above} | {p:.3g} | {adjusted:.3g} "
              f"| {p_rules:.3g} |")  # fmt: skip
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
