"""Experiment files: parsing and checking ``[experiment]``, ``[grid]``, ``[[cases]]`` and
``[report]`` (the format is described in :mod:`fedhet.studies.grid`)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from fedhet.config import (
    GRID_SECTIONS,
    MAX_THREADS,
    SECTIONS,
    apply_overrides,
    check_name,
    read_toml,
)
from fedhet.errors import ConfigError
from fedhet.run_schema import report_values
from fedhet.studies.expansion import Cell, _cell, _flatten, _label, _lookup
from fedhet.studies.stats import INTERVALS

EXPERIMENT_SECTIONS = GRID_SECTIONS
CORRECTIONS = ("holm", "none")  # for the tests of a table's cells against its reference column


@dataclass
class Experiment:
    name: str
    jobs: int
    cells: list[Cell]
    rows: list[str]
    columns: list[str]
    value: str
    interval: str = "std"
    reference: str | None = None
    alpha: float = 0.05
    correction: str = "holm"  # multiple comparisons against the reference: "holm" or "none"


REPORT_VALUES = report_values()  # the plain summary numbers (fedhet.run_schema); a task's are checked


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read an experiment file into its validated cells."""
    raw = read_toml(path)
    meta = _table(raw, "experiment", path, ("name", "jobs"))
    grid = _table(raw, "grid", path, None)
    report = _table(raw, "report", path, ("rows", "columns", "value", "interval", "reference", "alpha",
                                           "correction"))  # fmt: skip
    cases = raw.get("cases", [{}]) or [{}]
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise ConfigError(f"{path}: [[cases]] must be a list of tables")
    base = {k: v for k, v in raw.items() if k not in EXPERIMENT_SECTIONS}
    base = apply_overrides(base, overrides or [])
    grid = _compare_axis(base, dict(grid), path)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list")
    name, jobs = _name_and_jobs(meta, path)
    _check_cases(cases, grid, path)
    cells = _grid_cells(base, grid, cases, bool(raw.get("cases")), path)
    experiment = Experiment(
        name=name, jobs=jobs, cells=cells, **_report_settings(report, list(grid), cells, path)
    )
    if experiment.reference is not None:
        check_reference(experiment, experiment.reference, path)
    return experiment


def _name_and_jobs(meta: dict, path) -> tuple[str, int]:
    """``[experiment] name`` (the file's stem by default) and ``jobs`` (0: every core)."""
    name = meta.get("name", Path(path).stem)
    if not isinstance(name, str):
        raise ConfigError(f"{path}: experiment.name = {name!r}: expected a string")
    check_name(f"{path}: experiment.name", name)
    jobs = meta.get("jobs", 0)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 0 <= jobs <= MAX_THREADS:
        raise ConfigError(f"{path}: experiment.jobs = {jobs!r}: expected an integer in 0..{MAX_THREADS}")
    return name, jobs or (os.cpu_count() or 1)


def _grid_cells(base: dict, grid: dict, cases: list, has_cases: bool, path) -> list:
    """One cell per case and grid combination, each named by its values; two cells of one
    name are refused."""
    keys = list(grid)
    cells = []
    for index, case in enumerate(cases, start=1):
        origin = f"cases[{index}]" if has_cases else ""
        for combo in itertools.product(*(grid[k] for k in keys)):
            chosen = {**case, **dict(zip(keys, combo, strict=True))}
            cell_name = "-".join(_label(v) for v in _flatten(chosen).values()) or "base"
            cells.append(_cell(base, chosen, cell_name, path, origin))
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{path}: two cells are both named {twice!r} (repeated grid or case values)")
    return cells


def _report_value(report: dict, cells: list, path) -> str:
    """``report.value``: a summary number, either one of :data:`REPORT_VALUES` or the
    ``final_test_<metric>`` / ``best_test_<metric>`` of a metric the cells' task reports (a
    regression's rmse); refused in one line otherwise."""
    import re

    if "value" not in report:  # the cells' task's score
        from fedhet.studies.trials import first_task

        task = first_task([c.config for c in cells])
        return f"final_test_{task.score if task is not None else 'accuracy'}"
    value = report["value"]
    if value in REPORT_VALUES:
        return value
    if not isinstance(value, str) or not re.fullmatch(r"(final|best)_test_[a-z][a-z0-9_]*", value):
        raise ConfigError(
            f"{path}: report.value = {value!r}: not a summary number (final_test_<metric>, "
            f"best_test_<metric> of the task's metrics, or one of {', '.join(REPORT_VALUES)})"
        )
    from fedhet.studies.trials import check_objective_metric

    check_objective_metric(value, [(f"{path}: report.value, cell {c.name}", c.config) for c in cells])
    return value


def _report_settings(report: dict, keys: list, cells: list, path) -> dict:
    """The ``[report]`` table, checked: rows, columns (the grid's keys by default), value,
    interval, reference, alpha and correction."""
    rows = _key_list(report, "rows", [], path)
    columns = _key_list(report, "columns", keys, path)
    for key in rows + columns:
        _check_report_key(key, cells, path)
    value = _report_value(report, cells, path)
    interval = report.get("interval", "std")
    if interval not in INTERVALS:
        raise ConfigError(f"{path}: report.interval = {interval!r}: one of {', '.join(INTERVALS)}")
    reference = report.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise ConfigError(f"{path}: report.reference = {reference!r}: expected a column label (a string)")
    alpha = report.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ConfigError(f"{path}: report.alpha = {alpha!r}: expected a number in (0, 1)")
    correction = report.get("correction", "holm")
    if correction not in CORRECTIONS:
        raise ConfigError(f"{path}: report.correction = {correction!r}: one of {', '.join(CORRECTIONS)}")
    return dict(rows=rows, columns=columns, value=value, interval=interval, reference=reference,
                alpha=float(alpha), correction=correction)  # fmt: skip


def _compare_axis(base: dict, grid: dict, path) -> dict:
    """An experiment's ``[compare] algorithms = [...]`` as one more grid axis, ``algorithm``
    (each a table: the ``[algorithm]`` table's options go with its own algorithm only)."""
    compare = base.pop("compare", None)
    if compare is None:
        return grid
    algorithms = compare.get("algorithms") if isinstance(compare, dict) else None
    if not isinstance(algorithms, list) or not algorithms:
        raise ConfigError(f"{path}: [compare] needs algorithms = [...], a non-empty list")
    if any(key == "algorithm" or key.startswith("algorithm.") for key in grid):
        raise ConfigError(f"{path}: [compare] and a grid axis over the algorithm: keep one of them")
    given = base.pop("algorithm", {})
    options = {k: v for k, v in given.items() if k != "name"} if isinstance(given, dict) else {}
    grid["algorithm"] = [
        {"name": name, **(options if isinstance(given, dict) and given.get("name") == name else {})}
        for name in algorithms
    ]
    return grid


def _grid_keys(grid: dict) -> set[str]:
    """The dotted keys the grid sets (a table of values sets each of its keys)."""
    out: set[str] = set()
    for key, values in grid.items():
        for value in values:
            out.update(_flatten({key: value}))
    return out


def _check_cases(cases: list[dict], grid: dict, path) -> None:
    """Every case key is ``section.key`` (or a section's table) and none is also a grid axis
    (the grid's value would silently replace the case's)."""
    axes = _grid_keys(grid)
    for index, case in enumerate(cases, start=1):
        where = f"{path}: cases[{index}]"
        for key, value in case.items():
            if "." not in key and not isinstance(value, dict):
                raise ConfigError(f"{where}: key {key!r} must look like section.key (e.g. train.lr)")
            section = key.split(".", 1)[0]
            if section not in SECTIONS and section != "algorithm":
                raise ConfigError(f"{where}: {key!r}: no section [{section}] in a configuration")
        try:
            flat = _flatten(case)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        both = sorted(set(flat) & axes)
        if both:
            raise ConfigError(
                f"{where}: {both[0]} is also a [grid] axis; the grid's value would replace the case's "
                "(set it in one place)"
            )


def column_labels(experiment: Experiment) -> list[str]:
    """The report table's column labels, in order."""
    labels: list[str] = []
    for cell in experiment.cells:
        label = " ".join(str(_lookup(cell, k)) for k in experiment.columns)
        if label not in labels:
            labels.append(label)
    return labels


def check_reference(experiment: Experiment, reference: str, where) -> None:
    """``reference`` must be one of the table's column labels."""
    labels = column_labels(experiment)
    if reference not in labels:
        raise ConfigError(
            f"{where}: report.reference = {reference!r}: not a column of the table "
            f"(columns: {', '.join(labels)})"
        )


def _table(raw: dict, section: str, path, known: tuple[str, ...] | None) -> dict:
    """An experiment section as a dict; unknown keys are refused when ``known`` is given."""
    table = raw.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{section}] must be a table")
    for key in table if known is not None else ():
        if known is not None and key not in known:
            raise ConfigError(f"{path}: {section}.{key}: unknown key (known: {', '.join(known)})")
    return table


def _key_list(report: dict, key: str, default: list, path) -> list[str]:
    values = report.get(key, default)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigError(f"{path}: report.{key} = {values!r}: expected a list of dotted keys")
    return list(values)


def _check_report_key(key: str, cells: list[Cell], path) -> None:
    """A ``[report]`` row or column key must name a configuration key (``section.key``, or
    ``algorithm`` / ``algorithm.<option>`` of at least one cell's algorithm)."""
    from fedhet.config import SECTIONS

    section, _, name = key.partition(".")
    if section == "algorithm":
        if not name or name == "name":
            return
        options = {f.name for c in cells for f in dataclasses.fields(type(c.config.algorithm.options))}
        if name in options:
            return
    elif section in SECTIONS and name in {f.name for f in dataclasses.fields(SECTIONS[section])}:
        return
    elif section in SECTIONS and any(name in getattr(c.config, section).to_dict() for c in cells):
        return  # an option of a plug-in the section names (e.g. system.straggler_ratio)
    raise ConfigError(f"{path}: report key {key!r}: not a configuration key (section.key)")
