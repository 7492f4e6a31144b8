"""A `fedhet reproduce` table, recomputed from the grid's committed per-cell table (the
``cells.csv`` that ``fedhet reproduce`` writes beside its runs), without the run folders;
and, with ``--differences``, the paired differences between columns row by row.

    python experiments/grid_table.py docs/results/data/adelfl-questions.csv experiments/adelfl_questions.toml
    python experiments/grid_table.py CELLS.csv EXPERIMENT.toml --differences "A - B" "C - D"

The first table is ``fedhet reproduce``'s own (its [report] section: rows, columns, value,
interval, reference marks Holm-corrected over the table unless ``--correction none``). Each
``--differences`` item names two of its columns, ``"A - B"``: per row, mean(A - B) over the
seeds both have, in points (x 100), with the paired t-test's p and the Holm-corrected p over
every test of the differences table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedhet.studies.expansion import _lookup, short_value
from fedhet.studies.grid import load_experiment, report_table
from fedhet.studies.stats import difference_p_value, holm
from fedhet.studies.tables import summaries_from_cells


def by_row_and_column(experiment, summaries: dict) -> tuple[dict, list[str]]:
    """{row label: {column label: {seed: value}}} and the columns in the table's order."""
    rows: dict[str, dict[str, dict[int, float]]] = {}
    columns: list[str] = []
    for cell in experiment.cells:
        summary = summaries.get(cell.name)
        if summary is None or summary.get(experiment.value) is None:
            continue
        row = " ".join(short_value(_lookup(cell, key)) for key in experiment.rows) or "-"
        column = " ".join(short_value(_lookup(cell, key)) for key in experiment.columns)
        if column not in columns:
            columns.append(column)
        rows.setdefault(row, {}).setdefault(column, {})[cell.config.run.seed] = float(
            summary[experiment.value]
        )
    return rows, columns


def differences_table(rows: dict, columns: list[str], pairs: list[str]) -> str:
    """Per row, each pair's mean paired difference in points, (p; Holm-corrected p)."""
    wanted = []
    for pair in pairs:
        first, _, second = (part.strip() for part in pair.partition(" - "))
        for name in (first, second):
            if name not in columns:
                raise SystemExit(f"--differences {pair!r}: {name!r} is not a column (columns: {columns})")
        wanted.append((first, second))
    tests, means = [], []
    for values in rows.values():
        for first, second in wanted:
            a, b = values.get(first, {}), values.get(second, {})
            common = sorted(set(a) & set(b))
            means.append(100 * sum(a[s] - b[s] for s in common) / len(common) if common else None)
            tests.append(difference_p_value(a, b) if len(common) >= 2 else None)
    adjusted = holm(tests)
    lines = [
        "| row | " + " | ".join(f"{a} - {b}" for a, b in wanted) + " |",
        "|---" * (len(wanted) + 1) + "|",
    ]
    index = 0
    for row in rows:
        cells = []
        for _ in wanted:
            mean, p, q = means[index], tests[index], adjusted[index]
            index += 1
            cells.append(
                "-" if mean is None else f"{mean:+.1f} ({'-' if p is None else f'{p:.2g}; {q:.2g}'})"
            )
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", help="the grid's per-cell table (cells.csv of fedhet reproduce)")
    parser.add_argument("experiment", help="the grid's TOML file")
    parser.add_argument("--reference", help="the column the marks compare with (default: the [report]'s)")
    parser.add_argument("--correction", choices=("holm", "none"), help="default: the [report]'s, else holm")
    parser.add_argument("--differences", nargs="+", default=[], metavar='"A - B"')
    args = parser.parse_args()
    experiment = load_experiment(args.experiment)
    if args.reference:
        experiment.reference = args.reference
    if args.correction:
        experiment.correction = args.correction
    summaries = summaries_from_cells(Path(args.cells).read_text(encoding="utf-8"))
    print(report_table(experiment, summaries))
    if args.differences:
        rows, columns = by_row_and_column(experiment, summaries)
        print(differences_table(rows, columns, args.differences))


if __name__ == "__main__":
    main()
