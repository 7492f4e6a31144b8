"""Drivers: how a run advances from one metrics row to the next. Two peers:

- :class:`RoundDriver`: synchronous rounds. The algorithm plans; the system model prices the
  plan's workload and samples outcomes (depth, steps done, finish time) from the round's own
  random stream, with their marginals; the algorithm turns each present client's outcome
  into a task; the pool runs the tasks; each update is added to the algorithm's aggregator
  as it arrives; the clock advances by the round's simulated duration.
- :class:`EventDriver`: asynchronous rules (:class:`~fedhet.algorithms.base.AsyncAlgorithm`,
  e.g. FedBuff) on the same virtual clock: clients train continuously; a client started at
  simulated time t on model version v delivers at t + its full local work's time (a draw of
  the system model per start); the algorithm chooses which idle clients start and turns a
  full buffer into a server step, one metrics row each.

A driver's ``step(env, state, t)`` gets a :class:`StepEnvironment` (what stays fixed during
the run: configuration, world, pool, clock) and the run's state, and returns the round's
metrics row, a
:class:`~fedhet.engine.faults.NonFinite` fault, or None when the next round (or arrival)
would pass the time budget. Evaluation, files and checkpoints are the run loop's callbacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fedhet import seeding
from fedhet.algorithms import RoundContext
from fedhet.algorithms.streaming import ListAggregator
from fedhet.device import server_side
from fedhet.engine.clock import round_duration
from fedhet.engine.faults import NonFinite, params_fault, update_fault
from fedhet.engine.plugin_errors import Hooks
from fedhet.engine.records import metrics_row
from fedhet.errors import FedhetError
from fedhet.messages import UpdateSummary
from fedhet.system import Workload
from fedhet.system.energy import involved, spent_in_round

if TYPE_CHECKING:
    from fedhet.algorithms.base import AsyncAlgorithm
    from fedhet.config import Config
    from fedhet.engine.clock import EnergyAccount, VirtualClock
    from fedhet.engine.pool import ClientPool
    from fedhet.engine.privacy import PrivacyAccount
    from fedhet.engine.traffic import TrafficAccount
    from fedhet.world import World


@dataclass(frozen=True)
class StepEnvironment:
    """What a driver's step may use besides the run state."""

    config: Config
    world: World
    pool: ClientPool
    clock: VirtualClock
    energy: EnergyAccount
    traffic: TrafficAccount  # per client: bytes up and down, training FLOPs
    privacy: PrivacyAccount | None = None  # clip-noise's releases (None: the run adds no noise)


def privacy_column(env: StepEnvironment) -> dict:
    """A row's epsilons so far (:mod:`fedhet.engine.privacy`), where the run noises updates."""
    return {} if env.privacy is None else env.privacy.row()


def take_faults(pool) -> list:
    """The faults the pool met since last asked (clients whose update was not delivered)."""
    log = getattr(pool, "faults", None)
    return log.take() if log is not None else []


def upload_bytes(world: World, depths: np.ndarray | None) -> np.ndarray:
    """Per client, the bytes of its update as it travels (its planned coverage ``depths``,
    the payload vectors its algorithm sends with it, after the trainer's postprocessors):
    what system models with an upload bandwidth charge. ``None``: every client's whole model."""
    if depths is None:
        depths = np.ones(world.num_clients, dtype=int)
    levels, where = np.unique(depths, return_inverse=True)
    worker, rule = world.worker, world.algorithm
    sizes = np.array([worker.payload_bytes(int(depth), rule.client) for depth in levels], dtype=np.float64)
    return sizes[where]


def download_bytes(world: World) -> np.ndarray:
    """Per client, the bytes of the global model it is sent (float32 parameters and
    buffers, the whole model): what system models with a download bandwidth charge."""
    layout = world.flat.layout
    return np.full(world.num_clients, 4.0 * (layout.num_params + layout.num_buffers))


def server_step(world: World, state, proposed):
    """The rule's proposed parameters after the server optimizer's step ([server];
    the default sgd at lr 1 returns them as they are)."""
    optimizer = world.server_optimizer
    if optimizer is None or optimizer.is_identity:
        return proposed
    with server_side():  # its moments on the run's device
        return optimizer.step(state.params, proposed, state.server)


class RoundDriver:
    """Synchronous rounds: plan, sample, tasks, streamed aggregation."""

    name = "round"

    def finish(self, env: StepEnvironment, state) -> None:
        """The run ends: nothing of a round is left for later."""

    def step(self, env: StepEnvironment, state, t: int):
        """One synchronous round: plan, sample the outcomes, send the tasks, aggregate what
        arrives as it arrives, the server step; its metrics row (None: the round does not fit
        the time budget; a :class:`NonFinite` fault)."""
        config, world = env.config, env.world
        hooks = Hooks(config.algorithm_name, t + 1)  # the rule's hooks, named when they fail
        model = Hooks(config.system.model, t + 1, "system model")  # the system model's, likewise
        context, requested = self._sample(env, state, t, hooks, model)
        plan, outcomes = context.plan, context.outcomes
        asked = requested & outcomes.participates
        duration = round_duration(plan.deadline, outcomes.finish_time[asked])
        tasks = self._tasks(world, state, context, asked, hooks)
        spent, charged = self._energy(world, state, context, requested, tasks, duration, hooks)
        if not (env.clock.fits(duration) and env.energy.fits(spent.total)):
            return None
        env.traffic.sent_round(tasks, charged)
        received = self._aggregate(env, state, t, tasks, context, hooks, model)
        if isinstance(received, NonFinite):
            return received
        delivered, skipped = received
        # depths reached: sampled by the model, or (wall-clock) delivered by the clients
        wall_clock = world.server_system.wall_clock
        depths = np.array([u.depth for u in delivered]) if wall_clock else outcomes.depth[asked]
        state.sim_time = env.clock.advance(duration)
        env.energy.add(spent)
        faults = len(take_faults(env.pool))
        names = world.dataset.task.metric_names()
        row = metrics_row(
            t + 1, state.sim_time, duration, plan.deadline, plan.lr, delivered, depths, skipped, faults, names
        )
        row.update(energy=spent.total, energy_total=env.energy.total, **privacy_column(env))
        algorithm = world.algorithm
        return {
            **row,
            **hooks.metrics(hooks.call("round_metrics", algorithm.reporting.round_metrics, state.algorithm)),
        }

    @staticmethod
    def _sample(env: StepEnvironment, state, t: int, hooks: Hooks, model: Hooks):
        """The rule's plan, the system model's outcomes and marginals for it: the round's
        context, and whom the plan asks."""
        config, world = env.config, env.world
        algorithm, system = world.algorithm, world.server_system
        plan = hooks.plan(
            hooks.call("plan", algorithm.planner.plan, t, state.algorithm, system, config.round_deadline),
            world.num_clients,
        )
        work = plan.workload()
        work.start_time = state.sim_time
        work.upload_bytes = upload_bytes(world, work.depth)
        work.download_bytes = download_bytes(world)
        stream = seeding.round_stream(config.run.seed, "system", t)
        outcomes = model.outcomes(model.call("sample", system.sample, work, stream), world.num_clients)
        marginals = model.marginals(model.call("marginals", system.marginals, work))
        context = RoundContext(plan, outcomes, marginals, world.num_clients, world.flat.num_layers,
                               client_sizes=world.client_sizes)  # fmt: skip
        return context, np.array([a.asked for a in plan.assignments], dtype=bool)

    @staticmethod
    def _energy(world, state, context: RoundContext, requested, tasks, duration: float, hooks: Hooks):
        """The round's energy (:func:`spent_in_round`) and whom it charges (a mask): every
        involved client but those the rule says are still at work on an earlier task
        (charged when it began); a client
        sent its whole planned work that does not finish it by the deadline trains past the
        round and is charged all of it now; one sent a sub-model, its task's share of it (and
        one the rule sent no work because none fits, nothing)."""
        plan, outcomes = context.plan, context.outcomes
        charged = involved(outcomes, requested)
        busy = hooks.call("busy_clients", world.algorithm.planner.busy_clients, state.algorithm, plan.round)
        charged[hooks.clients("busy_clients", busy, world.num_clients)] = False
        idle = hooks.call("idle_clients", world.algorithm.planner.idle_clients, state.algorithm, plan.round)
        charged[hooks.clients("idle_clients", idle, world.num_clients)] = False  # told not to work
        late = np.zeros(world.num_clients, dtype=bool)
        share = np.ones(world.num_clients)
        if not world.server_system.wall_clock:  # there, clients cut their own work
            for task in tasks:
                planned, c = plan.assignments[task.client], task.client
                work = (task.local_steps, task.coverage.depth, task.coverage.width, task.work_share)
                whole = work == (planned.local_steps, planned.depth, 1.0, 1.0)
                late[c] = task.kind == "train" and whole and outcomes.full_time[c] > outcomes.finish_time[c]
                share[c] = task.work_share
        return spent_in_round(
            world.server_power, outcomes, charged, duration, late=late, share=share
        ), charged

    @staticmethod
    def _tasks(world, state, context: RoundContext, asked, hooks: Hooks) -> list:
        """The tasks of the asked, present clients (the rule may send none to some)."""
        algorithm = world.algorithm
        tasks = [
            task
            for c in np.flatnonzero(asked)  # the others get no task (Algorithm.client_task)
            if (
                task := hooks.call(
                    "client_task", algorithm.planner.client_task, context, int(c), state.algorithm
                )
            )
        ]
        deadline = context.plan.deadline
        if world.server_system.wall_clock and deadline is not None:  # clients cut their own work
            for task in tasks:
                task.time_limit = deadline
        return tasks

    @staticmethod
    def _aggregate(env: StepEnvironment, state, t: int, tasks, context, hooks: Hooks, model: Hooks):
        """The updates fed to the rule's aggregator as they arrive, its result after the
        server step as the new model: (the delivered updates' summaries, how many were
        skipped as non-finite), or a :class:`NonFinite` fault."""
        config, world = env.config, env.world
        system = world.server_system
        aggregation = world.algorithm.aggregation
        aggregator = hooks.call("aggregator", aggregation.aggregator, state.params, state.buffers, tasks,
                                state.algorithm, context, world.flat.layout)  # fmt: skip
        rule = "aggregate" if isinstance(aggregator, ListAggregator) else "streaming_aggregator"
        delivered: list[UpdateSummary] = []
        skipped = 0
        batch = {task.client: task.batch_size for task in tasks}
        batch_clients: list[int] = []
        for update in env.pool.run(tasks, state.params, state.buffers):
            batch_clients.append(update.client)
            env.traffic.trained(update, batch[update.client])
            env.traffic.uploaded(update)  # sent, whether or not the server keeps it
            what = update_fault(update)
            if what and config.run.on_non_finite == "stop":
                model.call("observe", system.observe, [*delivered, update.summary()])
                return NonFinite(t + 1, update.client, what)
            if what:  # skip-client: left out of this round
                skipped += 1
                model.call("observe", system.observe, [update.summary()])
                continue
            delivered.append(update.summary())
            hooks.call(rule, aggregator.add, update)
        model.call("observe", system.observe, delivered)
        if env.privacy is not None:  # every noised update the server received, kept or skipped
            env.privacy.record(list(batch_clients))
        state.system = system.state_dict()
        params, buffers = hooks.model(rule, hooks.call(rule, aggregator.result), state.params, state.buffers)
        params = server_step(world, state, params)
        if what := params_fault(params, buffers):
            return NonFinite(t + 1, None, what)
        state.params, state.buffers = params, buffers
        return delivered, skipped


PENDING = "pending"  # an update that trains later (EventDriver._defer)
# the most bytes of models kept for pending starts (one per server step they started at):
# 2,500 copies of a 25,818-parameter MLP, 7 of VGG-11; then the pending starts train
PENDING_MODEL_BYTES = 256 * 2**20


def defers(env: StepEnvironment) -> bool:
    """Whether the event driver trains starts when their updates are needed: the pool
    declares ``run_from_models`` and a client's error stops the run."""
    return callable(getattr(env.pool, "run_from_models", None)) and env.config.run.on_client_error == "stop"


class EventDriver:
    """Advances an asynchronous rule from one server step to the next. The in-flight
    updates, the buffer and the clients' start counts are run state (checkpointed), so a
    resumed run continues exactly.

    With a pool that trains tasks from different models as one computation
    (``run_from_models``, the batched pool's), a start's training waits until an update of
    it is needed (its arrival, the run's end): the starts made meanwhile, each on the model
    sent to it, then train as one group (a start's training depends only on its task, its
    model, its client's state and its random stream, so it gives what it would have given
    at once; a client's starts train in their order). Those pending starts and their models
    are run state too. Only where a client's error stops the run
    (``run.on_client_error = "stop"``): a skipped client must be known at its start."""

    name = "event"

    @staticmethod
    def _engine_state(state, num_clients: int) -> dict:
        if not state.engine:
            state.engine = {"in_flight": [], "buffer": [], "held": [], "starts": [0] * num_clients,
                            "dispatches": 0}  # fmt: skip
        return state.engine

    def _start_clients(self, env: StepEnvironment, state, now: float, version: int) -> None:
        """Fill the free concurrency with idle clients chosen by the algorithm, on the
        current model, each with the local steps the rule plans for it (clients whose
        update waits in the buffer for its step are held, neither idle nor in flight)."""
        world, config = env.world, env.config
        engine, algorithm = state.engine, cast("AsyncAlgorithm", world.algorithm)
        hooks = Hooks(config.algorithm_name, version + 1)
        flying, held = {entry["client"] for entry in engine["in_flight"]}, set(engine["held"])
        idle = [c for c in range(world.num_clients) if c not in flying and c not in held]
        free = hooks.call("concurrency", algorithm.scheduler.concurrency, world.num_clients) - len(flying)
        if free <= 0 or not idle:
            return
        rng = seeding.round_stream(config.run.seed, "dispatch", engine["dispatches"])
        engine["dispatches"] += 1
        chosen = [int(c) for c in hooks.call("choose", algorithm.scheduler.choose, idle, free, rng)]
        planned = hooks.call("plan_starts", algorithm.scheduler.plan_starts, state.algorithm, chosen, now)
        steps = np.full(world.num_clients, config.train.local_steps)
        steps[chosen] = [int(q) for q in planned]
        tasks = [
            dataclasses.replace(
                hooks.call("start_task", algorithm.scheduler.start_task, c, engine["starts"][c], version),
                local_steps=int(steps[c]),
            )
            for c in chosen
        ]
        if defers(env):  # the chosen clients train when an update of theirs is needed
            updates = self._defer(env, state, tasks, version)
        else:  # the chosen clients train at once (in parallel where the pool has workers)
            updates = {u.client: u for u in env.pool.run(tasks, state.params, state.buffers)}
        work = Workload(None, np.full(world.num_clients, config.train.batch_size), steps, start_time=now)
        work.upload_bytes = upload_bytes(world, np.ones(world.num_clients, dtype=int))  # the whole model
        work.download_bytes = download_bytes(world)
        for task in tasks:
            if not self._launch(env, state, task, version, work, updates.get(task.client)):
                return  # the energy budget is spent: the next server step is refused

    def _launch(self, env: StepEnvironment, state, task, version: int, work: Workload, update):
        """Price one start of ``work`` on the clock (its energy; a present client's download
        and, once its work is done, its FLOPs) and put its update in flight (unless the
        client is absent or fails before its work is done); False when the energy budget is
        spent."""
        world, config, engine, client = env.world, env.config, state.engine, task.client
        start, now, steps = engine["starts"][client], work.start_time, work.local_steps
        stream = seeding.client_stream(config.run.seed, start, client, "duration")
        model = Hooks(config.system.model, version + 1, "system model")
        sampled = model.call("sample", world.server_system.sample, work, stream)
        timing = model.outcomes(sampled, world.num_clients)
        engine["starts"][client] = start + 1
        if not self._charge_start(env, engine, timing, client):
            return False
        if timing.participates[client]:
            env.traffic.sent(task)
        if update is None or not timing.participates[client] or timing.steps_done[client] < steps[client]:
            return True  # absent, or failed before its work was done: idle again, tried at the next start
        flight = {"client": client, "time": now + float(timing.full_time[client]), "version": version}
        if update is PENDING:
            flight.update(update=None, pending=True)  # trained by _settle
        else:
            env.traffic.trained(update, task.batch_size)
            flight["update"] = update
        engine["in_flight"].append(flight)
        if cast("AsyncAlgorithm", world.algorithm).keeps_sent_models:  # one reference per version in flight
            engine.setdefault("sent", {}).setdefault(str(version), (state.params, state.buffers))
        return True

    def _defer(self, env: StepEnvironment, state, tasks: list, version: int) -> dict:
        """Keep ``tasks`` (started on the model of server step ``version``) to train later
        (every one, as at once: a start that is not kept still trains, for its client's
        state); the pending starts train first where a client of ``tasks`` has one, or the
        models kept for them reach :data:`PENDING_MODEL_BYTES`."""
        engine = state.engine
        models = engine.get("models", {})
        kept = sum(int(t.numel() * t.element_size()) for model in models.values() for t in model)
        if kept >= PENDING_MODEL_BYTES or (
            {e["task"].client for e in engine.get("pending", ())} & {task.client for task in tasks}
        ):
            self._settle(env, state)  # the models kept for them are at their cap, or a client starts again
        engine.setdefault("models", {}).setdefault(str(version), (state.params, state.buffers))
        engine.setdefault("pending", []).extend({"task": task, "version": version} for task in tasks)
        return dict.fromkeys((task.client for task in tasks), PENDING)

    def _settle(self, env: StepEnvironment, state) -> None:
        """Train every pending start as one computation, each from the model sent to it; the
        in-flight updates get their updates (and their clients their training FLOPs)."""
        engine = state.engine
        pending, models = engine.pop("pending", []), engine.pop("models", {})
        if not pending:
            return
        versions = sorted({e["version"] for e in pending})
        batches = [([e["task"] for e in pending if e["version"] == v], *models[str(v)]) for v in versions]
        trained = {}
        train_from_models = cast("Any", env.pool).run_from_models  # declared: see defers()
        for (tasks, _, _), updates in zip(batches, train_from_models(batches), strict=True):
            trained.update({task.client: (task, update) for task, update in zip(tasks, updates, strict=True)})
        for flight in engine["in_flight"]:
            if flight.pop("pending", False):
                task, update = trained[flight["client"]]
                if update is None:  # only with on_client_error = "skip", which trains at once
                    raise FedhetError(f"client {task.client}'s deferred task failed")
                env.traffic.trained(update, task.batch_size)
                flight["update"] = update

    def finish(self, env: StepEnvironment, state) -> None:
        """The run ends: the starts still pending train (as they would have at once)."""
        if state.engine:
            self._settle(env, state)

    @staticmethod
    def _charge_start(env: StepEnvironment, engine: dict, timing, client: int) -> bool:
        """Charge a start's energy (its training and communication, no waiting) to the
        account and to the next row; False, charging nothing, when it would pass
        ``run.energy_budget``."""
        one = np.zeros(env.world.num_clients, dtype=bool)
        one[client] = True
        spent = spent_in_round(env.world.server_power, timing, involved(timing, one), 0.0, waits=False)
        if not env.energy.fits(spent.total):
            engine["energy_out"] = True
            return False
        env.energy.add(spent)
        engine["joules"] = engine.get("joules", 0.0) + spent.total
        return True

    def _arrivals(self, env: StepEnvironment, state, t: int) -> list | None:
        """The arrivals the rule applies in the next server step, (update, staleness) each,
        in simulated-time order: each arrival joins the buffer and the rule says whether its
        client starts again at once and whether a step is taken (also at the times it names
        as due); idle clients start as arrivals free them. None when the next event falls
        beyond the time budget."""
        engine, algorithm = state.engine, cast("AsyncAlgorithm", env.world.algorithm)
        hooks = Hooks(env.config.algorithm_name, t + 1)
        hooks.call("buffer_size", algorithm.scheduler.buffer_size)  # read by take; a broken one is named here
        engine.setdefault("now", state.sim_time)
        if entries := self._take(engine, hooks, algorithm, state, t):
            return entries  # a second step due at the same instant
        self._start_clients(env, state, engine["now"], t)
        while True:
            if engine.get("energy_out"):
                self._settle(env, state)  # the run ends: what started trains, as it would at once
                return None
            due = hooks.call("due", algorithm.scheduler.due, state.algorithm)
            arrival = min(engine["in_flight"], key=lambda e: (e["time"], e["client"]), default=None)
            if arrival is None and due is None:
                raise FedhetError(f"{algorithm.name}: no client could be started (all absent or failed)")
            if due is not None and (arrival is None or due < arrival["time"]):
                arrival = None  # the rule's timer comes first
            at = float(cast(float, due)) if arrival is None else arrival["time"]
            if not env.clock.fits(at - state.sim_time):
                self._settle(env, state)
                return None
            engine["now"] = at
            if arrival is not None:
                if arrival.get("pending"):
                    self._settle(env, state)
                engine["in_flight"].remove(arrival)
                env.traffic.uploaded(arrival["update"])
                engine["buffer"].append({"update": arrival["update"], "version": arrival["version"]})
                if not hooks.call(
                    "arrive", algorithm.scheduler.arrive, state.algorithm, arrival["client"], at
                ):
                    engine["held"].append(arrival["client"])
            if entries := self._take(engine, hooks, algorithm, state, t):
                return entries
            if not any(e["time"] == engine["now"] for e in engine["in_flight"]):
                # idle clients start once every arrival of this instant is in
                self._start_clients(env, state, engine["now"], t)

    @staticmethod
    def _take(engine: dict, hooks: Hooks, algorithm, state, t: int) -> list:
        """The buffered arrivals the rule applies now, (update, staleness) each, removed from
        the buffer; their held clients are free again."""
        buffer = engine["buffer"]
        buffered = [(e["update"].client, t - e["version"]) for e in buffer]
        chosen = hooks.call("take", algorithm.scheduler.take, state.algorithm, buffered, engine["now"])
        positions = sorted({int(i) for i in chosen})
        if any(not 0 <= i < len(buffer) for i in positions):
            raise FedhetError(f"{algorithm.name}: take named positions outside the buffer of {len(buffer)}")
        taken = [buffer[i] for i in positions]
        engine["buffer"] = [e for i, e in enumerate(buffer) if i not in positions]
        applied = {e["update"].client for e in taken}
        engine["held"] = [c for c in engine["held"] if c not in applied]
        return [(e["update"], t - e["version"]) for e in taken]

    def step(self, env: StepEnvironment, state, t: int):
        """One server step: the arrivals up to the buffer's size in simulated-time order,
        applied by the rule, then the server step; its metrics row (None: the next arrival
        falls beyond the time budget; a :class:`NonFinite` fault)."""
        world, clock = env.world, env.clock
        engine = self._engine_state(state, world.num_clients)
        algorithm = cast("AsyncAlgorithm", world.algorithm)
        entries = self._arrivals(env, state, t)
        if entries is None:
            return None
        for update, _ in entries:
            if what := update_fault(update):
                return NonFinite(t + 1, update.client, what)
        hooks = Hooks(env.config.algorithm_name, t + 1)
        if env.privacy is not None:
            env.privacy.record([update.client for update, _ in entries])
        if algorithm.keeps_sent_models:
            sent = engine.get("sent", {})
            arrivals = [(update, staleness, *sent[str(t - staleness)]) for update, staleness in entries]
            rule = "apply_models"
            applied = hooks.call(rule, algorithm.aggregation.apply_models, state.params, state.buffers,
                                 arrivals, state.algorithm, t)  # fmt: skip
            waiting = {str(e["version"]) for e in engine["in_flight"] + engine["buffer"]}
            engine["sent"] = {v: model for v, model in sent.items() if v in waiting}
        else:
            rule = "apply_buffer"
            applied = hooks.call(rule, algorithm.aggregation.apply_buffer, state.params, state.buffers,
                                 entries, state.algorithm, t)  # fmt: skip
        params, buffers = hooks.model(rule, applied, state.params, state.buffers)
        params = server_step(world, state, params)
        if what := params_fault(params, buffers):
            return NonFinite(t + 1, None, what)
        state.params, state.buffers = params, buffers
        model = Hooks(env.config.system.model, t + 1, "system model")  # as the round driver does
        model.call("observe", world.server_system.observe, [u.summary() for u, _ in entries])
        state.system = world.server_system.state_dict()
        duration = engine["now"] - state.sim_time
        state.sim_time = clock.advance(duration)
        updates = [u for u, _ in entries]
        faults = len(take_faults(env.pool))
        lr = hooks.call("lr_at", algorithm.scheduler.lr_at, t)
        names = world.dataset.task.metric_names()
        row = metrics_row(t + 1, state.sim_time, duration, None, lr, updates, np.array([]), 0, faults, names)
        row.update(energy=engine.pop("joules", 0.0), energy_total=env.energy.total, **privacy_column(env))
        return {
            **row,
            **hooks.metrics(hooks.call("round_metrics", algorithm.reporting.round_metrics, state.algorithm)),
        }


DRIVERS: dict[str, type[RoundDriver] | type[EventDriver]] = {"round": RoundDriver, "event": EventDriver}
