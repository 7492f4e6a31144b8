"""Experiment grids: one base configuration, axes of values, independent cells; and
``[compare]``, the grid of one axis (the algorithm) that ``fedhet run`` expands.

An experiment file is a run configuration plus:

- ``[experiment]``: ``name``, ``jobs`` (cells run in parallel, default: cores).
- ``[grid]``: dotted keys mapped to lists of values; cells are their Cartesian product. A
  section name may map to a list of tables, each setting several keys of that section
  together (``algorithm = [{name = "drop"}, {name = "salf", normalize = "all"}]``).
- ``[[cases]]`` (optional): tables of dotted overrides, each crossed with the grid (use
  them for settings that change together, e.g. a model with its learning rate and rounds).
- ``[report]``: ``rows`` and ``columns`` (dotted keys) and ``value`` (a summary field) of the
  table written to ``table.md``; cells that share a row and a column (seeds) show their
  mean ± ``interval`` ("std", the sample standard deviation, or "ci95", the half-width of
  the mean's 95% t-interval); with ``reference`` (a column's label as the table shows it),
  a cell significantly above or below the reference column of its row (two-sided paired
  t-test over the seeds, p < ``alpha``, default 0.05, no correction for the number of
  cells) is marked ↑ or ↓ (:mod:`fedhet.studies.stats`).

Each cell is an ordinary run directory under ``<out>/<cell name>/``; a cell with a finished
summary is skipped and a half-finished one resumes from its checkpoint, so an interrupted
grid continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import (
    MAX_THREADS,
    AlgorithmConfig,
    Config,
    apply_overrides,
    check_name,
    from_dict,
    read_toml,
    require_algorithm,
)
from fedhet.errors import ConfigError, FedhetError
from fedhet.studies.stats import INTERVALS, difference_p_value, estimate

EXPERIMENT_SECTIONS = ("experiment", "grid", "cases", "report")


@dataclass
class Cell:
    """One run of a grid: its name, overrides and validated configuration."""

    name: str
    overrides: dict[str, Any]
    config: Config


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


def _label(value: Any) -> str:
    return str(value).replace("/", "_").replace(" ", "")


def _flatten(chosen: dict[str, Any]) -> dict[str, Any]:
    """Expand grid values that are tables: ``algorithm = {name = "salf", normalize = "all"}``
    becomes ``algorithm.name = "salf"``, ``algorithm.normalize = "all"``."""
    out: dict[str, Any] = {}
    for key, value in chosen.items():
        if isinstance(value, dict):
            if "." in key:
                raise ConfigError(f"grid.{key}: a table of values needs a section name as key")
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _override_text(key: str, value: Any) -> str:
    import tomli_w

    return f"{key}={tomli_w.dumps({'v': value})[4:].strip()}"


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read an experiment file into its validated cells."""
    raw = read_toml(path)
    meta = _table(raw, "experiment", path, ("name", "jobs"))
    grid = _table(raw, "grid", path, None)
    report = _table(raw, "report", path, ("rows", "columns", "value", "interval", "reference", "alpha"))
    cases = raw.get("cases", [{}]) or [{}]
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise ConfigError(f"{path}: [[cases]] must be a list of tables")
    base = {k: v for k, v in raw.items() if k not in EXPERIMENT_SECTIONS}
    base = apply_overrides(base, overrides or [])
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list")
    name = meta.get("name", Path(path).stem)
    if not isinstance(name, str):
        raise ConfigError(f"{path}: experiment.name = {name!r}: expected a string")
    check_name(f"{path}: experiment.name", name)
    jobs = meta.get("jobs", 0)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 0 <= jobs <= MAX_THREADS:
        raise ConfigError(f"{path}: experiment.jobs = {jobs!r}: expected an integer in 0..{MAX_THREADS}")
    jobs = jobs or (os.cpu_count() or 1)
    keys = list(grid)
    cells = []
    for case in cases:
        for combo in itertools.product(*(grid[k] for k in keys)):
            chosen = {**case, **dict(zip(keys, combo, strict=True))}
            cell_name = "-".join(_label(v) for v in _flatten(chosen).values()) or "base"
            cells.append(_cell(base, chosen, cell_name, path))
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{path}: two cells are both named {twice!r} (repeated grid or case values)")
    rows = _key_list(report, "rows", [], path)
    columns = _key_list(report, "columns", keys, path)
    for key in rows + columns:
        _check_report_key(key, cells, path)
    value = report.get("value", "final_test_accuracy")
    if value not in REPORT_VALUES:
        raise ConfigError(
            f"{path}: report.value = {value!r}: not a summary number (known: {', '.join(REPORT_VALUES)})"
        )
    interval = report.get("interval", "std")
    if interval not in INTERVALS:
        raise ConfigError(f"{path}: report.interval = {interval!r}: one of {', '.join(INTERVALS)}")
    reference = report.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise ConfigError(f"{path}: report.reference = {reference!r}: expected a column label (a string)")
    alpha = report.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ConfigError(f"{path}: report.alpha = {alpha!r}: expected a number in (0, 1)")
    experiment = Experiment(
        name=name, jobs=jobs, cells=cells, rows=rows, columns=columns, value=value,
        interval=interval, reference=reference, alpha=float(alpha),
    )  # fmt: skip
    if reference is not None:
        check_reference(experiment, reference, path)
    return experiment


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


REPORT_VALUES = (
    "final_test_accuracy",
    "best_test_accuracy",
    "final_test_loss",
    "best_round",
    "rounds",
    "sim_time",
    "mean_round_time",
    "wall_time",
)


def _table(raw: dict, section: str, path, known: tuple[str, ...] | None) -> dict:
    """An experiment section as a dict; unknown keys are refused when ``known`` is given."""
    table = raw.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{section}] must be a table")
    for key in table if known is not None else ():
        if key not in known:
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


def _cell(base: dict, chosen: dict[str, Any], cell_name: str, where: str | Path) -> Cell:
    """The validated configuration of one cell: ``base`` with ``chosen`` overrides."""
    texts = [_override_text(k, v) for k, v in _flatten(chosen).items()]
    texts.append(_override_text("run.name", cell_name))
    try:
        raw = apply_overrides(base, texts)
        require_algorithm(raw, "configuration")
        config = from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{where}: cell {cell_name}: {exc}") from None
    return Cell(cell_name, chosen, config)


def compare_cells(raw: dict, where: str | Path = "config") -> list[Cell]:
    """The runs of a configuration's ``[compare] algorithms = [...]``: one cell per algorithm,
    named after it, on the same setting. An ``[algorithm]`` table holds options of its named
    algorithm only; the others run with their defaults."""
    names = raw.get("compare", {}).get("algorithms", [])
    base = {k: v for k, v in raw.items() if k not in ("compare", "algorithm")}
    given = raw.get("algorithm", {})
    cells = []
    for name in names:
        options = {k: v for k, v in given.items() if k != "name"} if given.get("name") == name else {}
        label = name.rsplit(":", 1)[-1] if isinstance(name, str) else name  # a module path's class
        cells.append(_cell(base, {"algorithm": {"name": name, **options}}, label, where))
    return cells


def _run_cell(config: Config, out_dir: str, core_budget: int | None = None) -> dict:
    """Run one cell. Threads: ``run.threads = "auto"`` within ``core_budget`` cores (a
    parallel grid's share of the free cores); 0 means one thread in a grid."""
    from fedhet.engine.loop import RunLoop
    from fedhet.threads import set_core_budget

    set_core_budget(core_budget)
    if config.run.threads == 0:
        import torch

        torch.set_num_threads(1)
    sim = RunLoop(config, out_dir)
    return sim.run(resume=True).summary


def _watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Run in each worker: end the worker as soon as the process that started it is gone
    (killed by any signal, kill -9 included), so no orphan keeps writing into a cell."""
    import threading

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(interval)

    threading.Thread(target=watch, name="fedhet-parent-watch", daemon=True).start()


def run_experiment(
    experiment: Experiment,
    out_dir: str | Path,
    jobs: int | None = None,
    on_cell: Callable[[Cell, dict], None] | None = None,
    ray: str | None = None,
) -> dict[str, dict]:
    """Run every unfinished cell (in parallel processes, or as Ray tasks when ``ray`` is
    ``"local"`` or a cluster address); return summaries by cell name."""
    from fedhet.results import RunDirectory

    out_dir = Path(out_dir)
    summaries: dict[str, dict] = {}
    todo = []
    for cell in experiment.cells:
        run_dir = RunDirectory(out_dir / cell.name)
        summary = run_dir.read_summary() if run_dir.summary_path.exists() else {}
        if summary.get("finished") or summary.get("stopped_by") == "non_finite":
            summaries[cell.name] = summary
            if on_cell:
                on_cell(cell, summaries[cell.name])
        else:
            todo.append(cell)
    workers = max(1, min(jobs or experiment.jobs, len(todo) or 1))
    if ray is not None and todo:
        summaries.update(_run_on_ray(todo, out_dir, ray, jobs or experiment.jobs, on_cell))
    if ray is not None:
        return summaries
    if workers == 1:
        for cell in todo:
            summaries[cell.name] = _run_cell(cell.config, str(out_dir / cell.name))
            if on_cell:
                on_cell(cell, summaries[cell.name])
    else:
        from fedhet.threads import free_cores

        budget = max(1, free_cores() // workers)  # the jobs' threads do not fight each other
        _preload_datasets(todo)
        with ProcessPoolExecutor(
            max_workers=workers, initializer=_watch_parent, initargs=(os.getpid(),)
        ) as pool:
            futures = {pool.submit(_run_cell, c.config, str(out_dir / c.name), budget): c for c in todo}
            for future in as_completed(futures):
                cell = futures[future]
                try:
                    summaries[cell.name] = future.result()
                except FedhetError as exc:
                    raise FedhetError(f"cell {cell.name}: {exc}") from None
                if on_cell:
                    on_cell(cell, summaries[cell.name])
    return summaries


def _preload_datasets(cells: list[Cell]) -> None:
    """Decode the cells' datasets once in this process before the workers start, so that
    forked workers share them instead of each decoding its own copy (where processes start
    by fork; elsewhere each worker loads what its cells need)."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=False) != "fork":
        return
    import torch

    from fedhet.data import open_dataset

    # a process that forks must not have started OpenMP threads: a forked worker would wait
    # on them forever; this process computes nothing heavy after the pool starts
    torch.set_num_threads(1)
    wanted = {}
    for cell in cells:
        data = cell.config.data
        options = data.options("dataset")
        wanted.setdefault((data.dataset, repr(options)), (data.entry("dataset").cls, options))
    for key in sorted(wanted)[:2]:
        try:
            open_dataset(*wanted[key])
        except FedhetError:
            pass  # the cells report it, each in its own run


def _run_on_ray(todo: list[Cell], out_dir: Path, address: str, jobs: int, on_cell) -> dict[str, dict]:
    """Each cell a Ray task (one CPU each) on a local Ray (``address = "local"``, ``jobs``
    CPUs) or the cluster at ``address``; cells write their run folders under ``out_dir``,
    which on a cluster must be a folder every node sees (a shared file system)."""
    try:
        import ray
    except ImportError:
        raise FedhetError("--ray needs Ray: pip install 'fedhet[flower]' (it brings ray)") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    started = not ray.is_initialized()
    if started:
        options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if address == "local":
            ray.init(num_cpus=max(1, jobs), **options)
        else:
            try:
                ray.init(address=address, **options)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise FedhetError(f"--ray {address}: cannot connect ({str(exc).splitlines()[0]})") from None
    summaries: dict[str, dict] = {}
    try:
        task = ray.remote(num_cpus=1)(_run_cell)
        refs = {task.remote(cell.config, str(out_dir.resolve() / cell.name), 1): cell for cell in todo}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                cell = refs[ref]
                try:
                    summaries[cell.name] = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause if isinstance(getattr(exc, "cause", None), FedhetError) else None
                    if cause is None:
                        raise
                    raise FedhetError(f"cell {cell.name}: {cause}") from None
                if on_cell:
                    on_cell(cell, summaries[cell.name])
    finally:
        if started:
            ray.shutdown()
    return summaries


def _lookup(cell: Cell, key: str) -> Any:
    section, _, field = key.partition(".")
    part = getattr(cell.config, section)
    if isinstance(part, AlgorithmConfig):
        part = part.to_dict()
    if not field and isinstance(part, dict):  # a whole [algorithm] table: name(options)
        options = ",".join(f"{k}={v}" for k, v in part.items() if k != "name")
        return f"{part.get('name')}({options})" if options else part.get("name")
    if isinstance(part, dict) or hasattr(type(part), "SLOTS"):  # a table, or a plug-in section
        return part.get(field)
    return getattr(part, field)


def report_table(experiment: Experiment, summaries: dict[str, dict], digits: int = 3) -> str:
    """A Markdown pivot table: one row per ``rows`` value, one column per ``columns`` value.
    Cells that share a row and column (e.g. seeds left out of both) show mean ± the
    experiment's ``interval`` over them, marked ↑/↓ when significantly above/below the
    ``reference`` column of their row; a note under the table says what the marks mean."""
    row_keys, col_keys = experiment.rows, experiment.columns
    rows: dict[tuple, dict[str, list[tuple]]] = {}
    col_order: list[str] = []
    for cell in experiment.cells:
        if cell.name not in summaries:
            continue
        r = tuple(_lookup(cell, k) for k in row_keys)
        c = " ".join(str(_lookup(cell, k)) for k in col_keys)
        if c not in col_order:
            col_order.append(c)
        value = summaries[cell.name].get(experiment.value)
        rows.setdefault(r, {}).setdefault(c, []).append((cell.config.run.seed, value))
    head = [" / ".join(k.split(".")[-1] for k in row_keys) or "run", *col_order]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, values in rows.items():
        cells = [" ".join(str(v) for v in r) or "-"]
        reference = _numbers(values.get(experiment.reference, [])) if experiment.reference else {}
        for c in col_order:
            text = _format_values(values.get(c, []), digits, experiment.interval)
            if reference and c != experiment.reference and (mine := _numbers(values.get(c, []))):
                p = difference_p_value(mine, reference)
                if p is not None and p < experiment.alpha:
                    above = np.mean(list(mine.values())) > np.mean(list(reference.values()))
                    text += " ↑" if above else " ↓"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    seeds = max((len(v) for by_col in rows.values() for v in by_col.values()), default=0)
    notes = []
    if seeds > 1:
        what = "sample standard deviation" if experiment.interval == "std" else "95% confidence interval (t)"
        notes.append(f"mean ± {what} over the runs of each cell (up to {seeds})")
    if experiment.reference:
        notes.append(
            f"↑/↓: significantly above/below the {experiment.reference!r} column of the same row "
            f"(two-sided paired t-test over seeds, p < {experiment.alpha:g}, uncorrected)"
        )
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "; ".join(notes) + ".\n"
    return text


def _numbers(pairs: list[tuple]) -> dict:
    """{seed: value} of the numeric values (a repeated seed keeps its last value)."""
    return {seed: float(v) for seed, v in pairs if isinstance(v, int | float) and not isinstance(v, bool)}


def _format_values(pairs: list[tuple], digits: int, interval: str = "std") -> str:
    numbers = [float(v) for _, v in pairs if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) > 1:
        e = estimate(numbers, interval)
        return f"{e.mean:.{digits}f} ± {e.spread:.{digits}f}"
    if numbers:
        return f"{numbers[0]:.{digits}f}"
    return " ".join(str(v) for _, v in pairs if v is not None)
