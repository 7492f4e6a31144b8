"""Running a grid's cells: in worker processes on this machine (each with its share of the
cores) or on a Ray cluster, through the one executor (:mod:`fedhet.studies.executor`);
finished cells are skipped, half-finished ones resume. Every
cell runs on the engine its configuration names (:func:`fedhet.engine.launch.run`); cells
whose engine cannot share the machine (a Flower simulation takes the whole of the
command's local Ray) run one
at a time in this process, and a ``--ray`` grid with such a cell is refused before any
cell runs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.config import (
    Config,
)
from fedhet.errors import FedhetError
from fedhet.studies.expansion import Cell
from fedhet.studies.spec import Experiment

log = logging.getLogger("fedhet")

GRID_LOCK = ".grid.lock"  # held while a grid runs into its folder


@dataclass
class CellLaunch:
    """How a grid's cells are launched. ``resume`` (a grid's way): a finished cell is kept
    and a half-finished one resumes; ``False`` (``fedhet run`` with a ``[compare]``, without
    ``--resume``): every cell starts in a new folder and an existing one is refused.
    ``overwrite``: every cell starts again. ``on_round``: for a cell, its progress callback
    (cells that run in this process)."""

    resume: bool = True
    overwrite: bool = False
    on_round: Callable[[Cell], Callable | None] | None = None
    command: str = "reproduce"  # the command refusals name
    keep_going: bool = True  # a failing cell is recorded as failed and the others run


def _run_cell(
    config: Config,
    out_dir: str,
    overwrite: bool = False,
    group: str | None = None,
    resume: bool = True,
    on_round: Callable | None = None,
) -> dict:
    """Run (or, with ``resume``, resume) one cell; ``overwrite`` starts it again. Threads:
    ``run.threads`` (``"auto"`` or 0) within the task's core budget (a parallel grid's share
    of the free cores, :class:`~fedhet.studies.executor.Executor`)."""
    from fedhet.engine.launch import run

    return run(
        config, out_dir, resume=resume and not overwrite, overwrite=overwrite, group=group, on_round=on_round
    ).summary


def settings_changed(cell: Cell, run_dir) -> tuple[list[str], bool]:
    """How the settings a cell's folder was run with (its config.toml) differ from the
    cell's now: the keys that make it another run, and whether only keys a resume may change
    (more rounds, threads, ...) differ."""
    import tomllib

    from fedhet.engine.state import comparable, differences

    stored_path = run_dir.path / "config.toml"
    if not stored_path.is_file():
        return [], False
    try:
        stored = tomllib.loads(stored_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ["config.toml (unreadable)"], False
    now = tomllib.loads(cell.config.to_toml())
    changed = differences(comparable(stored), comparable(now))
    return changed, not changed and bool(differences(stored, now))


def run_experiment(
    experiment: Experiment,
    out_dir: str | Path,
    jobs: int | None = None,
    on_cell: Callable[[Cell, dict], None] | None = None,
    ray: str | None = None,
    launch: CellLaunch | None = None,
) -> dict[str, dict]:
    """Run every unfinished cell (in parallel processes, or as Ray tasks when ``ray`` is
    ``"local"`` or a cluster address) as ``launch`` says (default: resume); return
    summaries by cell name."""
    from fedhet.results import RunLock

    launch = launch or CellLaunch()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out_dir / GRID_LOCK)  # one grid per folder: a second is refused in one line
    lock.acquire()
    try:
        summaries: dict[str, dict] = {}
        if launch.overwrite or not launch.resume:  # every cell runs; none is looked up
            fresh = {cell.name for cell in experiment.cells} if launch.overwrite else set()
            todo = list(experiment.cells)
        else:
            todo, fresh = _unfinished(experiment, out_dir, summaries, on_cell)
        return _launch(experiment, todo, fresh, out_dir, summaries, jobs, on_cell, ray, launch)
    finally:
        lock.release()


def _unfinished(experiment: Experiment, out_dir: Path, summaries: dict, on_cell) -> tuple[list[Cell], set]:
    """The cells still to run (and, of them, those to run from the start because their
    settings changed); finished cells' summaries go into ``summaries``."""
    from fedhet.results import RunDirectory

    todo: list[Cell] = []
    fresh: set[str] = set()  # cells whose settings changed: run again from the start
    for cell in experiment.cells:
        run_dir = RunDirectory(out_dir / cell.name)
        try:
            summary = run_dir.read_summary() if run_dir.summary_path.exists() else {}
        except FedhetError as exc:  # damaged: the cell runs again (resuming its checkpoint)
            log.warning("%s; running the cell again", exc)
            summary = {}
        done = summary.get("finished") or summary.get("stopped_by") in ("non_finite", "no_participants")
        changed, resumable = settings_changed(cell, run_dir) if summary else ([], False)
        if changed:
            more = f" and {len(changed) - 2} more" if len(changed) > 2 else ""
            log.warning(
                "cell %s: its settings changed since it ran (%s%s): running it again",
                cell.name,
                ", ".join(changed[:2]),
                more,
            )
            fresh.add(cell.name)
            todo.append(cell)
        elif done and not resumable:
            summaries[cell.name] = summary
            if on_cell:
                on_cell(cell, summaries[cell.name])
        else:
            todo.append(cell)
    return todo, fresh


def _launch(experiment, todo, fresh, out_dir, summaries, jobs, on_cell, ray, launch) -> dict[str, dict]:
    """Run ``todo``: cells whose engine uses the machine itself here, one at a time; the
    others on a Ray cluster, in ``jobs`` worker processes, or here."""
    from fedhet.engine.launch import check_placement, engine_for

    check_placement([(f"cell {c.name}", c.config) for c in todo], parallel=False, ray=ray is not None,
                    command=launch.command)  # fmt: skip
    alone = [c for c in todo if not engine_for(c.config).placement.parallel]
    todo = [c for c in todo if c not in alone]
    workers = max(1, min(jobs or experiment.jobs, len(todo) or 1))
    here = alone + (todo if ray is None and workers == 1 else [])
    for cell in here:  # one at a time, here (an engine that uses the machine itself: always)
        summaries[cell.name] = _cell_here(cell, out_dir, cell.name in fresh, experiment.name, launch)
        if on_cell:
            on_cell(cell, summaries[cell.name])
    if todo and (ray is not None or workers > 1):
        if ray is None:
            _preload_datasets(todo)
        from fedhet.studies.executor import Executor

        with Executor(workers if ray is None else jobs or experiment.jobs, ray) as executor:
            _in_executor(todo, out_dir, fresh, summaries, executor, on_cell, launch, experiment.name)
    return summaries


def _in_executor(todo, out_dir: Path, fresh, summaries: dict, executor, on_cell, launch, group) -> None:
    """The cells ``todo`` as tasks of ``executor`` (worker processes sharing the free cores,
    or Ray tasks writing under ``out_dir``, which a cluster's nodes must all see); a cell's
    error fails it (``keep_going``) or stops the grid; a dead worker stops it in one line."""
    from concurrent.futures import as_completed

    from fedhet.studies.executor import task_error

    futures = {
        executor.submit(
            _run_cell, c.config, str(out_dir.resolve() / c.name), c.name in fresh, group, launch.resume
        ): c  # fmt: skip
        for c in todo
    }
    for future in as_completed(futures):
        cell = futures[future]
        try:
            summaries[cell.name] = future.result()
        except BrokenProcessPool:
            done = sum(1 for f in futures if f.done() and not f.exception())
            raise FedhetError(
                f"cell {cell.name}: a grid worker process died (killed, or out of memory); "
                f"{done} of {len(todo)} cells finished and are kept: run the same command again "
                "to resume the rest"
            ) from None
        except Exception as exc:  # noqa: BLE001  (a fedhet error fails the cell; others are bugs)
            error = task_error(exc)
            if not isinstance(error, FedhetError):
                raise
            if not launch.keep_going:
                raise FedhetError(f"cell {cell.name}: {error}") from None
            summaries[cell.name] = failed_cell(cell, error)
        if on_cell:
            on_cell(cell, summaries[cell.name])


def _cell_here(cell: Cell, out_dir: Path, fresh: bool, group: str, launch: CellLaunch) -> dict:
    """Run one cell in this process (with its progress callback, if any); a cell that fails
    is recorded as failed with its reason (:func:`failed_cell`) unless ``launch`` says stop."""
    on_round = launch.on_round(cell) if launch.on_round else None
    try:
        return _run_cell(cell.config, str(out_dir / cell.name), fresh, group, launch.resume, on_round)
    except FedhetError as exc:
        if not launch.keep_going:
            raise
        return failed_cell(cell, exc)


def failed_cell(cell: Cell, exc: Exception) -> dict:
    """A failed cell's summary: its name and why (one line); the grid goes on without it."""
    log.warning("cell %s failed: %s", cell.name, exc)
    return {"name": cell.name, "finished": False, "failed": str(exc)}


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
    wanted: dict[tuple[str, str], tuple[Any, Any]] = {}
    for cell in cells:
        data = cell.config.data
        options = data.options("dataset")
        wanted.setdefault((data.dataset, repr(options)), (data.entry("dataset").cls, options))
    for key in sorted(wanted)[:2]:
        try:
            open_dataset(*wanted[key])
        except FedhetError:
            pass  # the cells report it, each in its own run
