"""The one trial runner of ``fedhet tune`` and ``fedhet bench``: an Optuna study, its trials
run one after another through Optuna's public ask-and-tell interface, each trial a normal
fedhet run.

- :class:`SearchSpace` — what is searched and how a trial is judged (objective, direction,
  sampler, pruner, the searched keys).
- :func:`open_study` — the study in its storage (created, or loaded to resume); SQLite
  files are made whole before anyone opens them (:func:`storage_url`).
- :func:`requeue_interrupted` — trials a kill left running are failed, recorded as
  interrupted (the study's ``interrupted`` attribute) and their values queued to run again.
- :func:`run_trial` — one trial: values drawn, the run (pruned by the median pruner through
  :class:`TrialPruning`), its value; a run that diverged scores the worst value.
- :func:`run_trials` — trials until enough counted (finished or pruned); a failed trial
  does not count, ``max_failures`` failures in a row stop the loop with the last reason,
  and a configuration error before any trial counted says the method does not apply
  (:func:`record_trial`, also for trials whose runs ran elsewhere: the bench's repeats in
  lockstep).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fedhet.data.task import objective_of
from fedhet.errors import ConfigError, FedhetError
from fedhet.search_space import Param

if TYPE_CHECKING:
    from fedhet.config import Config
    from fedhet.engine.callbacks import RunContext

PRUNED_FILE = "pruned.json"
INTERRUPTED = "interrupted"  # a study attribute: the numbers of trials a kill interrupted


@dataclass
class SearchSpace:
    """What a study searches and how it judges a trial (``path``: where it was read, for
    messages)."""

    objective: str = "final_test_accuracy"
    direction: Literal["maximize", "minimize"] = "maximize"
    direction_given: bool = False  # set by the file; else the task's metrics decide (objective_direction)
    sampler: str = "tpe"
    seed: int | None = None
    pruner: str = "median"
    startup_trials: int = 3
    warmup_steps: int = 0
    params: list[Param] = field(default_factory=list)
    per_algorithm: dict[str, list[Param]] = field(default_factory=dict)
    path: str = "space"

    @property
    def target(self) -> float | None:
        """The accuracy of a ``time_to:`` objective."""
        return float(self.objective.split(":", 1)[1]) if self.objective.startswith("time_to:") else None

    def params_for(self, algorithm: str) -> list[Param]:
        """The keys searched for ``algorithm``: the shared ``[params]`` and its own."""
        return [*self.params, *self.per_algorithm.get(algorithm, [])]

    def values_to_check(self, param: Param) -> list:
        """The values of ``param`` a configuration must accept: both ends, every choice."""
        return list(param.choices) if param.choices is not None else [param.low, param.high]

    def pruner_object(self):
        """Optuna's pruner for this space: the median pruner, or none."""
        import optuna

        if self.pruner == "median":
            return optuna.pruners.MedianPruner(
                n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_steps
            )
        return optuna.pruners.NopPruner()

    def worst(self) -> float:
        """The value of a run that diverged: the worst outcome in the study's direction."""
        return 0.0 if self.direction == "maximize" and self.target is None else math.inf


def objective_value(summary: dict, space: SearchSpace) -> float:
    """The number a trial is judged by, from its run's summary (``time_to``: the simulated
    time the task's score first reached the target; infinity when it never did)."""
    if space.target is not None:
        targets = summary.get("targets") or {}
        hit = targets.get(str(space.target)) or targets.get(f"{space.target:g}")
        return float(hit["sim_time"]) if hit else math.inf
    value = objective_of(summary, space.objective)
    return math.nan if value is None else value


def failure_reason(exc: BaseException) -> str:
    """Why a trial failed, in one line: a plug-in's own line, a fedhet error's message, or
    the exception's type and text."""
    reason = getattr(exc, "line", None) or (
        str(exc) if isinstance(exc, FedhetError) else f"{type(exc).__name__}: {exc}"
    )
    return (reason.strip().splitlines() or [type(exc).__name__])[0][:300]


class TrialPruning:
    """A run callback: each evaluation goes to the trial; when the median pruner says so,
    the run stops (``stopped_by = "callback"``) and its folder says why (pruned.json)."""

    name = "tune-pruning"
    context: RunContext  # set by the run loop

    def __init__(self, trial, space: SearchSpace):
        self.trial, self.space = trial, space
        self.pruned: str | None = None

    def after_round(self, state, row: dict):
        # the objective's metric, round by round (final_test_rmse: test_rmse)
        key = "test_" + self.space.objective.removeprefix("final_test_").removeprefix("best_test_")
        value = row.get(key)
        if value is None or self.space.target is not None or self.space.pruner == "none":
            return None
        step = int(row["round"])
        self.trial.report(float(value), step)
        if not self.trial.should_prune():
            return None
        (self.context.folder / PRUNED_FILE).write_text(json.dumps({"round": step, key: value}))
        self.pruned = f"pruned at round {step} ({key} {value:.4g})"
        return True, {}


# -- storage and studies -----------------------------------------------------------------
def storage_url(default_file: Path, storage: str | None = None) -> str:
    """The storage URL (default: SQLite ``default_file``); a given one is checked first
    (:func:`check_storage`); a SQLite file is made whole before anyone opens it (see
    :func:`create_sqlite_whole`)."""
    if storage is not None:
        check_storage(storage)
    url = storage or f"sqlite:///{default_file.resolve()}"
    file = _sqlite_file(url)
    if file is not None:
        create_sqlite_whole(file)
    return url


def _sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (a query string is no part of it); None otherwise."""
    prefix = "sqlite:///"
    file = url[len(prefix) :].split("?", 1)[0]
    return Path(file) if url.startswith(prefix) and file not in ("", ":memory:") else None


OPTUNA_TABLES = {"studies", "trials", "version_info"}  # tables every Optuna storage has
STORAGE_TIMEOUT = 20.0  # seconds a study database has to answer the first connection


def answer_within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, or ``TimeoutError`` when it has not returned within ``seconds``
    (a server that accepts a connection and never answers). The call goes on in a daemon
    thread, which does not keep the process from exiting; its exception is raised here."""
    import threading

    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001  (raised again in the caller)
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="fedhet-answer-within", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def check_storage(url: str, flag: str = "--storage") -> None:
    """One line, before anything runs, for a storage URL Optuna cannot use as a study
    database: not a URL, an unknown scheme, a driver not installed, an in-memory database
    (lost when the command ends, one per process), a SQLite file that cannot be made, a
    database that cannot be opened or holds another program's tables. An empty database
    or one with Optuna's tables passes."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    where = f"{flag} {url!r}"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise FedhetError(
            f"{where}: not a database URL (e.g. sqlite:///study.db, postgresql://user@host/db)"
        ) from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise FedhetError(
            f"{where}: unknown database scheme {parsed.drivername!r} (sqlite, postgresql, mysql, ...)"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise FedhetError(
            f"{where}: its database driver is not installed ({exc.name or exc}): pip install it"
        ) from None
    if parsed.drivername.startswith("sqlite") and parsed.database in (None, "", ":memory:"):
        raise FedhetError(
            f"{where}: an in-memory database is lost when the command ends; give a file, e.g. sqlite:///study.db"
        )
    _check_sqlite_folder(where, _sqlite_file(url))
    tables = _table_names(url, where)
    if tables and not OPTUNA_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:4])
        raise FedhetError(
            f"{where}: holds another program's tables ({shown}), not Optuna's: give another database"
        )


def _table_names(url: str, where: str) -> set[str]:
    """The tables of the database at ``url``; one line when it cannot be opened or its
    server does not answer within :data:`STORAGE_TIMEOUT`."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.exc import SQLAlchemyError

    engine = create_engine(url)

    def table_names() -> set[str]:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())

    try:
        return answer_within(STORAGE_TIMEOUT, table_names)
    except TimeoutError:
        raise FedhetError(
            f"{where}: the database server did not answer within {STORAGE_TIMEOUT:g} s (is it a database, "
            "and running?)"
        ) from None
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise FedhetError(f"{where}: cannot open the database ({reason})") from None
    finally:
        engine.dispose()


def _check_sqlite_folder(where: str, file: Path | None) -> None:
    """A SQLite file's folder must be one (or be creatable): no file in its way."""
    if file is None:
        return
    for folder in [file.parent, *file.parent.parents]:
        if folder.exists():
            if not folder.is_dir():
                raise FedhetError(
                    f"{where}: {folder} is a file, not a folder: the database cannot be made there"
                )
            return


def create_sqlite_whole(path: Path) -> None:
    """Create an Optuna SQLite database under a private name and link it into place.

    Optuna sets a fresh database's schema up on first open; two processes opening the same
    new file at once (a second ``fedhet tune``, a report, a parallel worker) can both stamp
    the schema version and one of them fails (``UNIQUE constraint failed:
    alembic_version``). Here the file appears only once complete; a process that loses the
    race to create it uses the winner's file."""
    if path.exists():
        return
    import optuna

    path.parent.mkdir(parents=True, exist_ok=True)
    private = path.with_name(f".{path.name}.{os.getpid()}.creating")
    private.unlink(missing_ok=True)
    try:
        storage = optuna.storages.RDBStorage(f"sqlite:///{private}")
        storage.engine.dispose()
        try:
            os.link(private, path)  # atomic: fails if another process created it first
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(private, path)
    finally:
        private.unlink(missing_ok=True)


# A study database's server that stops answering on an open connection: the driver gives up
# on a dead peer (PostgreSQL: TCP keepalives and unacknowledged data after 60 s; MySQL: a
# read timeout) instead of waiting for ever. A server that is alive but never answers a
# statement is still waited for on PostgreSQL (its driver has no read timeout).
DRIVER_TIMEOUTS = {
    "postgresql": {"connect_timeout": 20, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                   "keepalives_count": 3, "tcp_user_timeout": 60_000},
    "mysql": {"connect_timeout": 20, "read_timeout": 120, "write_timeout": 120},
}  # fmt: skip


_SCHEMA_CHECKED: set[tuple[str, int]] = set()  # (url, pid): databases this process checked


def rdb_storage(url: str):
    """Optuna's storage of the database at ``url``, its driver told to give up on a server
    that stopped answering (:data:`DRIVER_TIMEOUTS`). Its schema's compatibility is checked
    once per database and process (the check reads Optuna's migration scripts: 40% of a
    bench's start, which opens a storage per study)."""
    import optuna
    from sqlalchemy.engine import make_url

    connect_args = DRIVER_TIMEOUTS.get(make_url(url).get_backend_name())
    engine_kwargs = {"connect_args": dict(connect_args)} if connect_args else None
    checked = (url, os.getpid())
    storage = optuna.storages.RDBStorage(
        url, engine_kwargs=engine_kwargs, skip_compatibility_check=checked in _SCHEMA_CHECKED
    )
    _SCHEMA_CHECKED.add(checked)
    return storage


def open_study(name: str, storage: str, space: SearchSpace, sampler=None):
    """The study ``name`` (created, or loaded to resume) with the space's direction and
    pruner and ``sampler`` (default: Optuna's)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failed trials: our own one line
    return optuna.create_study(
        study_name=name, storage=rdb_storage(storage), direction=space.direction, sampler=sampler,
        pruner=space.pruner_object(), load_if_exists=True,
    )  # fmt: skip


def delete_study(name: str, storage: str) -> None:
    """Remove study ``name`` and its trials from ``storage`` (none there: nothing to do)."""
    import optuna

    try:
        optuna.delete_study(study_name=name, storage=rdb_storage(storage))
    except KeyError:
        pass


def interrupted(study) -> set[int]:
    """The numbers of the trials a kill interrupted (failed, their values run again)."""
    marked = {t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get(INTERRUPTED)}
    return marked | set(study.user_attrs.get(INTERRUPTED, []))  # a trial attribute in older benches


def requeue_interrupted(study, searched: frozenset[str] | None = None) -> list[int]:
    """Trials a kill left RUNNING: failed, recorded as interrupted, and their values queued
    to run again (a trial killed before its values were drawn has none to run); their
    numbers. With ``searched`` (the keys a bench's trial draws; its sampler is seeded by the
    trial's index), a trial killed between two of its draws is not queued: the next trial,
    of the same index, draws all its values again, as the uninterrupted bench did."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return []
    study.set_user_attr(INTERRUPTED, sorted(interrupted(study) | {t.number for t in running}))
    for trial in running:
        study.tell(trial.number, state=TrialState.FAIL)
        if trial.params and (searched is None or searched <= set(trial.params)):
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
    return [t.number for t in running]


def counted(study) -> int:
    """Trials that count: finished or pruned."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def first_task(configs: list[Config]):
    """The task of the first of ``configs`` whose dataset opens (None when none does): what
    a grid's table shows by default (its score)."""
    from fedhet.world import open_configured_dataset

    for config in configs:
        try:
            return open_configured_dataset(config).task
        except FedhetError:
            continue
    return None


def check_objective_metric(objective: str, configs: list[tuple[str, Config]]):
    """Before anything runs: a ``final_test_<metric>`` / ``best_test_<metric>`` objective
    names a metric every run's task reports (a regression reports no accuracy); one line
    naming the task's metrics otherwise. A dataset that does not load is left to its runs.
    Returns the first run's task (None when none loaded): it says the objective's direction
    (:func:`fedhet.run_schema.objective_direction`)."""
    if not objective.startswith(("final_test_", "best_test_")):
        return None
    from fedhet.world import open_configured_dataset

    metric, seen, first = objective.split("_test_", 1)[1], set(), None
    for label, config in configs:
        key = (config.data.dataset, repr(config.data.options("dataset")))
        if key in seen:
            continue
        seen.add(key)
        try:
            task = open_configured_dataset(config).task
        except FedhetError:
            continue
        if metric not in task.metric_names():
            raise ConfigError(
                f"{label}: objective {objective!r}: dataset {config.data.dataset!r} is a {task.name} task "
                f"reporting {', '.join(task.metric_names())}; judge it by final_test_{task.score}"
            )
        first = first or task
    return first


# -- trials ------------------------------------------------------------------------------
MakeRun = Callable[[dict, int], "tuple[Config, Path]"]  # (values, trial number) -> (config, folder)


def run_trial(trial, params: list[Param], space: SearchSpace, make_run: MakeRun, group: str | None) -> float:
    """One trial: its values drawn from ``params``, its run (``make_run(values, number)``
    gives the configuration and the folder), its value. A pruned run raises
    ``TrialPruned``; a run that diverged scores :meth:`SearchSpace.worst`."""
    import optuna

    from fedhet.engine.launch import run

    config, folder = prepare_trial(trial, params, make_run)
    pruning = TrialPruning(trial, space)
    summary = run(config, folder, overwrite=True, group=group, callbacks=[pruning]).summary
    if pruning.pruned:
        raise optuna.TrialPruned(pruning.pruned)
    return trial_value(trial, summary, space)


def prepare_trial(trial, params: list[Param], make_run: MakeRun):
    """A trial's values drawn from ``params`` and its run's (configuration, folder)."""
    values = {p.key: p.suggest(trial) for p in params}
    config, folder = make_run(values, trial.number)
    trial.set_user_attr("run_folder", str(folder))
    return config, folder


def trial_value(trial, summary: dict, space: SearchSpace) -> float:
    """A finished trial run's value: its objective, or :meth:`SearchSpace.worst` for a run
    that diverged (not its last evaluation)."""
    if summary.get("stopped_by") == "non_finite":
        trial.set_user_attr("diverged", True)
        return space.worst()
    value = objective_value(summary, space)
    if math.isnan(value):
        raise FedhetError(f"the run has no {space.objective} (no evaluation?)")
    return value


@dataclass
class LoopEnd:
    """How :func:`run_trials` ended: trials counted by it, failures in a row at the end and
    the last reason, and why the method does not apply (a configuration error before any
    trial of the study counted)."""

    counted: int = 0
    failed_in_a_row: int = 0
    reason: str = ""
    not_applicable: str = ""

    def stopped(self, max_failures: int) -> bool:
        return bool(self.not_applicable) or self.failed_in_a_row >= max_failures


def trial_line(study_name: str, trial, reason: str = "") -> str:
    """One line per finished trial: its value (or pruned / failed and why) and parameters."""
    params = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items()
    )
    state = trial.state.name
    what = {"COMPLETE": f"value {trial.value:.6g}" if trial.value is not None else "no value",
            "PRUNED": "pruned", "FAIL": f"failed: {reason}"}.get(state, state.lower())  # fmt: skip
    return f"{study_name}: trial {trial.number}: {what} ({params})"


@dataclass
class StudyTrials:
    """One study's trials still to run, for :func:`run_trials_together`: how many more to
    count, the searched ``params``, the ``space``, the run maker and each trial's sampler;
    ``end`` says how its loop stands."""

    study: Any
    trials: int
    params: list
    space: Any
    make_run: MakeRun
    sampler_for: Callable[[Any], Any] | None = None
    end: LoopEnd = field(default_factory=LoopEnd)


def run_trials_together(loops: list[StudyTrials], run_many: Callable[[list], list], max_failures: int,
                        config_error_stops: bool = False) -> None:  # fmt: skip
    """:func:`run_trials` for several studies at once: each study still going asks its next
    trial, their runs go to ``run_many`` together (a list of (configuration, folder); it
    returns each run's summary, or the exception that ended it), and each trial is told
    and counted as :func:`run_trials` does (trials are not pruned here)."""
    while active := [
        loop for loop in loops if loop.end.counted < loop.trials and not loop.end.stopped(max_failures)
    ]:
        asked = []
        for loop in active:
            if loop.sampler_for is not None:
                loop.study.sampler = loop.sampler_for(loop.study)
            trial = loop.study.ask()
            try:
                asked.append((loop, trial, prepare_trial(trial, loop.params, loop.make_run)))
            except Exception as exc:  # noqa: BLE001  (the trial fails with its reason)
                record_trial(loop.study, trial, exc, loop.end, config_error_stops)
        results = run_many([run for _, _, run in asked])
        for (loop, trial, _), result in zip(asked, results, strict=True):
            outcome = (
                result if isinstance(result, BaseException) else _value_or_error(trial, result, loop.space)
            )
            record_trial(loop.study, trial, outcome, loop.end, config_error_stops)


def _value_or_error(trial, summary: dict, space: SearchSpace) -> float | BaseException:
    try:
        return trial_value(trial, summary, space)
    except Exception as exc:  # noqa: BLE001  (a run without its objective: the trial fails)
        return exc


def run_trials(study, trials: int, objective: Callable[[Any], float], max_failures: int,
               sampler_for: Callable[[Any], Any] | None = None,
               on_trial: Callable[[str, bool], None] | None = None,
               config_error_stops: bool = False) -> LoopEnd:  # fmt: skip
    """Run trials of ``study`` (``objective(trial)`` -> value) until ``trials`` of them
    counted or the loop stops (see :class:`LoopEnd`). ``sampler_for(study)`` gives each
    trial's sampler (bench: seeded by the trial's index); ``on_trial(line, counts)`` gets one
    line per finished trial; ``config_error_stops``: a configuration error before any
    trial of the study counted ends the loop (the method does not apply)."""
    end = LoopEnd()
    while end.counted < trials and not end.stopped(max_failures):
        if sampler_for is not None:
            study.sampler = sampler_for(study)
        trial = study.ask()
        try:
            outcome: float | BaseException = objective(trial)
        except Exception as exc:  # noqa: BLE001  (the trial fails with its reason; K in a row stop)
            outcome = exc
        record_trial(study, trial, outcome, end, config_error_stops, on_trial)
    return end


def record_trial(study, trial, outcome: float | BaseException, end: LoopEnd, config_error_stops: bool = False,
                 on_trial: Callable[[str, bool], None] | None = None) -> None:  # fmt: skip
    """Tell ``study`` how ``trial`` ended (``outcome``: its value, or the exception that
    ended it: pruned, or failed with its reason) and count it in ``end`` (see
    :func:`run_trials`)."""
    import optuna
    from optuna.trial import TrialState

    reason = ""
    if isinstance(outcome, optuna.TrialPruned):
        frozen = study.tell(trial, state=TrialState.PRUNED)
    elif isinstance(outcome, BaseException):
        reason = failure_reason(outcome)
        trial.set_user_attr("error", reason)
        frozen = study.tell(trial, state=TrialState.FAIL)
        end.failed_in_a_row, end.reason = end.failed_in_a_row + 1, reason
        if config_error_stops and isinstance(outcome, ConfigError) and counted(study) == 0:
            end.not_applicable = reason
    else:
        frozen = study.tell(trial, outcome)
    if frozen.state != TrialState.FAIL:
        end.counted, end.failed_in_a_row = end.counted + 1, 0
    if on_trial is not None:
        on_trial(trial_line(study.study_name, frozen, reason), frozen.state != TrialState.FAIL)
