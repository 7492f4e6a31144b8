"""FedStale under its own protocol (FedStale Sec. 5): the client learning rate tuned per
algorithm (beta) and cell on a validation split, then 5 seeds on the test set at
p_avg/p_min = 25.5 and 250.5, where Guideline B says FedAvg (beta = 0) should win.

    # 1. after `fedhet reproduce experiments/fedstale_protocol_tune.toml`: the per-run table
    #    and the test grid with each (cell, beta)'s best learning rate
    python experiments/fedstale_protocol.py docs/results/data/fedstale-protocol.csv \
        --tune runs/fedstale_protocol_tune --grid experiments/fedstale_protocol.toml
    # 2. after `fedhet reproduce experiments/fedstale_protocol.toml`: add the test runs
    python experiments/fedstale_protocol.py docs/results/data/fedstale-protocol.csv \
        --tune runs/fedstale_protocol_tune --test runs/fedstale_protocol
    # 3. after `fedhet reproduce experiments/fedstale_protocol_seeds.toml`: add its runs
    python experiments/fedstale_protocol.py docs/results/data/fedstale-protocol.csv \
        --more-seeds runs/fedstale_protocol_seeds
    # any time: every number of the page's section from the committed table
    python experiments/fedstale_protocol.py docs/results/data/fedstale-protocol.csv

A run's score is the mean of its last three evaluations (validation accuracy when tuning,
test accuracy after). Tests: two-sided paired t-tests over the seeds (a seed fixes the data
split, the initial model, the participation draws and the minibatches for every beta),
Holm-corrected over the table.
"""

from __future__ import annotations

import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from statistics import mean

import numpy as np
from protocol_grid import protocol_main, write_test_grid

from fedhet.results import RunDirectory
from fedhet.studies.beta_map import read_record
from fedhet.studies.stats import difference_p_value, estimate, holm

COLUMNS = [
    "stage",
    "sigma_g2",
    "p_min",
    "ratio",
    "rounds",
    "beta",
    "lr",
    "seed",
    "score",
    "final_accuracy",
    "fedhet",
]
LAST = 3


def runs_table(folder: str, stage: str) -> list[dict]:
    """One row per finished run of a grid folder."""
    rows = []
    for path in sorted(Path(folder).iterdir()):
        run = RunDirectory(path)
        record = read_record(run, LAST) if (path / "metrics.csv").exists() else None
        if record is None:
            continue
        config = tomllib.loads((path / "config.toml").read_text())
        summary = run.read_summary()
        rows.append(
            {
                "stage": stage,
                "sigma_g2": f"{record.swap_fraction:g}",
                "p_min": f"{record.p_min:g}",
                "ratio": f"{record.participation_ratio:.1f}",
                "rounds": summary["rounds"],
                "beta": f"{record.beta:g}",
                "lr": f"{config['train']['lr']:g}",
                "seed": record.seed,
                "score": f"{record.accuracy:.6f}",
                "final_accuracy": f"{summary['final_test_accuracy']:.6f}",
                "fedhet": summary.get("fedhet", ""),
            }
        )
    if not rows:
        raise SystemExit(f"fedstale_protocol: {folder}: no finished runs")
    return rows


def chosen_rates(rows: list[dict]) -> dict[tuple, tuple[str, float]]:
    """{(sigma, p_min, beta): (best lr, its validation score)} from the tuning rows."""
    best: dict[tuple, tuple[str, float]] = {}
    for row in rows:
        if row["stage"] != "tune":
            continue
        key, score = (row["sigma_g2"], row["p_min"], row["beta"]), float(row["score"])
        if key not in best or score > best[key][1]:
            best[key] = (row["lr"], score)
    return best


def write_grid(rows: list[dict], tune_config: str, out: str, seeds: list[int]) -> None:
    """The test grid: the tuning grid's setting without its validation split, one case per
    (cell, beta) at its chosen lr, crossed with ``seeds``."""
    rounds = {row["p_min"]: int(row["rounds"]) for row in rows if row["stage"] == "tune"}
    cases = []
    for (sigma, p_min, beta), (lr, _) in sorted(chosen_rates(rows).items(), key=lambda kv: float(kv[0][1])):
        cases.append(
            {
                "system.participation_min": float(p_min),
                "run.rounds": rounds[p_min],
                "data.swap_fraction": float(sigma),
                "algorithm.beta": float(beta),
                "train.lr": float(lr),
            }
        )
    report = {
        "rows": ["data.swap_fraction", "system.participation_min"],
        "columns": ["algorithm.beta"],
        "value": "final_test_accuracy",
        "interval": "ci95",
        "reference": "0.0",
    }
    header = (
        "# FedStale under its own protocol, step 2 of 2: each (cell, beta) at the learning rate it\n"
        "# scored best with on the validation split in experiments/fedstale_protocol_tune.toml,\n"
        f"# on the test set, seeds {seeds[0]}-{seeds[-1]}. Generated by experiments/fedstale_protocol.py.\n"
        "#\n#   fedhet reproduce experiments/fedstale_protocol.toml\n"
    )
    write_test_grid(tune_config, "fedstale_protocol", cases, seeds, report, header, out)


def print_report(rows: list[dict]) -> None:
    rates = sorted({row["lr"] for row in rows if row["stage"] == "tune"}, key=float, reverse=True)
    tune = {
        (r["sigma_g2"], r["p_min"], r["beta"], r["lr"]): float(r["score"])
        for r in rows
        if r["stage"] == "tune"
    }
    chosen = chosen_rates(rows)
    print("| sigma_g^2 | p_avg/p_min | beta | " + " | ".join(f"lr {lr}" for lr in rates) + " | chosen |")
    print("|---|---|---|" + "---:|" * len(rates) + "---|")
    ratio_of = {r["p_min"]: r["ratio"] for r in rows}
    for sigma, p_min, beta in sorted(chosen, key=lambda k: (float(k[0]), float(k[1]), float(k[2]))):
        cells = [
            f"{tune[(sigma, p_min, beta, lr)]:.3f}" if (sigma, p_min, beta, lr) in tune else "-"
            for lr in rates
        ]
        print(
            f"| {sigma} | {ratio_of[p_min]} | {beta} | "
            + " | ".join(cells)
            + f" | {chosen[(sigma, p_min, beta)][0]} |"
        )
    test = [r for r in rows if r["stage"] == "test"]
    if not test:
        return
    by_cell: dict[tuple, dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in test:
        by_cell[(float(r["sigma_g2"]), float(r["ratio"]))][float(r["beta"])][int(r["seed"])] = float(
            r["score"]
        )
    betas = sorted({b for cell in by_cell.values() for b in cell})
    tests, labels = [], []
    for key, cell in sorted(by_cell.items()):
        middle = [b for b in cell if 0.0 < b < 1.0]
        best_middle = max(middle, key=lambda b: np.mean(list(cell[b].values())))
        for a, b in ((best_middle, 0.0), (best_middle, 1.0), (0.0, 1.0)):
            tests.append(difference_p_value(cell[a], cell[b]))
            labels.append((key, a, b))
    adjusted = dict(zip(labels, holm(tests), strict=True))
    raw = dict(zip(labels, tests, strict=True))
    print()
    head = [
        "sigma_g^2",
        "p_avg/p_min",
        *[f"beta={b:g}" for b in betas],
        "beta_opt (mean)",
        "beta=0 - beta=1, p (Holm)",
        "best middle - beta=0, p (Holm)",
        "best middle - beta=1, p (Holm)",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key, cell in sorted(by_cell.items()):
        means = {b: float(np.mean(list(cell[b].values()))) for b in cell}
        shown = []
        for b in betas:
            e = estimate(list(cell[b].values()), "ci95")
            shown.append(f"{e.mean:.3f} ± {e.spread:.3f}")
        opt = max(means, key=lambda b: (means[b], -b))
        middle = next(a for (k, a, b) in labels if k == key and b == 0.0)
        compared = [
            _difference(means, raw, adjusted, key, a, b)
            for a, b in ((0.0, 1.0), (middle, 0.0), (middle, 1.0))
        ]
        row = [
            f"{key[0]:g}",
            f"{key[1]:.1f}",
            *shown,
            f"{opt:g}",
            compared[0],
            f"{middle:g}: {compared[1]}",
            f"{middle:g}: {compared[2]}",
        ]
        print("| " + " | ".join(row) + " |")


def print_more_seeds(rows: list[dict]) -> None:
    """The cells the ``more-seeds`` rows extend: U-FedAvg (beta = 0) against FedVARP
    (beta = 1) over all their seeds, and over the new seeds alone (a replication of the
    5-seed finding on seeds it did not see); Holm over these two tests per cell."""
    more = [r for r in rows if r["stage"] == "more-seeds"]
    if not more:
        return
    cells = sorted({(r["sigma_g2"], r["ratio"]) for r in more}, key=lambda k: (float(k[0]), float(k[1])))
    print("\nMore seeds: beta = 0 - beta = 1 in points, mean ± 95% t-interval over the seeds both ran,"
          " paired t-test p and Holm p over the cell's two tests:\n")  # fmt: skip
    print("| sigma_g^2 | p_avg/p_min | seeds | beta=0 | beta=1 | beta=0 - beta=1 | p (Holm) |")
    print("|---|---|---|---|---|---|---|")
    for sigma, ratio in cells:
        scores: dict[float, dict[int, float]] = defaultdict(dict)
        for r in rows:
            if r["stage"] in ("test", "more-seeds") and (r["sigma_g2"], r["ratio"]) == (sigma, ratio):
                scores[float(r["beta"])][int(r["seed"])] = float(r["score"])
        new = {int(r["seed"]) for r in more if (r["sigma_g2"], r["ratio"]) == (sigma, ratio)}
        both = set(scores[0.0]) & set(scores[1.0])
        spans = [sorted(both), sorted(new & both)]
        tests = [difference_p_value({s: scores[0.0][s] for s in span}, {s: scores[1.0][s] for s in span})
                 for span in spans]  # fmt: skip
        for span, p, q in zip(spans, tests, holm(tests), strict=True):
            a, b = ([scores[beta][s] for s in span] for beta in (0.0, 1.0))
            gap = estimate([100 * (x - y) for x, y in zip(a, b, strict=True)], "ci95")
            shown = [estimate(v, "ci95") for v in (a, b)]
            print(f"| {sigma} | {ratio} | {span[0]}-{span[-1]} (n = {len(span)}) | "
                  + " | ".join(f"{e.mean:.3f} ± {e.spread:.3f}" for e in shown)
                  + f" | {gap.mean:+.1f} ± {gap.spread:.1f} | {_p_text(p, q)} |")  # fmt: skip


def print_trend(rows: list[dict]) -> None:
    """Guideline B as a trend: at sigma_g^2 = 0, does U-FedAvg's lead over FedVARP (beta = 0
    minus beta = 1, per seed, in points) grow from the smallest participation gap to the
    largest? Welch's t-test (two-sided) of the two gaps' per-seed leads, every seed each
    ran (5 at the smaller, 20 at the larger once more seeds are in)."""
    from scipy.stats import ttest_ind

    scores: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["stage"] in ("test", "more-seeds") and float(r["sigma_g2"]) == 0:
            scores[(float(r["ratio"]), float(r["beta"]))][int(r["seed"])] = float(r["score"])
    ratios = sorted({ratio for ratio, _ in scores})
    if len(ratios) < 2:
        return
    leads = {}
    for ratio in (ratios[0], ratios[-1]):
        seeds = sorted(set(scores[(ratio, 0.0)]) & set(scores[(ratio, 1.0)]))
        leads[ratio] = [100 * (scores[(ratio, 0.0)][s] - scores[(ratio, 1.0)][s]) for s in seeds]
    low, high = leads[ratios[0]], leads[ratios[-1]]
    p = ttest_ind(high, low, equal_var=False).pvalue
    print(f"\nGuideline B as a trend (sigma_g^2 = 0): U-FedAvg - FedVARP, {mean(low):+.1f} points at "
          f"p_avg/p_min = {ratios[0]:g} (n = {len(low)}) and {mean(high):+.1f} at {ratios[-1]:g} "
          f"(n = {len(high)}); Welch's t-test of the per-seed leads p = {p:.2g} (two-sided)")  # fmt: skip


def _p_text(p: float | None, q: float | None) -> str:
    return "-" if p is None or q is None else f"{p:.3g} ({q:.3g})"


def _difference(means: dict, raw: dict, adjusted: dict, key: tuple, a: float, b: float) -> str:
    """``+1.2, 0.034 (0.2)``: the difference of means in points, its p and Holm p."""
    return f"{100 * (means[a] - means[b]):+.1f}, {raw[(key, a, b)]:.3g} ({adjusted[(key, a, b)]:.3g})"


def main() -> int:
    return protocol_main(
        __doc__.splitlines()[0],
        "experiments/fedstale_protocol_tune.toml",
        COLUMNS,
        runs_table,
        write_grid,
        lambda rows: (print_report(rows), print_more_seeds(rows), print_trend(rows)),
    )


if __name__ == "__main__":
    sys.exit(main())
