"""ADEL-FL's comparisons under its own protocol (ADEL-FL Sec. 5): eta0 chosen per method and
row from {0.05, 0.1, 0.5, 1.0} on a validation split, HeteroFL (both sub-model pricings)
beside ADEL-FL, SALF and drop-stragglers, then 5 seeds on the test set.

    # 1. after `fedhet reproduce experiments/adelfl_protocol_tune.toml`: the per-run table
    #    and the test grid with each (row, method)'s best eta0
    python experiments/adelfl_protocol.py docs/results/data/adelfl-protocol.csv \
        --tune runs/adelfl_protocol_tune --grid experiments/adelfl_protocol.toml
    # 2. after `fedhet reproduce experiments/adelfl_protocol.toml`: add the test runs (without
    #    --tune the table's tuning rows are kept)
    python experiments/adelfl_protocol.py docs/results/data/adelfl-protocol.csv \
        --test runs/adelfl_protocol
    # any time: every number of the page's section from the committed table
    python experiments/adelfl_protocol.py docs/results/data/adelfl-protocol.csv

A run's score is the mean of its last three evaluations (rounds 60, 80 and 100; validation
accuracy when tuning, test accuracy after). A run that stops unfinished (drop-stragglers
with no client finishing a round, a non-finite loss) has no score: a tuning run's row records
how and when it stopped, and the report lists it; a method with no finished tuning run in a
row is left out of that row's test grid. ADEL-FL is compared with every other method of
its row by a two-sided paired t-test over the seeds, Holm-corrected over the table.
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np
from protocol_grid import protocol_main, write_test_grid

from fedhet.results import RunDirectory
from fedhet.studies.stats import difference_p_value, estimate, holm

COLUMNS = [
    "stage",
    "capability_low",
    "time_budget",
    "method",
    "algorithm",
    "lr",
    "seed",
    "score",
    "final_accuracy",
    "fedhet",
    "stopped",
]
LAST = 3
ADEL = "adel-fl"


def label(algorithm: dict) -> str:
    """``adel-fl``, ``salf``, ``drop``, ``heterofl (multiply-adds)``, ``heterofl (rate-squared)``."""
    name = algorithm["name"]
    if name == "heterofl":
        return f"heterofl ({algorithm.get('sub_model_cost', 'multiply-adds')})"
    return name


def runs_table(folder: str, stage: str) -> list[dict]:
    rows = []
    for path in sorted(Path(folder).iterdir()):
        run = RunDirectory(path)
        if not run.summary_path.exists():
            continue
        config = tomllib.loads((path / "config.toml").read_text())
        summary = run.read_summary()
        finished = bool(summary.get("finished"))
        evaluated = [r["test_accuracy"] for r in run.read_metrics() if r.get("test_accuracy") is not None]
        if not finished and stage == "test":
            continue
        rows.append(
            {
                "stage": stage,
                "capability_low": f"{config['system']['capability_low']:g}",
                "time_budget": f"{config['run']['time_budget']:g}",
                "method": label(config["algorithm"]),
                "algorithm": json.dumps(config["algorithm"], sort_keys=True),
                "lr": f"{config['train']['lr']:g}",
                "seed": config["run"]["seed"],
                "score": f"{np.mean(evaluated[-LAST:]):.6f}" if finished else "",
                "final_accuracy": f"{summary['final_test_accuracy']:.6f}" if finished else "",
                "fedhet": summary.get("fedhet", ""),
                "stopped": "" if finished else _stopped(summary, run),
            }
        )
    if not rows:
        raise SystemExit(f"adelfl_protocol: {folder}: no finished runs")
    return rows


def _stopped(summary: dict, run: RunDirectory) -> str:
    """How an unfinished run stopped, and in which round: ``non_finite at round 20``."""
    rounds = [r["round"] for r in run.read_metrics()]
    return f"{summary.get('stopped_by') or 'unfinished'} at round {int(max(rounds)) if rounds else 0}"


def chosen_rates(rows: list[dict]) -> dict[tuple, dict]:
    """{(capability_low, time_budget, method): the tuning row with the best validation score}."""
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["capability_low"], row["time_budget"], row["method"])
        if row["stage"] != "tune" or not row["score"]:
            continue
        if key not in best or float(row["score"]) > float(best[key]["score"]):
            best[key] = row
    return best


def write_grid(rows: list[dict], tune_config: str, out: str, seeds: list[int]) -> None:
    cases = []
    for (low, budget, _), row in sorted(chosen_rates(rows).items()):
        cases.append(
            {
                "system.capability_low": float(low),
                "system.capability_high": 2.0 - float(low),
                "run.time_budget": float(budget),
                "algorithm": json.loads(row["algorithm"]),
                "train.lr": float(row["lr"]),
            }
        )
    report = {
        "rows": ["system.capability_low", "run.time_budget"],
        "columns": ["algorithm"],
        "value": "final_test_accuracy",
        "interval": "ci95",
    }
    header = (
        "# ADEL-FL's comparisons under its own protocol, step 2 of 2: each (row, method) at the\n"
        "# eta0 it scored best with on the validation split in experiments/adelfl_protocol_tune.toml,\n"
        f"# on the test set, seeds {seeds[0]}-{seeds[-1]}. Generated by experiments/adelfl_protocol.py.\n"
        "#\n#   fedhet reproduce experiments/adelfl_protocol.toml\n"
    )
    write_test_grid(tune_config, "adelfl_protocol", cases, seeds, report, header, out)


def _rows(keys) -> list[tuple[str, str]]:
    return sorted(keys, key=lambda k: (-float(k[0]), -float(k[1])))


def print_report(rows: list[dict]) -> None:
    chosen = chosen_rates(rows)
    methods = sorted({k[2] for k in chosen}, key=lambda m: (m != ADEL, m))
    cells = _rows({k[:2] for k in chosen})
    print("Chosen eta0 (validation score):\n")
    print("| P_u ~ U(low, ·), T_max | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for cell in cells:
        shown = [
            f"{chosen[(*cell, m)]['lr']} ({float(chosen[(*cell, m)]['score']):.3f})"
            if (*cell, m) in chosen
            else "no run finished"
            for m in methods
        ]
        print(f"| {cell[0]}, {cell[1]} | " + " | ".join(shown) + " |")
    stopped = [r for r in rows if r["stage"] == "tune" and r.get("stopped")]
    if stopped:
        print("\nTuning runs that stopped early (no score, so not chosen):\n")
        for r in stopped:
            row = f"{r['capability_low']}, {r['time_budget']}"
            print(f"- {r['method']} at eta0 {r['lr']}, row {row}: {r['stopped']}")
    test: dict[tuple, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r["stage"] == "test":
            test[(r["capability_low"], r["time_budget"])][r["method"]][int(r["seed"])] = float(r["score"])
    if not test:
        return
    pairs = [(cell, m) for cell in _rows(test) for m in methods if m != ADEL and m in test[cell]]
    p_values = [difference_p_value(test[cell][ADEL], test[cell][m]) for cell, m in pairs]
    found = {pair: (p, q) for pair, p, q in zip(pairs, p_values, holm(p_values), strict=True)}
    print(
        "\nTest accuracy (a run's: the mean of its evaluations at rounds 60, 80 and 100), mean ± 95%"
        " t-interval; after each other method: ADEL-FL minus it in points, p (Holm):\n"
    )
    print("| P_u ~ U(low, ·), T_max | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for cell in _rows(test):
        shown = []
        for m in methods:
            if m not in test[cell]:
                shown.append("-")
                continue
            e = estimate(list(test[cell][m].values()), "ci95")
            text = f"{e.mean:.3f} ± {e.spread:.3f}"
            if m != ADEL:
                p, q = found[(cell, m)]
                gap = 100 * (np.mean(list(test[cell][ADEL].values())) - e.mean)
                text += f" ({gap:+.1f}, {p:.2g} ({q:.2g}))"
            shown.append(text)
        print(f"| {cell[0]}, {cell[1]} | " + " | ".join(shown) + " |")


def main() -> int:
    return protocol_main(
        __doc__.splitlines()[0],
        "experiments/adelfl_protocol_tune.toml",
        COLUMNS,
        runs_table,
        write_grid,
        print_report,
    )


if __name__ == "__main__":
    sys.exit(main())
