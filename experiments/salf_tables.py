"""The tables of docs/results/salf.md, recomputed from the grids' committed per-run tables
(the ``cells.csv`` that ``fedhet reproduce experiments/salf_study.toml`` and
``experiments/salf_study_fedbuff.toml`` write beside their runs): final test accuracy per
column with 95% t-intervals and Holm-corrected marks against SALF, every column's drop from
vanilla FL beside the paper's, and the widths HeteroFL's cost rule gives stragglers.

    python experiments/salf_tables.py docs/results/data/salf-study.csv \
        docs/results/data/salf-study-fedbuff.csv
    python experiments/salf_tables.py docs/results/data/salf-study-half.csv   # inputs in [-1, 1]

Columns are named after the runs' [algorithm] sections (name, then the values of its other
keys: ``drop-all`` is drop with normalize = "all", ``heterofl-fixed-padded`` HeteroFL with
width_rule = "fixed" and aggregate = "padded"). Rows are (model, straggler ratio). Seeds pair
across columns and grids: the same seed gives the same data split and initial model.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedhet.studies.stats import difference_p_value, estimate, holm, significance_mark

COLUMNS = {  # label in the runs -> heading on the page
    "fedavg": "vanilla FL",
    "drop": "drop",
    "salf": "SALF",
    "drop-all": "drop (/U)",
    "salf-all": "SALF (/U)",
    "heterofl": "HeteroFL cost",
    "heterofl-rate-squared": "HeteroFL r^2",
    "heterofl-fixed": "HeteroFL 0.5",
    "heterofl-fixed-padded": "HeteroFL 0.5 padded",
    "asyncfl": "AsyncFL stale",
    "asyncfl-fresh": "AsyncFL fresh",
    "fedbuff": "FedBuff",
}
HETEROFL = ["heterofl", "heterofl-rate-squared", "heterofl-fixed", "heterofl-fixed-padded"]
RATIOS = (0.3, 0.5, 0.7, 0.9)
# SALF Table II (MNIST): vanilla FL, then per column the accuracies at 30/50/70/90% stragglers.
PAPER_VANILLA = {"mlp": 0.90, "cnn2": 0.95}
PAPER = {
    "drop": {"mlp": (0.87, 0.84, 0.77, 0.49), "cnn2": (0.93, 0.90, 0.83, 0.28)},
    "salf": {"mlp": (0.88, 0.85, 0.85, 0.81), "cnn2": (0.94, 0.93, 0.92, 0.90)},
    "heterofl": {"cnn2": (0.88, 0.84, 0.61, 0.43)},
    "asyncfl": {"mlp": (0.86, 0.84, 0.82, 0.73), "cnn2": (0.94, 0.92, 0.91, 0.86)},
}
PAPER_COLUMN = {  # our column -> the paper's column it is compared with
    "drop": "drop",
    "drop-all": "drop",
    "salf": "salf",
    "salf-all": "salf",
    "heterofl": "heterofl",
    "heterofl-rate-squared": "heterofl",
    "heterofl-fixed": "heterofl",
    "heterofl-fixed-padded": "heterofl",
    "asyncfl": "asyncfl",
    "asyncfl-fresh": "asyncfl",
}
MODEL_NAMES = {"mlp": "MLP", "cnn2": "CNN"}


def label(row: dict) -> str:
    """The column of a run: its algorithm's name, then the values of its other keys, in the
    per-run table's column order. A table without ``algorithm.name`` comes from a grid of one
    algorithm, the FedBuff grid's (its [algorithm] section is not a grid key)."""
    rest = [v for k, v in row.items() if k.startswith("algorithm.") and k != "algorithm.name" and v]
    return "-".join([row.get("algorithm.name") or "fedbuff", *rest])


def collect(tables: list[str]) -> dict:
    """{(model, ratio): {column: {seed: final test accuracy}}} from the per-run tables."""
    table: dict = defaultdict(lambda: defaultdict(dict))
    for path in tables:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                key = (row["model.name"], float(row["system.straggler_ratio"]))
                table[key][label(row)][int(row["seed"])] = float(row["final_test_accuracy"])
    return table


def ordered(table: dict) -> list:
    """Rows in the page's order: the MLP first, then by straggler ratio."""
    return sorted(table.items(), key=lambda kv: (kv[0][0] != "mlp", kv[0][1]))


def accuracy_table(table: dict, columns: list[str]) -> None:
    """Mean ± 95% t-interval per cell; ↑/↓ where the cell differs from SALF of its row (paired
    t-test over the seeds) after Holm's correction over every test of the table, (↑)/(↓)
    where it does only uncorrected (p < 0.05)."""
    rows = ordered(table)
    tests = []
    for _, cells in rows:
        for column in columns:
            seeds = cells.get(column)
            if seeds and column != "salf" and cells.get("salf"):
                tests.append(difference_p_value(seeds, cells["salf"]))
    adjusted = iter(holm(tests))
    raw = iter(tests)
    print(f"Holm-corrected over the table's {sum(p is not None for p in tests)} tests against SALF\n")
    print("| model, stragglers | " + " | ".join(COLUMNS[c] for c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for (model, ratio), cells in rows:
        out = []
        for column in columns:
            seeds = cells.get(column)
            if not seeds:
                out.append("")
                continue
            e = estimate(list(seeds.values()), "ci95")
            mark = ""
            if column != "salf" and cells.get("salf"):
                above = e.mean > np.mean(list(cells["salf"].values()))
                mark = significance_mark(above, next(raw), next(adjusted))
            out.append(f"{e.mean:.3f} ± {e.spread:.3f}{mark}")
        print(f"| {MODEL_NAMES.get(model, model)} {ratio:g} | " + " | ".join(out) + " |")


def drop_table(table: dict, columns: list[str]) -> None:
    """Per column, vanilla FL minus the column, paired by seed: mean ± 95% interval, and the
    same difference in the paper's Table II."""
    shown = [c for c in columns if c != "fedavg"]
    print("| model, stragglers | " + " | ".join(COLUMNS[c] for c in shown) + " |")
    print("|---|" + "---|" * len(shown))
    for (model, ratio), cells in ordered(table):
        vanilla = cells.get("fedavg", {})
        out = []
        for column in shown:
            seeds = cells.get(column, {})
            common = sorted(set(seeds) & set(vanilla))
            if not common:
                out.append("")
                continue
            e = estimate([vanilla[s] - seeds[s] for s in common], "ci95")
            paper = PAPER.get(PAPER_COLUMN.get(column, ""), {}).get(model)
            theirs = f" ({PAPER_VANILLA[model] - paper[RATIOS.index(ratio)]:.2f})" if paper else ""
            out.append(f"{e.mean:+.3f} ± {e.spread:.3f}{theirs}")
        print(f"| {MODEL_NAMES.get(model, model)} {ratio:g} | " + " | ".join(out) + " |")


def heterofl_widths(draws: int = 2000) -> None:
    """The share of stragglers HeteroFL's cost rule puts at each width, under the study's
    straggler-ratio model, with the sub-model priced by multiply-adds and by r^2."""
    from fedhet import seeding
    from fedhet.algorithms.heterofl import HeteroFL, HeteroFLOptions
    from fedhet.config import from_dict
    from fedhet.models import FlatModel, build_model
    from fedhet.models.cost import multiply_adds
    from fedhet.world import build_system

    shapes = {"mlp": (784,), "cnn2": (1, 28, 28)}
    print(
        "| model | pricing | cost of r = 1/2, 1/4, 1/8, 1/16 | stragglers at r = 1/2, 1/4, 1/8, 1/16, none |"
    )
    print("|---|---|---|---|")
    for model_name, shape in shapes.items():
        model = build_model(model_name, shape, 10)
        flat = FlatModel(model)
        counts = multiply_adds(model, shape)
        for pricing in ("multiply-adds", "rate-squared"):
            algorithm = HeteroFL(HeteroFLOptions(sub_model_cost=pricing), None)
            costs = algorithm.rate_costs(flat.layout, counts)
            config = from_dict({
                "run": {"name": "widths", "seed": 1},
                "data": {"dataset": "fmnist", "num_clients": 30},
                "system": {"model": "straggler-ratio", "straggler_ratio": 0.9, "deadline": 1.0},
                "algorithm": {"name": "heterofl"},
            })  # fmt: skip
            system = build_system(config, 30, flat.num_layers)
            # the plan's workload only: the widths below follow each draw's time (the oracle's)
            plan_algorithm = HeteroFL(HeteroFLOptions(planner_knowledge="oracle"), config.train)
            tally: dict = defaultdict(int)
            stragglers = 0
            for t in range(1, draws + 1):
                work = plan_algorithm.planner.plan(t, {}, system, 1.0).workload()
                outcomes = system.sample(work, seeding.round_stream(1, "system", t))
                for full_time in outcomes.full_time:
                    if full_time > 1.0 + 1e-12:
                        stragglers += 1
                        tally[algorithm.rate_for(float(full_time), 1.0, costs)] += 1
            rates = (0.5, 0.25, 0.125, 0.0625, None)
            cost_text = ", ".join(f"{costs[str(r)]:.3f}" for r in rates[:-1])
            share = ", ".join(f"{tally[r] / stragglers:.2f}" for r in rates)
            print(f"| {MODEL_NAMES[model_name]} | {pricing} | {cost_text} | {share} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="per-run tables (cells.csv of the grids)")
    args = parser.parse_args()
    for path in args.tables:
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such per-run table")
    table = collect(args.tables)
    present = {c for cells in table.values() for c in cells}
    columns = [c for c in COLUMNS if c in present and c not in HETEROFL]
    heterofl = [c for c in ["fedavg", "salf", *HETEROFL] if c in present] if present & set(HETEROFL) else []
    seeds = sorted({s for cells in table.values() for values in cells.values() for s in values})
    print(f"Final test accuracy, mean ± 95% t-interval over seeds {seeds[0]}-{seeds[-1]}; ↑/↓: paired t-test")
    print("against SALF, Holm-corrected p < 0.05; (↑)/(↓): p < 0.05 uncorrected only\n")
    accuracy_table(table, columns)
    if heterofl:
        print()
        accuracy_table(table, heterofl)
    print("\nDrop from vanilla FL (vanilla minus the column, paired by seed, ± 95% t-interval);")
    print("in parentheses the same difference in SALF's Table II (MNIST)\n")
    drop_table(table, columns)
    if heterofl:
        print()
        drop_table(table, heterofl)
    if heterofl:
        print("\nHeteroFL's cost rule under the straggler-ratio model (90% stragglers; a straggler's")
        print("share of the widths does not depend on the ratio)\n")
        heterofl_widths()


if __name__ == "__main__":
    main()
