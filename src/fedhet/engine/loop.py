"""The run loop: one configuration, one virtual clock, a driver, a client pool and callbacks.

:class:`RunLoop` builds the world, restores a checkpoint (``resume``) or starts fresh (the
algorithm's probe tasks, then its server state), asks the algorithm's driver
(:mod:`fedhet.engine.drivers`) for one metrics row at a time and hands each to the callbacks
(:mod:`fedhet.engine.callbacks`: evaluation, files, checkpoint, progress, plug-ins). The
pool (:mod:`fedhet.engine.pool`) is the in-process one, worker processes with
``run.workers`` > 1 (:mod:`fedhet.engine.processes`), or the caller's (Flower's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.config import Config
from fedhet.data.task import Score
from fedhet.device import device_name, serving_on
from fedhet.engine.callbacks import (
    Checkpoint,
    ClientTable,
    EvaluationService,
    Metrics,
    Progress,
    Reports,
    RunContext,
    callback_result,
)
from fedhet.engine.clock import EnergyAccount, VirtualClock
from fedhet.engine.drivers import DRIVERS, StepEnvironment
from fedhet.engine.evaluation import make_evaluator
from fedhet.engine.faults import NonFinite
from fedhet.engine.plugin_errors import TRACEBACK_FILE, PluginError, PluginStopped, guarded, plugin_label
from fedhet.engine.pool import ClientPool, PoolContext, TaskOrder, WorkerDied
from fedhet.engine.preflight import check_first_round, inert_mechanisms, run_caveats
from fedhet.engine.privacy import privacy_account
from fedhet.engine.records import run_summary
from fedhet.engine.state import RunState, check_checkpoint, from_checkpoint
from fedhet.engine.traffic import TrafficAccount
from fedhet.errors import FedhetError
from fedhet.results import RunDirectory
from fedhet.world import World, build_world

log = logging.getLogger("fedhet")


@dataclass
class RunResult:
    """What a finished run returns: its directory, summary and per-round metrics."""

    path: Path
    summary: dict
    metrics: list[dict]


class RunLoop:
    """Runs one configuration, writing to ``out_dir``.

    ``client_order`` reorders each round's tasks before they run in the in-process pool
    (as an engine running clients in parallel would); results do not depend on it.
    ``pool_link`` is what an engine hands its pool (the Flower engine's grid and nodes:
    :class:`~fedhet.engine.pool.PoolContext`'s ``link``). ``group``
    names the grid, ``[compare]`` or study the run is part of; ``callbacks`` are extra
    callback objects for this run (after the configured ones); ``engine`` is the name of
    the engine running the loop, recorded in the summary."""

    # set when the run starts (:meth:`run`): what the run is running on, and its state
    pool: ClientPool
    world: World
    state: RunState
    evaluation: EvaluationService
    clock: VirtualClock
    caveats: list[str]  # what makes the run say little (engine.preflight.run_caveats)

    def __init__(
        self,
        config: Config,
        out_dir: str | Path,
        on_round: Callable[[dict], None] | None = None,
        client_order: TaskOrder | None = None,
        pool_link: Any = None,
        group: str | None = None,
        callbacks: Sequence = (),
        engine: str = "embedded",
    ):
        self.config = config
        self.group = group  # the grid or [compare] this run belongs to (trackers nest it)
        self.run_dir = RunDirectory(out_dir)
        self.on_round = on_round
        self.client_order = client_order
        self.pool_link = pool_link
        self.extra_callbacks = list(callbacks)
        self.engine = engine

    def run(self, resume: bool = False, overwrite: bool = False, stop_after: int | None = None) -> RunResult:
        """Run (or resume) to ``run.rounds`` rounds, or until the next round would take the
        virtual clock past ``run.time_budget``. ``stop_after`` ends the process early after that
        many rounds in total, as an interruption would (used by tests)."""
        run_dir = self.run_dir
        run_dir.prepare(resume=resume, overwrite=overwrite)  # before anything expensive
        try:
            return self._run(resume, stop_after)
        finally:
            run_dir.release()

    def callbacks(self) -> list:
        """The built-in callbacks, the configured plug-ins and trackers, the caller's extra
        ones, then progress; each knows its run by its :class:`RunContext`."""
        world, config, run_dir = self.world, self.config, self.run_dir
        context = RunContext(config, run_dir.path, self.group, self.engine, Score.of(world.dataset.task))
        saver = Checkpoint(run_dir, config.to_dict(), self.pool, world.algorithm, config.run.checkpoint_every)
        out: list = [
            Reports(world, run_dir),
            ClientTable(world, run_dir, getattr(self, "privacy", None)),
            Metrics(run_dir, config.to_toml(), config.run.rounds),
            saver,
        ]
        plugins = config.run.callback_plugins + config.run.tracker_plugins
        out += [entry.cls.build(options, context) for entry, options in plugins]
        out += self.extra_callbacks
        if self.on_round:
            out.append(Progress(self.on_round))
        for callback in out:
            if getattr(callback, "context", None) is None:
                callback.context = context
        return out

    def _run(self, resume: bool, stop_after: int | None) -> RunResult:
        config, run_dir = self.config, self.run_dir
        device = config.run.torch_device  # a checkpoint's tensors come back there
        saved = run_dir.load_checkpoint(device) if resume and run_dir.checkpoint_path.exists() else None
        if saved is not None:
            check_checkpoint(saved, str(run_dir.checkpoint_path))
        if saved is not None and saved.get("round", 0) > config.run.rounds:
            raise FedhetError(
                f"run.rounds = {config.run.rounds}: {run_dir.path} already holds {saved['round']} "
                f"rounds; --resume needs run.rounds >= {saved['round']}"
            )
        pool: ClientPool | None = None
        try:
            pool = self._build_pool()  # the configured pool starts while the world is built
            self.world = world = self._build_world()
            pool.attach(world)
            self.pool = pool
            with serving_on(world.device):  # the server's hooks create tensors on the run's device
                return self._run_with_pool(world, saved, stop_after)
        finally:
            if pool is not None:
                pool.close()

    def _build_world(self) -> World:
        """The run's world (:func:`fedhet.world.build_world`)."""
        return build_world(self.config)

    def _one_at_a_time(self, total: int) -> dict[str, int]:
        """The batched pool's tasks that trained one client at a time, by reason; one line
        each, a warning where the run asked for the batched pool (one that mostly did not
        batch says so), else (``auto`` chose it) a note in the log."""
        counts = self.pool.one_at_a_time() if hasattr(self.pool, "one_at_a_time") else {}
        level = logging.WARNING if self.config.run.pool == "batched" else logging.INFO
        for reason, count in counts.items():
            log.log(level, "the batched pool: %d of %d tasks trained one client at a time: %s",
                    count, total, reason)  # fmt: skip
        return counts

    def _build_pool(self) -> ClientPool:
        """The pool ``run.pool`` names (:mod:`fedhet.engine.pool`), built with its options
        and what the engine hands it."""
        entry, options = self.config.run.plugins["pool"]
        return entry.cls.build(
            options, PoolContext(self.config, self.client_order, self.engine, self.pool_link)
        )

    def _run_with_pool(self, world: World, saved: dict | None, stop_after: int | None) -> RunResult:
        config = self.config
        state = self.state = self._restore(world, saved) if saved is not None else self._start(world)
        self.privacy = privacy_account(config, world, state)
        if state.stopped_by == "epsilon_budget" and self.privacy is not None and self.privacy.fits_another():
            state.stopped_by = None  # resumed with a larger run.epsilon_budget: the run goes on
        callbacks = self.callbacks()
        evaluation = self.evaluation = EvaluationService(
            make_evaluator(world), self.pool, world, self.run_dir, config.run.client_eval
        )
        evaluation.finish_interrupted(state)
        self.clock = VirtualClock(state.sim_time, config.run.time_budget)
        self.energy = EnergyAccount(state.energy, world.num_clients, config.run.energy_budget)
        self.traffic = TrafficAccount(state.energy, world)
        notify(callbacks, "on_start", state)
        label = plugin_label("algorithm", config.algorithm_name)
        for note in guarded(
            label, "warnings", state.round, world.algorithm.reporting.warnings, state.algorithm
        ):
            log.warning("%s: %s", config.run.name, note)
        self.caveats = run_caveats(config, world, state.algorithm)
        for caveat in self.caveats:
            log.warning("%s: %s", config.run.name, caveat)
        fault = self._rounds(callbacks, evaluation, stop_after)
        finished = evaluation.wait(state)  # the last round's evaluation, when under way
        self._complete(callbacks, finished)
        if finished and fault is None:
            notify(callbacks, "on_round_saved", state)  # the checkpoint no longer waits for it
        return self._finish(world, callbacks, fault)

    def _restore(self, world: World, saved: dict) -> RunState:
        """The state of a resumed run, from its checkpoint."""
        state = from_checkpoint(
            saved,
            self.config.to_dict(),
            str(self.run_dir.checkpoint_path),
            world.algorithm,
            world.flat.params.numel(),
            world.flat.buffers.numel(),
        )
        world.server_system.load_state_dict(state.system)
        self.pool.load_state_dict(state.clients.state_dict())
        state.clients = self.pool.states
        self.run_dir.remove_summary()  # written again when the run finishes
        return state

    def _start(self, world: World) -> RunState:
        """A fresh run's state, after the first-round check."""
        state = self._fresh_state(world)
        if self.config.run.max_empty_rounds:  # 0: rounds without updates are accepted, even all
            check_first_round(self.config, world, state.algorithm)
        return state

    def _rounds(self, callbacks: list, evaluation: EvaluationService, stop_after: int | None):
        """Run rounds until the last, a stop or a fault (returned)."""
        config, state = self.config, self.state
        started, wall_before = time.perf_counter(), state.wall_time
        last = config.run.rounds if stop_after is None else min(stop_after, config.run.rounds)
        driver = DRIVERS[self.world.algorithm.driver]()
        env = StepEnvironment(
            config, self.world, self.pool, self.clock, self.energy, self.traffic, self.privacy
        )
        first = state.round
        for t in range(first, last):
            if state.stopped_by:
                break
            try:
                result = driver.step(env, state, t)
            except PluginError as failed:  # the summary says so; --resume after the fix
                return failed
            except WorkerDied as died:
                raise FedhetError(
                    f"{died}; the run stops at round {t + 1}, resume with --resume (the checkpoint of "
                    f"round {self.run_dir.checkpoint_round or 0} is kept)"
                ) from None
            if result is None:  # the next round would exceed the time budget
                self._budget_stop(callbacks, evaluation)
                break
            if isinstance(result, NonFinite):
                return result
            state.metrics.append(result)
            state.round = t + 1
            empty = self._empty_streak(result)
            # rows are complete once evaluated: at once, or (in a pool worker) during the
            # next round; the state is saved after every round either way
            self._complete(callbacks, evaluation.after_round(state, result))
            state.wall_time = wall_before + time.perf_counter() - started  # the round and its evaluation
            notify(callbacks, "on_round_saved", state)
            if self.privacy is not None and not self.privacy.fits_another():
                self._budget_stop(callbacks, evaluation, "epsilon_budget")
                break
            if empty and empty >= config.run.max_empty_rounds > 0:
                self._stop_without_participants(empty)
                break
        if state.stopped_by or state.round >= config.run.rounds:  # the run ended (not cut short)
            driver.finish(env, state)  # what the driver left for later (an event-driven run's starts)
        if last > first:  # the loop's time includes the last evaluation (a budget stop's too) and the finish
            state.wall_time = wall_before + time.perf_counter() - started
        return None

    def _stop_without_participants(self, empty: int) -> None:
        """``run.max_empty_rounds`` rounds in a row had no participant: the run stops."""
        state, config = self.state, self.config
        state.stopped_by = "no_participants"
        log.warning(
            "%s: stopped after %d rounds in a row without a participant (run.max_empty_rounds = "
            "%d); the checkpoint of round %d is kept",
            config.run.name,
            empty,
            config.run.max_empty_rounds,
            state.round,
        )

    def _budget_stop(self, callbacks: list, evaluation: EvaluationService, reason: str | None = None) -> None:
        """The next round would pass ``run.time_budget``, ``run.energy_budget`` or
        ``run.epsilon_budget`` (``reason``): the run ends here, finished (refused in one line
        when no round would run)."""
        state, run = self.state, self.config.run
        energy = self.energy.refused is not None
        if state.round == 0 and reason is None:
            took = self.energy.refused if energy else self.clock.refused
            what = (
                f"run.energy_budget = {run.energy_budget:g}: less than the first round spends"
                if energy
                else f"run.time_budget = {run.time_budget:g}: shorter than the first round"
            )
            unit = "J" if energy else "simulated s"
            raise FedhetError(
                what + (f" ({took:.4g} {unit})" if took is not None else "") + "; no round would run"
            )
        state.stopped_by = reason or ("energy_budget" if energy else "time_budget")
        self._complete(callbacks, evaluation.wait(state))
        evaluation.last_row(state)  # evaluated now if it was not due (metrics.csv rewritten)
        notify(callbacks, "on_budget_stop", state)

    def _complete(self, callbacks: list, rows: list[dict]) -> None:
        """Hand complete rows to the callbacks: ``after_round`` (their columns join the row;
        a stop is kept) and then ``on_round_end`` (the row written first)."""
        state = self.state
        for row in rows:
            for callback in callbacks:
                hook = getattr(callback, "after_round", None)  # a plug-in defines the hooks it needs
                if hook is None:
                    continue
                stop, metrics = callback_result(callback, hook(state, row))
                row.update(metrics)
                if stop and state.stopped_by is None:
                    state.stopped_by = "callback"
                    state.stopped_by_callback = getattr(callback, "name", type(callback).__name__)
            notify(callbacks, "on_round_end", state, row)

    def _finish(self, world: World, callbacks: list, fault) -> RunResult:
        """The summary, written when the run ended; the last hooks."""
        config, state, run_dir = self.config, self.state, self.run_dir
        label = plugin_label("algorithm", config.algorithm_name)
        notes = guarded(label, "warnings", state.round, world.algorithm.reporting.warnings, state.algorithm)
        summary = run_summary(config, world, state, notes)
        if self.privacy is not None:
            summary.update(self.privacy.summary())
        summary["engine"] = self.engine  # the engine that ran, whatever the configuration says
        summary["pool"] = getattr(self.pool, "name", type(self.pool).__name__)
        summary["device"] = device_name(world.device)  # where the tensors lived
        grouped = getattr(self.pool, "tasks_batched", None)
        if grouped is not None:  # the batched pool: tasks trained in groups, in this process
            summary["tasks_grouped"] = grouped
            summary["tasks_alone"] = getattr(self.pool, "tasks_alone", 0)
            summary["tasks_one_at_a_time"] = self._one_at_a_time(grouped + summary["tasks_alone"])
        lockstep = getattr(self.pool, "lockstep_runs", None)
        if lockstep:  # trained as one computation with the other runs of its cohort
            summary["lockstep_runs"] = lockstep
        if self.caveats:
            summary["caveats"] = self.caveats
        inert = inert_mechanisms(config, world)
        if inert:
            summary["inert_mechanisms"] = inert
        if state.stopped_by == "callback":
            summary["stopped_by_callback"] = state.stopped_by_callback
        if isinstance(fault, PluginError):
            return self._plugin_stop(callbacks, summary, fault)
        if fault is not None:
            # the last good checkpoint stays; --resume retries the round (e.g. with
            # run.on_non_finite = "skip-client")
            summary.update(stopped_by="non_finite", finished=False, non_finite=fault.to_dict())
            summary["notes"] = [*notes, fault.describe()]
            log.warning(
                "%s: stopped: %s; the checkpoint of round %d is kept (set run.on_non_finite = "
                '"skip-client" to skip such updates, or lower train.lr)',
                config.run.name,
                fault.describe(),
                self.run_dir.checkpoint_round or 0,
            )
        notify(callbacks, "on_end", state, summary)
        if summary["finished"] or fault is not None or state.stopped_by in ("no_participants", "callback"):
            with run_dir.writing():
                run_dir.write_summary(summary)
        notify(callbacks, "on_closed", state, summary)
        return RunResult(run_dir.path, summary, state.metrics)

    def _plugin_stop(self, callbacks: list, summary: dict, failed: PluginError) -> RunResult:
        """A plug-in's hook failed: the summary says so (``stopped_by = "plugin_error"``), the
        traceback goes to the run folder, the last checkpoint stays; the run ends in one
        line that says how to go on."""
        state, run_dir = self.state, self.run_dir
        summary.update(stopped_by="plugin_error", finished=False, error=str(failed))
        notify(callbacks, "on_end", state, summary)
        with run_dir.writing():
            run_dir.write_summary(summary)
            (run_dir.path / TRACEBACK_FILE).write_text(failed.details or str(failed), encoding="utf-8")
        notify(callbacks, "on_closed", state, summary)
        raise PluginStopped(
            f"{failed}; the checkpoint of round {self.run_dir.checkpoint_round or 0} is kept: fix it and run "
            f"again with --resume (traceback: {run_dir.path / TRACEBACK_FILE})",
            failed.details,
            str(failed),
        )

    def _empty_streak(self, row: dict) -> int:
        """Rounds in a row, ending with ``row``, in which no client delivered; a warning for
        each such round."""
        if row.get("participants"):
            return 0
        streak = 0
        for earlier in reversed(self.state.metrics):
            if earlier.get("participants"):
                break
            streak += 1
        log.warning(
            "%s: round %d: no client delivered an update (%d such round%s in a row)",
            self.config.run.name,
            row["round"],
            streak,
            "" if streak == 1 else "s",
        )
        return streak

    def _fresh_state(self, world: World) -> RunState:
        """The initial model; the algorithm's server state, after its probe tasks if any."""
        state = RunState(params=world.initial_params.clone(), buffers=world.initial_buffers.clone())
        state.system = world.server_system.state_dict()
        state.clients = self.pool.states
        setting = world.setting(state.params, state.buffers)
        setting.work_dir = self.run_dir.path
        label = plugin_label("algorithm", self.config.algorithm_name)
        planner = world.algorithm.planner  # event rules have none: no probes
        probes = guarded(label, "probe_tasks", 0, planner.probe_tasks, setting) if planner else []
        if probes:
            setting.probes = list(self.pool.run(probes, state.params, state.buffers))
        state.algorithm = guarded(label, "init_state", 0, world.algorithm.init_state, setting)
        return state


def notify(callbacks: list, hook: str, *args) -> None:
    """Call ``hook`` on every callback that has it (a plug-in defines only the hooks it needs)."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)
