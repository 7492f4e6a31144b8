"""The persistent-stragglers tables of docs/results/salf.md, recomputed from the grids'
committed per-run tables (the ``cells.csv`` that ``fedhet reproduce
experiments/salf_persistent.toml`` and ``experiments/salf_persistent_cnn.toml`` write).

    python experiments/salf_persistent_tests.py docs/results/data/salf-persistent.csv
    python experiments/salf_persistent_tests.py docs/results/data/salf-persistent-cnn.csv

For every row (straggler system, number of users, labels): each column's final test accuracy,
mean ± 95% t-interval over the seeds, marked against `reached` (SALF eq. (9), same seeds) by
a two-sided paired t-test, Holm-corrected over the table's tests; then each column's paired
difference from `reached` with its uncorrected and Holm-corrected p and its worst seed (the
p-values and worst seeds the page quotes).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from fedhet.studies.stats import difference_p_value, estimate, holm, significance_mark

COLUMNS = {  # label in the runs -> heading on the page
    "fedavg": "vanilla FL",
    "drop": "drop",
    "salf": "SALF reached",
    "salf-inverse-reach": "SALF inverse-reach",
    "salf-all": "SALF all (/U)",
}


def row_name(row: dict) -> str:
    """The page's words for a run's straggler system, number of users and labels."""
    if row["system.model"] == "straggler-ratio":
        ratio = round(100 * float(row["system.straggler_ratio"]))
        system = f"fixed {ratio}%, depth >= {row['system.straggler_min_depth']}"
    else:
        system = f"capabilities U({row['system.capability_low']}, {row['system.capability_high']})"
    labels = "IID" if row["data.partition"] == "iid" else "Dirichlet(0.3)"
    return f"{system}, U = {row['data.num_clients']}, {labels}"


def collect(path: str) -> dict[str, dict[str, dict[int, float]]]:
    """{row: {column: {seed: final test accuracy}}}, rows in the table's order."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            column = "-".join(filter(None, [row["algorithm.name"], row.get("algorithm.normalize", "")]))
            table.setdefault(row_name(row), {}).setdefault(column, {})[int(row["seed"])] = float(
                row["final_test_accuracy"]
            )
    return table


def tests(table: dict) -> tuple[dict, dict]:
    """{(row, column): p} of every column against `reached`, and the Holm-corrected p."""
    keys = [(name, c) for name, cells in table.items() for c in COLUMNS if c != "salf" and c in cells]
    raw = [difference_p_value(table[name][c], table[name]["salf"]) for name, c in keys]
    return dict(zip(keys, raw, strict=True)), dict(zip(keys, holm(raw), strict=True))


def accuracy_table(table: dict, raw: dict, corrected: dict) -> None:
    seeds = sorted({s for cells in table.values() for values in cells.values() for s in values})
    print(f"Final test accuracy, mean ± 95% t-interval over seeds {seeds[0]}-{seeds[-1]}; ↑/↓: paired")
    print(f"t-test against `reached`, Holm-corrected over the table's {len(raw)} tests, p < 0.05;")
    print("(↑)/(↓): p < 0.05 uncorrected only\n")
    print("| stragglers, U, labels | " + " | ".join(COLUMNS.values()) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name, cells in table.items():
        out = []
        reached = np.mean(list(cells["salf"].values()))
        for column in COLUMNS:
            e = estimate(list(cells[column].values()), "ci95")
            mark = ""
            if (name, column) in raw:
                mark = significance_mark(e.mean > reached, raw[name, column], corrected[name, column])
            out.append(f"{e.mean:.3f} ± {e.spread:.3f}{mark}")
        print(f"| {name} | " + " | ".join(out) + " |")


def p_value(p: float) -> str:
    """``= 0.015``, or ``< 0.001`` below a thousandth."""
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def differences_table(table: dict, raw: dict, corrected: dict) -> None:
    print("\nPaired difference from `reached` (mean over the seeds), p uncorrected and Holm-corrected,")
    print("and the worst seed\n")
    others = [c for c in COLUMNS if c != "salf"]
    print("| stragglers, U, labels | reached | " + " | ".join(COLUMNS[c] for c in others) + " |")
    print("|---|---|" + "---|" * len(others))
    for name, cells in table.items():
        reached = cells["salf"]
        out = [f"{np.mean(list(reached.values())):.3f} (worst {min(reached.values()):.3f})"]
        for column in others:
            values = cells[column]
            common = sorted(set(values) & set(reached))
            diff = float(np.mean([values[s] - reached[s] for s in common]))
            p, p_holm = raw[name, column], corrected[name, column]
            p_text = "n/a" if p is None else f"p {p_value(p)}; Holm {p_value(p_holm)}"
            out.append(f"{diff:+.3f}, {p_text} (worst {min(values.values()):.3f})")
        print(f"| {name} | " + " | ".join(out) + " |")


def main(paths: list[str]) -> None:
    if not paths:
        raise SystemExit("usage: salf_persistent_tests.py PER-RUN-TABLE.csv")
    for path in paths:
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such per-run table")
        table = collect(path)
        raw, corrected = tests(table)
        accuracy_table(table, raw, corrected)
        differences_table(table, raw, corrected)


if __name__ == "__main__":
    main(sys.argv[1:])
