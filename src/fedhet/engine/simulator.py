"""The embedded engine: one process, one virtual clock, one reused working model.

A round driver over the engine pieces (:mod:`~fedhet.engine.clock`,
:mod:`~fedhet.engine.evaluation`, :mod:`~fedhet.engine.records`,
:mod:`~fedhet.engine.state`, :mod:`~fedhet.engine.clients`, :mod:`fedhet.results`). Each
round: the algorithm plans; the system model prices the plan's workload and samples outcomes
(depth, steps done, finish time) from the round's own random stream, with their marginals;
the algorithm turns each client's outcome into a task; the clients do their tasks; the
algorithm aggregates the updates; the clock advances by the round's simulated duration.

Every round ends with an atomic checkpoint, so an interrupted run resumes from its last
finished round and ends with exactly the metrics of an uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet import seeding
from fedhet.algorithms import RoundContext
from fedhet.config import Config
from fedhet.engine.clients import InProcessClients, TaskOrder
from fedhet.engine.clock import VirtualClock, round_duration
from fedhet.engine.evaluation import Evaluator
from fedhet.engine.faults import NonFinite, params_fault, update_fault
from fedhet.engine.records import metrics_row, run_summary
from fedhet.engine.state import RunState, from_checkpoint, to_checkpoint
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


class Simulator:
    """Runs one configuration on the embedded engine, writing to ``out_dir``.

    ``client_order`` reorders each round's tasks before they run (as an engine running
    clients in parallel or in other processes would); results do not depend on it."""

    def __init__(
        self,
        config: Config,
        out_dir: str | Path,
        on_round: Callable[[dict], None] | None = None,
        client_order: TaskOrder | None = None,
        clients_factory: Callable[[World], object] | None = None,
    ):
        self.config = config
        self.run_dir = RunDirectory(out_dir)
        self.on_round = on_round
        self.client_order = client_order
        self.clients_factory = clients_factory

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

    def _run(self, resume: bool, stop_after: int | None) -> RunResult:
        config, run_dir = self.config, self.run_dir
        saved = run_dir.load_checkpoint() if resume and run_dir.checkpoint_path.exists() else None
        if saved is not None and saved.get("round", 0) > config.run.rounds:
            raise FedhetError(
                f"run.rounds = {config.run.rounds}: {run_dir.path} already holds {saved['round']} "
                f"rounds; --resume needs run.rounds >= {saved['round']}"
            )
        world = build_world(config)
        if self.clients_factory is not None:  # another engine's clients (Flower)
            clients = self.clients_factory(world)
        else:
            clients = InProcessClients(
                world.worker,
                world.client_data,
                config.run.seed,
                rule=world.algorithm,
                order=self.client_order,
            )
        if saved is not None:
            state = from_checkpoint(saved, config.to_dict(), str(run_dir.checkpoint_path))
            world.system.load_state_dict(state.system)
            run_dir.remove_summary()  # written again when the run finishes
        else:
            state = self._fresh_state(world, clients)
        with run_dir.writing(state.round):
            self._write_reports(world, state)
            run_dir.write_config(config.to_toml())
            run_dir.write_metrics(state.metrics)
            if state.client_metrics:
                run_dir.write_client_metrics(state.client_metrics)
        for note in world.algorithm.warnings(state.algorithm):
            log.warning("%s: %s", config.run.name, note)
        evaluator = make_evaluator(world)
        clock = VirtualClock(state.sim_time, config.run.time_budget)
        started, wall_before = time.perf_counter(), state.wall_time
        last = config.run.rounds if stop_after is None else min(stop_after, config.run.rounds)
        fault = None
        step = self._round
        if getattr(world.algorithm, "event_driven", False):  # asynchronous: server steps, not rounds
            from fedhet.engine.events import EventDriver

            step = EventDriver(self).round
        for t in range(state.round, last):
            if state.stopped_by:
                break
            result = step(world, clients, clock, evaluator, state, t)
            if result is None:  # the next round would exceed the time budget
                with run_dir.writing(state.round):
                    self._stop_on_budget(world, evaluator, state)
                break
            if isinstance(result, NonFinite):
                fault = result
                break
            row = result
            state.metrics.append(row)
            state.round = t + 1
            state.wall_time = wall_before + time.perf_counter() - started
            with run_dir.writing(t):
                run_dir.append_metrics(row)
                run_dir.save_checkpoint(to_checkpoint(state, config.to_dict()))
            if self.on_round:
                self.on_round(row)
        with run_dir.writing(state.round):
            self._write_reports(world, state)
            notes = world.algorithm.warnings(state.algorithm)
            summary = run_summary(config, world, state, notes)
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
                    state.round,
                )
            if summary["finished"] or fault is not None:
                run_dir.write_summary(summary)
        return RunResult(run_dir.path, summary, state.metrics)

    def _fresh_state(self, world: World, clients: InProcessClients) -> RunState:
        """The initial model; the algorithm's server state, after its probe tasks if any."""
        state = RunState(params=world.initial_params.clone(), buffers=world.initial_buffers.clone())
        state.system = world.system.state_dict()
        setting = world.setting(state.params, state.buffers)
        setting.work_dir = self.run_dir.path
        probes = world.algorithm.probe_tasks(setting)
        if probes:
            setting.probes = clients.run(probes, state.params, state.buffers, state.clients)
        state.algorithm = world.algorithm.init_state(setting)
        return state

    def _write_reports(self, world: World, state: RunState) -> None:
        reports = {**world.system.reports(), **world.algorithm.reports(state.algorithm)}
        for name, document in reports.items():
            self.run_dir.write_json(f"{name}.json", document)

    def _stop_on_budget(self, world: World, evaluator: Evaluator, state: RunState) -> None:
        """End the run at the time budget; make sure the last finished round is evaluated."""
        state.stopped_by = "time_budget"
        last = state.metrics[-1] if state.metrics else None
        if last is not None and last.get("test_accuracy") is None:
            self._evaluate(world, evaluator, state, last)
            self.run_dir.write_metrics(state.metrics)
        self.run_dir.save_checkpoint(to_checkpoint(state, self.config.to_dict()))

    def _round(
        self,
        world: World,
        clients: InProcessClients,
        clock: VirtualClock,
        evaluator: Evaluator,
        state: RunState,
        t: int,
    ) -> dict | NonFinite | None:
        """One round: its metrics row, a :class:`NonFinite` fault, or None when the round
        would pass the time budget."""
        config, algorithm, system = self.config, world.algorithm, world.system
        plan = algorithm.plan(t, state.algorithm, system, config.round_deadline)
        work = plan.workload()
        work.start_time = state.sim_time
        outcomes = system.sample(work, seeding.round_stream(config.run.seed, "system", t))
        context = RoundContext(
            plan, outcomes, system.marginals(work), world.num_clients, world.flat.num_layers
        )
        asked = np.array([a.asked for a in plan.assignments]) & outcomes.participates
        duration = round_duration(plan.deadline, outcomes.finish_time[asked])
        if not clock.fits(duration):
            return None
        tasks = [
            task
            for c in np.flatnonzero(asked)  # the others get no task (Algorithm.client_task)
            if (task := algorithm.client_task(context, int(c), state.algorithm))
        ]
        if system.wall_clock and plan.deadline is not None:  # clients cut their own work
            for task in tasks:
                task.time_limit = plan.deadline
        updates = clients.run(tasks, state.params, state.buffers, state.clients)
        system.observe(updates)
        state.system = system.state_dict()
        faulty = [(u.client, what) for u in updates if (what := update_fault(u))]
        if faulty and config.run.on_non_finite == "stop":
            return NonFinite(t + 1, faulty[0][0], faulty[0][1])
        if faulty:  # skip-client: those updates are left out of this round
            bad = {client for client, _ in faulty}
            updates = [u for u in updates if u.client not in bad]
        params, buffers = algorithm.aggregate(
            state.params, state.buffers, updates, state.algorithm, context, world.flat.layout
        )
        if what := params_fault(params, buffers):
            return NonFinite(t + 1, None, what)
        state.params, state.buffers = params, buffers
        state.sim_time = clock.advance(duration)
        # depths reached: sampled by the model, or (wall-clock) delivered by the clients
        depths = np.array([u.depth for u in updates]) if system.wall_clock else outcomes.depth[asked]
        row = metrics_row(
            t + 1,
            state.sim_time,
            duration,
            plan.deadline,
            plan.lr,
            updates,
            depths,
            len(faulty),
        )
        if evaluator.due(t + 1):
            self._evaluate(world, evaluator, state, row)
        return row

    def _evaluate(self, world: World, evaluator: Evaluator, state: RunState, row: dict) -> None:
        """Test loss and accuracy into ``row``; with ``run.client_eval`` also every client's."""
        state.buffers = evaluator.refresh_buffers(state.params, state.buffers, int(row["round"]))
        row["test_loss"], row["test_accuracy"] = evaluator(state.params, state.buffers)
        if self.config.run.client_eval:
            for entry in evaluator.clients(
                state.params, state.buffers, world.dataset.x_train, world.train_labels, world.client_holdout
            ):
                state.client_metrics.append({"round": row["round"], **entry})
            self.run_dir.write_client_metrics(state.client_metrics)


def make_evaluator(world: World) -> Evaluator:
    """The run's evaluator: the test set, ``run.eval_every``, and the clients' training
    examples when the algorithm asks for static BatchNorm statistics."""
    config, algorithm = world.config, world.algorithm
    examples = algorithm.static_batchnorm_examples
    statistics_from = None
    if examples is not None and world.flat.buffers.numel():
        statistics_from = world.dataset.x_train[np.sort(np.concatenate(world.client_indices))]
    return Evaluator(
        world.flat,
        world.dataset.x_test,
        world.dataset.y_test,
        config.run.eval_every,
        config.run.rounds,
        statistics_from=statistics_from,
        statistics_examples=examples or 0,
        seed=config.run.seed,
    )


def run(
    config: Config, out_dir: str | Path, resume: bool = False, overwrite: bool = False, **kwargs
) -> RunResult:
    """Run ``config`` on its engine: the embedded one (see :class:`Simulator`) or, with
    ``run.engine = "flower"``, Flower's simulation runtime (:mod:`fedhet.engine.flower`)."""
    if config.run.engine == "flower":
        from fedhet.engine.flower import run_simulation

        return run_simulation(
            config, out_dir, resume=resume, overwrite=overwrite, on_round=kwargs.get("on_round")
        )
    simulator_kwargs = {k: kwargs.pop(k) for k in ("on_round", "client_order") if k in kwargs}
    return Simulator(config, out_dir, **simulator_kwargs).run(resume=resume, overwrite=overwrite, **kwargs)
