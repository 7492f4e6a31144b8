"""Running a bench: every study and every seed run as a task, in worker processes on this
machine or as Ray tasks, then the leaderboard.

The bench folder holds ``bench.db`` (the Optuna studies, SQLite), ``trials/<scenario>/
<method>/trial-<n>`` (the tuning runs), ``seeds/<scenario>/<method>/seed-<s>`` (the test
runs of each tuned setting) and the leaderboard (``leaderboard.md``, ``.csv``, ``.html``).
A study is one task: its trials run in their order with seeded samplers
(:mod:`fedhet.bench.study`), so a bench gives the same leaderboard with any ``--jobs``, on
Ray, and after any interruption. When a study finishes its seeds are queued. Run again, a
bench skips finished trials and seeds, resumes a half-finished seed run from its
checkpoint and runs an interrupted trial again. Every run uses ``suite.threads`` torch
threads (one by default), whatever the parallelism, so its numbers do not depend on it.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.bench.study import StudyResult, open_study, run_studies_together, run_study, status
from fedhet.bench.suite import Suite, Tuning
from fedhet.data.task import Score
from fedhet.errors import FedhetError
from fedhet.studies.executor import Executor, task_error

log = logging.getLogger("fedhet")

DATABASE = "bench.db"
SUITE_MARK = ".bench-suite"  # the name of the suite whose bench a folder holds


class PendingTasks(dict):
    """The bench's tasks in work, ``future -> (kind, what)``, with a queue their futures join
    when they finish: waiting for the next one costs nothing per task in work (waiting on
    thousands of futures at once kept a core a third busy)."""

    def __init__(self) -> None:
        super().__init__()
        self.finished: queue.SimpleQueue[Future] = queue.SimpleQueue()

    def __setitem__(self, future: Future, value: tuple[str, Any]) -> None:
        super().__setitem__(future, value)
        future.add_done_callback(self.finished.put)

    def next_finished(self, timeout: float) -> list[Future]:
        """The tasks finished since the last call, waiting up to ``timeout`` s for one."""
        try:
            done = [self.finished.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self.finished.empty():
            done.append(self.finished.get_nowait())
        return done


@dataclass
class SeedRun:
    """One seed of a tuned setting on the test set: its folder and, once run, its summary."""

    scenario: str
    method: str
    seed: int
    folder: Path
    raw: dict
    summary: dict | None = None
    fresh: bool = False  # its settings changed since it ran: start again
    repeat: int = 1  # the tuning whose setting it runs


@dataclass
class Progress:
    """What a bench has done, for its display: units are trials and seed runs."""

    trials_total: int = 0
    seeds_total: int = 0
    trials_done: int = 0
    seeds_done: int = 0
    studies_total: int = 0
    studies_done: int = 0
    scenario_units: dict[str, list[int]] = field(default_factory=dict)  # name -> [done, total]
    lines: list[str] = field(default_factory=list)  # news since the display last read them


def _quiet_runs() -> None:
    """A bench task's runs warn nothing on the terminal: their caveats are in their
    summaries, and the leaderboard shows them once per method and scenario."""
    log.setLevel(logging.ERROR)


def _seed_task(raw: dict, folder: str, fresh: bool, group: str) -> dict:
    """Run (or resume) one seed run; its summary."""
    from fedhet.config import from_dict
    from fedhet.engine.launch import run

    _quiet_runs()
    return run(from_dict(raw), folder, resume=not fresh, overwrite=fresh, group=group).summary


def _seeds_task(runs: list[tuple[dict, str, bool]], group: str) -> list[dict]:
    """Run (or resume) a tuned setting's seed runs ((configuration, folder, fresh) each) in
    lockstep as one computation (:func:`fedhet.engine.launch.run_together`); each one's
    summary, or ``{"finished": False, "failed": why}`` (the others go on)."""
    from fedhet.config import from_dict
    from fedhet.engine.cohort import CohortRun
    from fedhet.engine.launch import run_together

    _quiet_runs()
    cohort = [CohortRun(from_dict(raw), folder, resume=not fresh) for raw, folder, fresh in runs]
    out = []
    for result in run_together(cohort, group):
        if isinstance(result, BaseException):
            error = task_error(result)
            if not isinstance(error, FedhetError):
                raise error
            out.append({"finished": False, "failed": str(error)})
        else:
            out.append(result.summary)
    return out


def _study_task(suite: Suite, tuning: Tuning, storage: str, out: str, prefix: str) -> StudyResult:
    _quiet_runs()
    return run_study(suite, tuning, storage, out, prefix)


def _studies_task(suite: Suite, tunings: list[Tuning], storage: str, out: str,
                  prefix: str) -> list[StudyResult]:  # fmt: skip
    """The repeats of one method and scenario, their k-th trials in lockstep."""
    _quiet_runs()
    return run_studies_together(suite, tunings, storage, out, prefix)


class Bench:
    """One bench of a suite into a folder (see the module's docstring)."""

    def __init__(self, suite: Suite, out: Path, jobs: int = 1, ray: str | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 rerun: tuple[str, ...] = (), storage: str | None = None,
                 skip: tuple[str, ...] = ()):  # fmt: skip
        self.suite, self.out, self.jobs, self.ray = suite, out, jobs, ray
        self.given_storage = storage  # an Optuna RDB URL (a cluster's), or the folder's SQLite
        self.skip = set(skip)  # methods whose rows come from elsewhere (--against): not run
        self.live = True  # a live display reads the running studies' trials from the database
        self.rerun = set(rerun)  # method labels tuned and run again whatever their code
        self.kept: set[str] = set()  # methods whose studies a change of code left (same canary)
        self.on_progress = on_progress or (lambda progress: None)
        self.progress = Progress()
        self.studies: dict[str, StudyResult] = {}
        self.study_errors: dict[str, str] = {}
        self.not_applicable: dict[str, str] = {}
        self.seeds: dict[str, list[SeedRun]] = {}
        self.group = f"bench-{suite.name}"
        self._reader: Any = None  # this process's connection to the database, for the display

    # -- the folder ----------------------------------------------------------------------
    @property
    def storage(self) -> str:
        return self.given_storage or f"sqlite:///{(self.out / DATABASE).resolve()}"

    @property
    def prefix(self) -> str:
        """Study names in a shared database start with the suite's name (``smoke/random-50/
        fedavg``); the folder's own database keeps them plain."""
        return f"{self.suite.name}/" if self.given_storage else ""

    def _pairs(self):
        return [(s, m) for s, m in self.suite.pairs() if m.label not in self.skip]

    def _tunings(self) -> list[Tuning]:
        return [t for t in self.suite.tunings() if t.method.label not in self.skip]

    def _name(self, tuning: Tuning) -> str:
        return self.suite.study_name(tuning.scenario, tuning.method, tuning.repeat)

    def _seed_runs(self, tuning: Tuning, params: dict) -> list[SeedRun]:
        """The seed runs of a tuned setting, each marked done (summary) or fresh (changed)."""
        from fedhet.config import from_dict
        from fedhet.results import RunDirectory
        from fedhet.studies.expansion import Cell
        from fedhet.studies.launcher import settings_changed

        runs = []
        scenario, method = tuning.scenario, tuning.method
        for seed in self.suite.seeds:
            name = tuning.run_name(f"seed-{seed}")
            raw = self.suite.config(scenario, method, params, name, seed=seed)
            folder = tuning.folder(self.out / "seeds") / f"seed-{seed}"
            run = SeedRun(scenario.name, method.label, seed, folder, raw, repeat=tuning.repeat)
            directory = RunDirectory(folder)
            if directory.summary_path.exists():
                try:
                    summary = directory.read_summary()
                except FedhetError:
                    summary = {}
                changed, _ = settings_changed(Cell(name, {}, from_dict(raw)), directory)
                if changed:
                    run.fresh = True
                elif summary.get("finished") or summary.get("stopped_by") in (
                    "non_finite",
                    "no_participants",
                ):
                    run.summary = summary
            runs.append(run)
        return runs

    # -- running -------------------------------------------------------------------------
    def _claim_folder(self) -> None:
        """A bench folder holds one suite's bench: another suite's is refused in one line (its
        studies and seeds would mix with this one's); a folder without the mark (written by an
        older fedhet) is claimed unless its bench.json names none of this suite's scenarios."""
        import json

        mark = self.out / SUITE_MARK
        held = mark.read_text(encoding="utf-8").strip() if mark.is_file() else None
        if held is None and (self.out / "bench.json").is_file():
            try:
                rows = json.loads((self.out / "bench.json").read_text(encoding="utf-8")).get("rows", [])
                scenarios = {row.get("scenario") for row in rows if isinstance(row, dict)}
            except (ValueError, AttributeError):
                scenarios = set()
            if scenarios and not scenarios & {s.name for s in self.suite.scenarios}:
                held = "another suite"
        if held is not None and held != self.suite.name:
            raise FedhetError(
                f"{self.out}: holds the bench of suite {held!r}; bench suite {self.suite.name!r} into "
                "another folder (--out)"
            )
        mark.write_text(self.suite.name + "\n", encoding="utf-8")

    def run(self) -> dict:
        """Run what is left; return the leaderboard's data (see :mod:`fedhet.bench.leaderboard`)."""
        from fedhet.results import RunLock, make_folder
        from fedhet.studies.trials import requeue_interrupted, storage_url

        self._check_engines()
        make_folder(self.out, "bench folder")
        lock = RunLock(self.out / ".bench.lock")
        lock.acquire()
        try:
            self._claim_folder()
            storage_url(self.out / DATABASE, self.given_storage)  # checked; a SQLite file made whole
            todo: list[Tuning] = []
            again: dict[str, str] = {}
            for tuning in self._tunings():
                study = self._current_study(tuning, again)
                searched = frozenset(p.key for p in self.suite.params_for(tuning.scenario, tuning.method))
                requeue_interrupted(study, searched)
                result = status(study, self.suite.trials)
                result.stopped = ""  # a stopped study runs again: it may have been fixed
                self.studies[self._name(tuning)] = result
                if result.counted >= self.suite.trials:
                    self._queue_seeds(tuning, result)
                else:
                    todo.append(tuning)
            for label, why in again.items():
                log.warning("bench: %s: %s: its studies and seeds run again", label, why)
            self._count()
            self._execute(todo)
        finally:
            lock.release()
        return self.results()

    def _current_study(self, tuning: Tuning, again: dict[str, str]):
        """The tuning's study, started afresh (its trials, trial runs and seed runs removed)
        when ``--rerun`` names its method, or when the method's code changed since it ran and
        so did its behaviour (its canary, :mod:`fedhet.bench.canary`; a study from before
        canaries runs again on any change of code); ``again`` collects why, per method. A
        study kept through a change of code is said once per method."""
        import shutil

        from fedhet.bench.canary import canary_fingerprint
        from fedhet.bench.study import code_fingerprint
        from fedhet.studies.trials import delete_study

        method = tuning.method
        code = code_fingerprint(method)
        canary = canary_fingerprint(self.suite, tuning.scenario, method)
        study = open_study(self.suite, tuning, self.storage, self.prefix)
        stored = study.user_attrs.get("code")
        why = "--rerun" if method.label in self.rerun else ""
        if not why and stored is not None and stored != code and study.get_trials(deepcopy=False):
            if study.user_attrs.get("canary") == canary:
                self._say_kept(method.label)
            else:
                why = "its code changed since its studies ran"
        if why:
            again[method.label] = why
            delete_study(study.study_name, self.storage)
            for part in ("trials", "seeds"):
                shutil.rmtree(tuning.folder(self.out / part), ignore_errors=True)
            study = open_study(self.suite, tuning, self.storage, self.prefix)
        for key, value in (("code", code), ("canary", canary)):
            if study.user_attrs.get(key) != value:
                study.set_user_attr(key, value)
        return study

    def _say_kept(self, label: str) -> None:
        if label not in self.kept:
            self.kept.add(label)
            log.warning(
                "bench: %s: its code changed since its studies ran, its behaviour (canary) did not: "
                "its studies and seeds are kept",
                label,
            )

    def _check_engines(self) -> None:
        """Every scenario's engine takes the bench's placement (``--jobs``, ``--ray``)."""
        from fedhet.config import from_dict
        from fedhet.engine.launch import check_placement
        from fedhet.run_schema import objective_direction
        from fedhet.studies.trials import check_objective_metric

        configs = [
            (f"scenario {s.name}, method {m.label}", from_dict(self.suite.config(s, m, {}, "check")))
            for s, m in self._pairs()
        ]
        check_placement(configs, parallel=self.jobs > 1, ray=self.ray is not None, command="fedhet bench")
        task = check_objective_metric(
            self.suite.objective, [(f"{self.suite.path}: {name}", c) for name, c in configs]
        )
        if not self.suite.direction_given:  # the task says which way its metrics go (a plug-in's F1 up)
            self.suite.direction = objective_direction(self.suite.objective, task)

    def _queue_seeds(self, tuning: Tuning, result: StudyResult) -> None:
        name = self._name(tuning)
        if result.best_value is None:
            self.study_errors[name] = result.stopped or "no trial finished with a value"
            return
        self.seeds[name] = self._seed_runs(tuning, result.best_params)

    def _count(self) -> None:
        p, suite = self.progress, self.suite
        tunings = self._tunings()
        p.studies_total, p.trials_total = len(tunings), len(tunings) * suite.trials
        p.seeds_total = len(tunings) * len(suite.seeds)
        p.scenario_units = {s.name: [0, 0] for s in suite.scenarios}
        p.trials_done = p.seeds_done = p.studies_done = 0
        for tuning in tunings:
            scenario, name = tuning.scenario, self._name(tuning)
            result = self.studies.get(name)
            trials = min(result.counted, suite.trials) if result else 0
            failed = name in self.study_errors
            done_seeds = sum(1 for r in self.seeds.get(name, []) if r.summary is not None)
            if failed:  # its seeds will not run
                trials, done_seeds = suite.trials, len(suite.seeds)
            p.trials_done += trials
            p.seeds_done += done_seeds
            p.studies_done += int(failed or (result is not None and result.counted >= suite.trials))
            units = p.scenario_units[scenario.name]
            units[0] += trials + done_seeds
            units[1] += suite.trials + len(suite.seeds)
        self.on_progress(p)

    def _poll(self, running: set[str]) -> None:
        """Trials finished so far by the running studies (read from the database)."""
        import optuna

        if self._reader is None:
            from fedhet.studies.trials import rdb_storage

            self._reader = rdb_storage(self.storage)
        for name in running:
            try:
                study = optuna.load_study(study_name=self.prefix + name, storage=self._reader)
                self.studies[name] = status(study, self.suite.trials)
            except Exception:  # noqa: BLE001  (a busy database: the next poll reads it)
                continue
        self._count()

    def _execute(self, todo: list[Tuning]) -> None:
        pending = PendingTasks()
        waiting_seeds = [r for runs in self.seeds.values() for r in runs if r.summary is None]
        if not todo and not waiting_seeds:
            return
        executor = Executor(self.jobs, self.ray, core_budget=0)  # runs use suite.threads
        pairs = {self._name(t): t for t in self._tunings()}
        try:
            for batch in self._study_batches(todo):
                self._submit_studies(executor, batch, pending)
            for runs in self.seeds.values():
                self._submit_seeds(executor, [r for r in runs if r.summary is None], pending)
            last_poll = 0.0
            while pending:
                done = pending.next_finished(timeout=1.0)
                for future in done:
                    kind, what = pending.pop(future)
                    if kind == "study":
                        self._study_done(future, what, pairs[what], executor, pending)
                    elif kind == "studies":
                        self._studies_done(future, what, pairs, executor, pending)
                    elif kind == "seeds":
                        self._seeds_done(future, what)
                    else:
                        self._seed_done(future, what)
                if self.live and time.monotonic() - last_poll > (10.0 if self.ray else 2.0):
                    self._poll(self._running_studies(pending))
                    last_poll = time.monotonic()
                elif done:
                    self._count()
        except BrokenProcessPool:
            raise FedhetError(
                "a bench worker process died (killed, or out of memory); finished trials and seeds are "
                "kept: run the same command again to resume"
            ) from None
        finally:
            executor.close()

    def _running_studies(self, pending: PendingTasks) -> set[str]:
        """The studies in work, which the display reads (Ray's futures do not say: all)."""
        return {n for f, (k, w) in pending.items() if k in ("study", "studies")
                and (self.ray or f.running()) for n in ([w] if k == "study" else w)}  # fmt: skip

    def _study_batches(self, todo: list[Tuning]) -> list[list[Tuning]]:
        """The studies to run, in batches: the repeats of one method and scenario together
        (their k-th trials in lockstep: ``suite.lockstep``, with trials not pruned), else
        each alone."""
        if not (self.suite.in_lockstep() and self.suite.pruner == "none"):
            return [[t] for t in todo]
        batches: dict[tuple[str, str], list[Tuning]] = {}
        for tuning in todo:
            batches.setdefault((tuning.scenario.name, tuning.method.label), []).append(tuning)
        return list(batches.values())

    def _submit_studies(self, executor: Executor, batch: list[Tuning], pending: PendingTasks) -> None:
        out = str(self.out / "trials")
        if len(batch) == 1:
            future = executor.submit(_study_task, self.suite, batch[0], self.storage, out, self.prefix)
            pending[future] = ("study", self._name(batch[0]))
            return
        future = executor.submit(_studies_task, self.suite, batch, self.storage, out, self.prefix)
        pending[future] = ("studies", [self._name(t) for t in batch])

    def _submit_seed(self, executor: Executor, run: SeedRun) -> Future:
        return executor.submit(_seed_task, run.raw, str(run.folder), run.fresh, self.group)

    def _submit_seeds(self, executor: Executor, runs: list[SeedRun], pending: PendingTasks) -> None:
        """A tuned setting's seed runs still to do: one task running them in lockstep
        (``suite.lockstep``, two or more), else one task each."""
        if self.suite.in_lockstep() and len(runs) > 1:
            work = [(r.raw, str(r.folder), r.fresh) for r in runs]
            pending[executor.submit(_seeds_task, work, self.group)] = ("seeds", runs)
            return
        for run in runs:
            pending[self._submit_seed(executor, run)] = ("seed", run)

    def _seeds_done(self, future: Future, runs: list[SeedRun]) -> None:
        try:
            summaries = future.result()
        except BrokenProcessPool:
            raise
        except Exception as exc:  # noqa: BLE001  (the task itself: every one of its runs failed)
            error = task_error(exc)
            if not isinstance(error, FedhetError):
                raise
            summaries = [{"finished": False, "failed": str(error)}] * len(runs)
        for run, summary in zip(runs, summaries, strict=True):
            run.summary = summary
            if summary.get("failed"):
                self.progress.lines.append(
                    f"{run.scenario}/{run.method} seed {run.seed}: failed: {summary['failed']}"
                )

    def _study_done(self, future: Future, name: str, tuning: Tuning, executor: Executor,
                    pending: PendingTasks) -> None:  # fmt: skip
        results = self._task_results(future, [name])
        if results is not None:
            self._study_result(name, tuning, results[0], executor, pending)

    def _studies_done(self, future: Future, names: list[str], pairs: dict, executor: Executor,
                      pending: PendingTasks) -> None:  # fmt: skip
        results = self._task_results(future, names, many=True)
        for name, result in zip(names, results or [], strict=False):
            self._study_result(name, pairs[name], result, executor, pending)

    def _task_results(self, future: Future, names: list[str], many: bool = False) -> list | None:
        """A study task's results (one per study), or None with each study's error kept when
        the task failed (one task's failure: the others go on)."""
        try:
            result = future.result()
        except BrokenProcessPool:
            raise
        except Exception as exc:  # noqa: BLE001  (one study's failure: the others go on)
            error = task_error(exc)
            if not isinstance(error, FedhetError):
                raise
            for name in names:
                self.study_errors[name] = str(error)
                self.progress.lines.append(f"{name}: failed: {error}")
            return None
        return list(result) if many else [result]

    def _study_result(self, name: str, tuning: Tuning, result: StudyResult, executor: Executor,
                      pending: PendingTasks) -> None:  # fmt: skip
        self.studies[name] = result
        if result.not_applicable:
            self.not_applicable[name] = result.not_applicable
            self.study_errors[name] = result.stopped
            self.progress.lines.append(f"{name}: does not apply: {result.not_applicable}")
            return
        if result.stopped or result.best_value is None:
            self.study_errors[name] = result.stopped or "no trial finished with a value"
            self.progress.lines.append(f"{name}: stopped: {self.study_errors[name]}")
            return
        values = ", ".join(f"{k}={_short(v)}" for k, v in result.best_params.items())
        self.progress.lines.append(f"{name}: tuned, validation {result.best_value:.4f} ({values})")
        self._queue_seeds(tuning, result)
        self._submit_seeds(executor, [r for r in self.seeds[name] if r.summary is None], pending)

    def _seed_done(self, future: Future, run: SeedRun) -> None:
        try:
            run.summary = future.result()
        except BrokenProcessPool:
            raise
        except Exception as exc:  # noqa: BLE001
            error = task_error(exc)
            if not isinstance(error, FedhetError):
                raise
            run.summary = {"finished": False, "failed": str(error)}
            self.progress.lines.append(f"{run.scenario}/{run.method} seed {run.seed}: failed: {error}")

    # -- results -------------------------------------------------------------------------
    def results(self) -> dict:
        """Per (scenario, method): status, its searched keys beyond the shared ones, each
        tuning's values, validation value and per-seed results; what the leaderboard is made
        of (rows of methods run elsewhere, ``skip``, are left out)."""
        from fedhet.bench.canary import canary_fingerprint
        from fedhet.bench.study import code_fingerprint, settings_fingerprint

        rows = []
        for scenario in self.suite.scenarios:
            for method in self.suite.methods:
                if method.label in self.skip:
                    continue
                settings = settings_fingerprint(self.suite, scenario, method)
                row: dict[str, Any] = {"scenario": scenario.name, "method": method.label,
                                       "own": self.suite.own_for(scenario, method),
                                       "status": "ok", "reason": "", "tunings": [], "failed_trials": 0,
                                       "code": code_fingerprint(method), "settings": settings}  # fmt: skip
                tunings = [Tuning(scenario, method, r) for r in range(1, self.suite.tuning_repeats + 1)]
                names = [self._name(t) for t in tunings]
                row["failed_trials"] = sum(self.studies[n].failed for n in names if n in self.studies)
                errors = [self.study_errors[n] for n in names if n in self.study_errors]
                if method.label in scenario.skip:
                    row.update(status="skipped", reason=scenario.skip[method.label])
                elif names[0] in self.not_applicable:
                    row.update(status="n/a", reason=self.not_applicable[names[0]])
                elif errors:
                    row.update(status="failed", reason=errors[0])
                else:
                    row["tunings"] = [self._tuning_result(t) for t in tunings]
                if row["status"] in ("ok", "failed"):
                    row["canary"] = canary_fingerprint(self.suite, scenario, method)
                rows.append(row)
        return {"rows": rows}

    def _tuning_result(self, tuning: Tuning) -> dict:
        name = self._name(tuning)
        result = self.studies[name]
        seeds = {run.seed: _seed_result(run, self.suite.target) for run in self.seeds.get(name, [])}
        return {"repeat": tuning.repeat, "params": result.best_params, "validation": result.best_value,
                "trials": list(result.values), "seeds": seeds}  # fmt: skip


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _bytes_moved(summary: dict) -> float | None:
    """The bytes a run's clients received and sent (summary.json's, :mod:`fedhet.engine.traffic`)."""
    moved = [summary.get("bytes_down"), summary.get("bytes_up")]
    return None if any(m is None for m in moved) else float(sum(moved))  # type: ignore[arg-type]


def _seed_result(run: SeedRun, target: float | None) -> dict:
    """A seed run's numbers: its task's final test score, time to the target, its curve's
    folder."""
    summary = run.summary or {}
    if summary.get("failed") or not summary:
        return {"failed": summary.get("failed", "did not run")}
    hit = None
    if target is not None:
        targets = summary.get("targets") or {}
        hit = targets.get(str(target)) or targets.get(f"{target:g}")
    score = Score.from_summary(summary)
    return {
        "score": summary.get(f"final_test_{score.metric}"),
        "score_metric": score.metric,
        "higher_is_better": score.higher_is_better,
        "time_to_target": None if not hit else float(hit["sim_time"]),
        "sim_time": summary.get("sim_time"),
        "energy": summary.get("energy"),
        "bytes": _bytes_moved(summary),
        "caveats": list(summary.get("caveats") or []),
        "planner_knowledge": summary.get("planner_knowledge", ""),
        "folder": str(run.folder),
        "fedhet": summary.get("fedhet", ""),
    }
