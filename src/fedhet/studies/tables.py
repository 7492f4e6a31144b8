"""A grid's table: one row per ``rows`` value, one column per ``columns`` value, seeds as
mean ± interval with significance marks against a reference column."""

from __future__ import annotations

import numpy as np

from fedhet.run_schema import CELL_NUMBERS, CELL_TEXT, TASK_NUMBER, cell_columns
from fedhet.studies.expansion import _flatten, _lookup, short_value
from fedhet.studies.spec import Experiment
from fedhet.studies.stats import difference_p_value, estimate, holm

FAILED = object()  # a cell whose run failed (its summary says why)


TABLE_FORMATS = {"md": "table.md", "csv": "table.csv", "latex": "table.tex"}


def report_table(experiment: Experiment, summaries: dict[str, dict], digits: int = 3, fmt: str = "md") -> str:
    """A pivot table (``fmt``: Markdown, CSV or LaTeX): one row per ``rows`` value, one column
    per ``columns`` value. Cells that share a row and column (e.g. seeds left out of both)
    show mean ± the experiment's ``interval`` over them, marked ↑/↓ when significantly
    above/below the ``reference`` column of their row (paired t-tests over seeds, the table's
    tests Holm-corrected together unless ``experiment.correction`` is "none"); a note under
    the table says what the marks mean (CSV: in comment lines)."""
    row_keys, col_keys = experiment.rows, experiment.columns
    rows: dict[tuple, dict[str, list[tuple]]] = {}
    caveated: set[tuple] = set()  # (row, column) entries with a run whose summary has caveats
    col_order: list[str] = []
    for cell in experiment.cells:
        if cell.name not in summaries:
            continue
        r = tuple(short_value(_lookup(cell, k)) for k in row_keys)  # labels: a list is not hashable
        c = " ".join(short_value(_lookup(cell, k)) for k in col_keys)
        if c not in col_order:
            col_order.append(c)
        summary = summaries[cell.name]
        value = FAILED if summary.get("failed") else summary.get(experiment.value)
        rows.setdefault(r, {}).setdefault(c, []).append((cell.config.run.seed, value))
        if summary.get("caveats"):
            caveated.add((r, c))
    head = [" / ".join(k.split(".")[-1] for k in row_keys) or "run", *col_order]
    marks, tests = _reference_marks(experiment, rows, col_order)
    body: list[list[str]] = []
    for r, values in rows.items():
        cells = [" ".join(r) or "-"]
        for c in col_order:
            text = _format_values(values.get(c, []), digits, experiment.interval)
            text += marks.get((r, c), "")
            if (r, c) in caveated:
                text += " ⚠"
            cells.append(text)
        body.append(cells)
    seeds = max((len(v) for by_col in rows.values() for v in by_col.values()), default=0)
    return _render(head, body, _table_notes(experiment, seeds, bool(caveated), tests), fmt)


def _table_notes(experiment: Experiment, seeds: int, caveated: bool, tests: int) -> list[str]:
    """What the table's intervals, ⚠ and ↑/↓ marks mean."""
    notes = []
    if seeds > 1:
        what = "sample standard deviation" if experiment.interval == "std" else "95% confidence interval (t)"
        notes.append(f"mean ± {what} over the runs of each cell (up to {seeds})")
    if caveated:
        notes.append("⚠: a run with a caveat (its summary.json's caveats say why: e.g. a rule that is "
                     "another under these settings, or most clients never able to deliver)")  # fmt: skip
    if experiment.reference:
        how = (
            "uncorrected"
            if experiment.correction == "none"
            else f"Holm-corrected over the table's {tests} tests"
        )
        notes.append(
            f"↑/↓: significantly above/below the {experiment.reference!r} column of the same row "
            f"(two-sided paired t-test over seeds, p < {experiment.alpha:g}, {how})"
        )
    return notes


def _reference_marks(experiment: Experiment, rows: dict, col_order: list[str]) -> tuple[dict, int]:
    """↑/↓ per (row, column) significantly above/below the reference column of its row, and
    the number of tests made: all of the table's tests form one family for Holm's
    correction (``experiment.correction = "holm"``, the default)."""
    if not experiment.reference:
        return {}, 0
    tests: list[tuple[tuple, str, float, bool]] = []
    for r, values in rows.items():
        reference = _numbers(values.get(experiment.reference, []))
        for c in col_order:
            mine = _numbers(values.get(c, []))
            if not reference or c == experiment.reference or not mine:
                continue
            p = difference_p_value(mine, reference)
            if p is not None:
                above = bool(np.mean(list(mine.values())) > np.mean(list(reference.values())))
                tests.append((r, c, p, above))
    raw = [p for _, _, p, _ in tests]
    decided: list = raw if experiment.correction == "none" else holm(list(raw))
    marks = {}
    for (r, c, _, above), p in zip(tests, decided, strict=True):
        if p is not None and p < experiment.alpha:
            marks[(r, c)] = " ↑" if above else " ↓"
    return marks, len(tests)


def _render(head: list[str], body: list[list[str]], notes: list[str], fmt: str) -> str:
    """The table as Markdown, CSV (notes as ``#`` lines after it) or a LaTeX tabular."""
    if fmt == "csv":
        import csv
        import io

        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([head, *body])
        return out.getvalue() + "".join(f"# {note}\n" for note in notes)
    if fmt == "latex":

        def tex(text: str) -> str:
            for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                                  ("#", r"\#"), ("±", r"$\pm$"), ("↑", r"$\uparrow$"), ("↓", r"$\downarrow$"),
                                  ("⚠", r"$\triangle$")):  # fmt: skip
                text = text.replace(char, escaped)
            return text

        lines = [r"\begin{tabular}{l" + "r" * (len(head) - 1) + "}", r"\hline"]
        lines += [" & ".join(map(tex, head)) + r" \\", r"\hline"]
        lines += [" & ".join(map(tex, row)) + r" \\" for row in body]
        lines += [r"\hline", r"\end{tabular}"]
        text = "\n".join(lines) + "\n"
        return text + ("% " + tex("; ".join(notes)) + ".\n" if notes else "")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "; ".join(notes) + ".\n"
    return text


def _numbers(pairs: list[tuple]) -> dict:
    """{seed: value} of the numeric values (a repeated seed keeps its last value)."""
    return {seed: float(v) for seed, v in pairs if isinstance(v, int | float) and not isinstance(v, bool)}


def _format_values(pairs: list[tuple], digits: int, interval: str = "std") -> str:
    """The cell's text: mean ± interval of its numbers, and how many of its runs failed."""
    failed = sum(1 for _, v in pairs if v is FAILED)
    pairs = [(seed, v) for seed, v in pairs if v is not FAILED]
    note = "" if not failed else ("failed" if not pairs else f"({failed} failed)")
    return " ".join(part for part in (_format_numbers(pairs, digits, interval), note) if part)


def _format_numbers(pairs: list[tuple], digits: int, interval: str) -> str:
    numbers = [float(v) for _, v in pairs if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) > 1:
        e = estimate(numbers, interval)
        return f"{e.mean:.{digits}f} ± {e.spread:.{digits}f}"
    if numbers:
        return f"{numbers[0]:.{digits}f}"
    return " ".join(str(v) for _, v in pairs if v is not None)


def cells_csv(experiment: Experiment, summaries: dict[str, dict]) -> str:
    """One CSV row per finished cell: its name, the grid and case values that made it (a
    long list by :func:`short_value`), and its summary's numbers, with the fedhet build that
    ran it (``cells.csv`` of ``fedhet reproduce``: what a results page's numbers are
    recomputed from without the run folders)."""
    import csv
    import io

    keys: list[str] = []
    for cell in experiment.cells:
        keys += [k for k in _flatten(cell.overrides) if k not in keys and k != "run.seed"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = cell_columns([s for s in summaries.values() if s and not s.get("failed")])
    writer.writerow(["cell", *keys, *columns])
    for cell in experiment.cells:
        summary = summaries.get(cell.name)
        if summary is None or summary.get("failed"):
            continue
        values = _flatten(cell.overrides)
        given = [short_value(values[k]) if k in values else "" for k in keys]
        numbers = ["" if summary.get(k) is None else summary.get(k) for k in columns]
        numbers[columns.index("caveats")] = len(summary.get("caveats") or [])  # how many
        writer.writerow([cell.name, *given, *numbers])
    return out.getvalue()


def summaries_from_cells(text: str) -> dict[str, dict]:
    """The summaries :func:`cells_csv` wrote, as much of them as :func:`report_table` reads
    (the numbers, how the run stopped, whether it had caveats): a results page's table
    recomputed from its committed ``cells.csv`` without the run folders."""
    import csv
    import io

    out: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text)):
        summary: dict = {}
        numbers = {"seed", *CELL_NUMBERS, *CELL_TEXT}
        for key in [k for k in row if k in numbers or TASK_NUMBER.fullmatch(k)]:
            value = row.get(key, "")
            if key in ("stopped_by", "fedhet"):
                summary[key] = value or None
            elif key == "caveats":
                summary[key] = ["(a caveat)"] * int(value or 0)
            elif value != "":
                summary[key] = int(value) if key in ("seed", "rounds") else float(value)
        out[row["cell"]] = summary
    return out
