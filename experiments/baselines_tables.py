"""The tables of docs/results/baselines.md, recomputed from the grids' committed per-run tables.

    python experiments/baselines_tables.py docs/results/data/baselines-steps.csv \
        --times docs/results/data/baselines-steps-times.csv \
        --tuned docs/results/data/baselines-tuned.csv

The first table is the final test accuracy of `fedhet reproduce experiments/baselines_steps.toml`
(the ``cells.csv`` it writes), one row per algorithm and one column per learning rate: mean ±
95% t-interval over the seeds, then each seed. ``--times`` (the per-run table
`experiments/accuracy_at_times.py --csv` writes from the same runs) adds the accuracy at
fractions of the budget, ``--tuned`` (the ``cells.csv`` of `experiments/baselines_tuned.toml`)
the tuned runs. A run that stopped before its budget (a non-finite loss) is marked with how it
stopped. Then the page's two questions, each tested per setting (lr 0.05, lr 0.02, tuned) as
one Holm family: does a method that uses the steps a client finished beat dropping the
stragglers, and waiting for them; and do FedProx, FedNova and FedDyn differ from each other.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from fedhet.studies.stats import difference_p_value, estimate, holm

NAMES = {  # algorithm -> its row on the page
    "fedavg": "fedavg (wait for all)",
    "drop": "drop-stragglers",
    "fedprox": "fedprox",
    "fednova": "fednova",
    "scaffold": "scaffold",
    "feddyn": "feddyn",
}
FINISHED = {"budget", "rounds", "time_budget", "time-budget"}
PARTIAL_WORK = ("fedprox", "fednova", "scaffold", "feddyn")  # use the steps a client finished
NOT_USING = (("drop", "drop"), ("fedavg", "wait"))  # the two ways of not using them
CLOSE = (("fedprox", "fednova"), ("fedprox", "feddyn"), ("fednova", "feddyn"))


def read(path: str) -> list[dict]:
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such per-run table")
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def seed_text(row: dict) -> str:
    """A run's final accuracy, with how it stopped when that was not its budget."""
    value = f"{float(row['final_test_accuracy']):.3f}"
    stopped = row.get("stopped_by") or ""
    return value if not stopped or stopped in FINISHED else f"{value} (stopped: {stopped})"


def cell_text(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: int(r["seed"]))
    e = estimate([float(r["final_test_accuracy"]) for r in rows], "ci95")
    return f"{e.mean:.3f} ± {e.spread:.3f} (" + ", ".join(seed_text(r) for r in rows) + ")"


def steps_table(rows: list[dict]) -> None:
    by_cell: dict = defaultdict(list)
    for row in rows:
        by_cell[row["algorithm.name"], float(row["train.lr"])].append(row)
    rates = sorted({lr for _, lr in by_cell}, reverse=True)
    seeds = sorted({int(r["seed"]) for r in rows})
    print(f"Final test accuracy, mean ± 95% t-interval over seeds {seeds[0]}-{seeds[-1]}, then each seed\n")
    print("| algorithm | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |")
    print("|---|" + "---|" * len(rates))
    for name, label in NAMES.items():
        cells = [cell_text(by_cell[name, lr]) if by_cell.get((name, lr)) else "" for lr in rates]
        print(f"| {label} | " + " | ".join(cells) + " |")


def times_table(rows: list[dict]) -> None:
    """Mean over the seeds of each run's accuracy at each fraction of the budget."""
    fractions = [k for k in rows[0] if k not in ("cell", "seed")]
    by_cell: dict = defaultdict(list)
    for row in rows:
        by_cell[row["cell"]].append(row)
    print("\nAccuracy at fractions T of the budget (mean over the seeds with an evaluation by then)\n")
    print("| algorithm | lr | " + " | ".join(f"{f} T" for f in fractions) + " |")
    print("|---|---|" + "---|" * len(fractions))
    cells = sorted(by_cell, key=lambda c: (-float(c.split("-")[0]), list(NAMES).index(c.split("-")[1])))
    for cell in cells:
        lr, name = cell.split("-")[:2]
        out = []
        for fraction in fractions:
            seen = [float(r[fraction]) for r in by_cell[cell] if r[fraction] not in ("", "None")]
            out.append(f"{sum(seen) / len(seen):.3f}" if seen else "-")
        print(f"| {name} | {lr} | " + " | ".join(out) + " |")


OWN_KEYS = ("algorithm.mu", "algorithm.alpha", "algorithm.server_lr")  # the tuned keys beside train.lr


def chosen_values_table(by_name: dict) -> None:
    """The values the tune chose for each method, as its tuned runs ran them."""
    print("\nChosen values (the tuned runs' settings)\n")
    print("| algorithm | lr | other |")
    print("|---|---|---|")
    for name, label in NAMES.items():
        if by_name.get(name):
            row = by_name[name][0]
            own = [k for k in OWN_KEYS if row.get(k) not in (None, "")]
            other = [f"{k.split('.')[1]} = {float(row[k]):.3g}" for k in own]
            print(f"| {label} | {float(row['train.lr']):.4f} | {', '.join(other) or '-'} |")


def tuned_table(rows: list[dict]) -> None:
    by_name: dict = defaultdict(list)
    for row in rows:
        by_name[row["algorithm.name"]].append(row)
    chosen_values_table(by_name)
    seeds = sorted({int(r["seed"]) for r in rows})
    span = f"{seeds[0]}-{seeds[-1]}"
    print(f"\nTuned, final test accuracy, mean ± 95% t-interval over seeds {span}, then each seed\n")
    print("| algorithm | tuned |")
    print("|---|---|")
    for name, label in NAMES.items():
        if by_name.get(name):
            print(f"| {label} | {cell_text(by_name[name])} |")


def by_seed(rows: list[dict]) -> dict[int, float]:
    return {int(r["seed"]): float(r["final_test_accuracy"]) for r in rows}


def difference_text(a: list[dict], b: list[dict], p: float | None, p_holm: float | None) -> str:
    """``+7.0 (0.1; 0.5)``: mean of a - mean of b in accuracy points, then p and Holm p."""
    x, y = by_seed(a), by_seed(b)
    gap = 100 * (sum(x.values()) / len(x) - sum(y.values()) / len(y))
    return f"{gap:+.1f} ({p:.2g}; {p_holm:.2g})" if p is not None and p_holm is not None else f"{gap:+.1f}"


def tests_table(
    columns: dict[str, dict[str, list[dict]]], pairs: list[tuple[str, str, str]], title: str
) -> None:
    """One row per pair (a, b, label), one column per setting; Holm over each column's tests."""
    print(f"\n{title}\n")
    print("| difference | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    cells: dict = {}
    for setting, rows in columns.items():
        raw = [difference_p_value(by_seed(rows[a]), by_seed(rows[b])) for a, b, _ in pairs]
        for (a, b, _), p, p_holm in zip(pairs, raw, holm(raw), strict=True):
            cells[a, b, setting] = difference_text(rows[a], rows[b], p, p_holm)
    for a, b, label in pairs:
        print(f"| {label} | " + " | ".join(cells[a, b, s] for s in columns) + " |")


def settings(steps: list[dict], tuned: list[dict] | None) -> dict[str, dict[str, list[dict]]]:
    """Each setting of the page (lr 0.05, lr 0.02, tuned): its runs by algorithm."""
    columns: dict = defaultdict(lambda: defaultdict(list))
    for row in sorted(steps, key=lambda r: -float(r["train.lr"])):
        columns[f"lr {float(row['train.lr']):g}"][row["algorithm.name"]].append(row)
    for row in tuned or []:
        columns["tuned"][row["algorithm.name"]].append(row)
    return columns


def all_tests(steps: list[dict], tuned: list[dict] | None) -> None:
    """The page's two questions, each one Holm family per setting."""
    columns = settings(steps, tuned)
    against = [(m, other, f"{m} - {label}") for m in PARTIAL_WORK for other, label in NOT_USING]
    tests_table(
        columns,
        against,
        "Using partial work against not using it: difference of means in accuracy points, then "
        "the two-sided paired t-test's p over the seeds and its Holm-corrected value over the "
        f"{len(against)} tests of the column",
    )
    close = [(a, b, f"{a} - {b}") for a, b in CLOSE]
    tests_table(
        columns,
        close,
        "FedProx, FedNova and FedDyn against each other: as above, Holm over the "
        f"{len(close)} tests of the column",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", help="per-run table of experiments/baselines_steps.toml")
    parser.add_argument("--times", help="per-run table of accuracy_at_times.py --csv")
    parser.add_argument("--tuned", help="per-run table of experiments/baselines_tuned.toml")
    args = parser.parse_args()
    steps_table(read(args.steps))
    if args.times:
        times_table(read(args.times))
    if args.tuned:
        tuned_table(read(args.tuned))
    all_tests(read(args.steps), read(args.tuned) if args.tuned else None)


if __name__ == "__main__":
    main()
