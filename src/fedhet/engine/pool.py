"""Client pools: where client tasks run.

A :class:`ClientPool` takes a round's tasks and the global model and yields the clients'
updates one at a time, in the order of the tasks (client order), whatever order they ran
or arrived in, so that a streaming aggregation (:mod:`fedhet.algorithms.streaming`) adds
them in an order that does not depend on the pool. A pool owns the client-state store
(:class:`~fedhet.client.ClientStates`: momentum, Adam's moments, SCAFFOLD's c_i, ...), which
the run checkpoints through :meth:`ClientPool.state_dict`.

Every pool's workers answer tasks with :class:`WorkerSide` over a world built once per
process: Flower's nodes by :func:`bootstrap_worker` from the configuration, the process
pool's workers from the configuration and the run's shared dataset
(:mod:`fedhet.engine.processes`).

Pools are plug-ins (kind ``pool``, ``[run] pool = "..."``): ``build(options, ctx)`` (a
:class:`PoolContext`; it may start its workers now) before the run builds its world,
:meth:`attach` once the world is built, then the :class:`ClientPool` protocol. Built-ins:
``auto`` (the default: batched on a GPU and, for dense models whose rule trains the task's
own loss, on the CPU; else in-process; the engine's own pool on another engine),
``in-process`` (:class:`InProcessPool`, the embedded engine's), ``batched``
(:mod:`fedhet.engine.batched`), ``processes`` (:class:`~fedhet.engine.processes.ProcessPool`,
its option ``run.workers``: processes on this machine) and ``flower``
(:class:`~fedhet.engine.flower.FlowerPool`, one Flower message per task; the Flower
engine's own).

Every pool follows one contract (tests/test_pools.py): updates in task order; a client's
state merged back after its task (and left as it was when the task is not delivered);
``submit_evaluation`` returns None or a handle shaped like a ``concurrent.futures.Future``
(``done()``, ``result()`` giving the metrics); failure semantics of
:mod:`fedhet.engine.client_errors` (a dead worker, a lost node, a timeout: a fault, the run
goes on; a client's exception: one line naming the hook, or a fault with
``run.on_client_error = "skip"``). A pool's :attr:`faults` log is what the driver counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from fedhet import seeding
from fedhet.client import ClientStates
from fedhet.client.state import ClientState
from fedhet.engine.client_errors import FaultLog, client_failed
from fedhet.errors import ConfigError, FedhetError
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.registry import NoOptions, register

if TYPE_CHECKING:
    from fedhet.config import Config
    from fedhet.world import World

TaskOrder = Callable[[list[ClientTask]], Sequence[ClientTask]]


class WorkerDied(FedhetError):
    """A process running client tasks ended while the run needed it (killed, out of memory):
    the run stops with one line naming it and the round."""


@dataclass
class PoolContext:
    """What a pool is built with: the run's configuration, for tests a task order, the
    engine running the loop and what that engine hands its pool (``link``: the Flower
    engine's :class:`~fedhet.engine.flower.FlowerLink`; None for the embedded engine)."""

    config: Config
    client_order: TaskOrder | None = None
    engine: str = "embedded"
    link: Any = None


class EvaluationHandle(Protocol):
    """An evaluation under way elsewhere (``concurrent.futures.Future``-like)."""

    def done(self) -> bool:
        """Whether the result is ready."""
        ...

    def result(self) -> dict:
        """The evaluation's numbers (``test_loss``, ``test_accuracy``, ...); waits for them."""
        ...


class ClientPool(Protocol):
    """Runs client tasks; owns the client-state store."""

    states: ClientStates
    faults: FaultLog

    def attach(self, world: World) -> None:
        """The run's world is built: get ready to run its clients."""
        ...

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        """The updates of ``tasks``, in task order (a client that failed yields nothing)."""
        ...

    def submit_evaluation(self, params: torch.Tensor, buffers: torch.Tensor) -> EvaluationHandle | None:
        """Start evaluating the global model ``(params, buffers)`` on the test set elsewhere
        and return a handle whose ``result()`` gives the evaluation's numbers; or None: the
        run evaluates it itself, now."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, saved: dict) -> None: ...

    def close(self) -> None:
        """Release what the pool holds (worker processes, shared memory)."""
        ...


@dataclass
class WorkerSide:
    """What a worker needs to answer tasks: the run's world (data, model, algorithm, local
    trainer) and its seed. Each task runs with the client's own stream (seed, round,
    client) and its own state."""

    world: World
    seed: int

    def execute(
        self, task: ClientTask, params: torch.Tensor, buffers: torch.Tensor, state: ClientState
    ) -> ClientUpdate:
        stream = "probe" if task.kind == "probe" else "training"
        rng = seeding.client_stream(self.seed, task.round, task.client, stream)
        world = self.world
        if params.device != world.device:  # sent from elsewhere (a Flower message): onto this side's
            params, buffers = params.to(world.device), buffers.to(world.device)
        return world.worker.execute(
            task.to(world.device),
            params,
            buffers,
            world.client_data(task.client),
            state,
            rng,
            world.algorithm.client,
        )


_WORKERS: dict[str, WorkerSide] = {}
_WORKERS_LOCK = threading.Lock()


def bootstrap_worker(config_toml: str, cores: int | None = None) -> WorkerSide:
    """The worker side of the run configured by ``config_toml`` (a resolved configuration),
    built once per process and configuration; ``cores``: the CPUs this worker may use
    (``run.threads``, "auto" or 0, chooses within them)."""
    with _WORKERS_LOCK:
        if config_toml not in _WORKERS:
            import tomllib

            from fedhet.config import from_dict
            from fedhet.threads import set_core_budget
            from fedhet.world import build_world

            config = from_dict(tomllib.loads(config_toml))
            if cores is not None:
                set_core_budget(max(1, int(cores)))
            _WORKERS[config_toml] = WorkerSide(build_world(config), config.run.seed)
        return _WORKERS[config_toml]


class InProcessPool:
    """The embedded engine's pool: tasks run here, one after another, on the world's one
    working model. ``order`` changes the order they run in (as a parallel engine would);
    updates still come out in task order."""

    name = "in-process"
    Options = NoOptions
    engine: str | None = "embedded"  # the engine that drives this pool (None: any engine's)
    side: WorkerSide | None  # set by attach() when built from a configuration
    seed: int

    @classmethod
    def build(cls, options, ctx: PoolContext) -> InProcessPool:
        pool = cls(None, ctx.client_order, ctx.config.run.on_client_error)
        pool.seed = ctx.config.run.seed
        return pool

    def attach(self, world: World) -> None:
        self.side = WorkerSide(world, self.seed)

    def __init__(
        self, side: WorkerSide | None, order: TaskOrder | None = None, on_client_error: str = "stop"
    ):
        self.side = side
        self.seed = 0
        self.order = order
        self.states = ClientStates()
        self.on_client_error = on_client_error
        self.faults = FaultLog()

    def _execute(self, task: ClientTask, params, buffers) -> ClientUpdate | None:
        """One task; a client error stops the run in one line, or (skip) is a fault."""
        state = self.states.of(task.client)
        kept = None
        if self.on_client_error == "skip":  # a skipped client keeps the state it had
            kept = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        try:
            if self.side is None:
                raise RuntimeError("the in-process pool runs tasks once attached to its world")
            update = self.side.execute(task, params, buffers, state)
            self.states.park(task.client)  # on the host until its next task (a GPU run)
            return update
        except FedhetError:
            raise
        except Exception as exc:  # noqa: BLE001  (client code: a rule's or plug-in's bug)
            client_failed(self, exc, task.client, task.round)
            state.clear()
            state.update(kept or {})
            return None

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        tasks = list(tasks)
        order = self.order(list(tasks)) if self.order is not None else tasks
        position = {id(task): i for i, task in enumerate(tasks)}
        done: dict[int, ClientUpdate | None] = {}
        following = 0
        for task in order:
            done[position[id(task)]] = self._execute(task, params, buffers)
            while following in done:  # hand out in task order as soon as possible
                update = done.pop(following)
                following += 1
                if update is not None:
                    yield update

    def submit_evaluation(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        return None  # evaluated by the run, in this process

    def state_dict(self) -> dict:
        return self.states.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.states.load_state_dict(saved)

    def close(self) -> None:
        pass


class AutoPool:
    """The default pool: the pool of the engine running the loop where that engine hands
    its pool a link (Flower's, over its grid); else in this process, as groups of clients
    (the batched pool) on a GPU, where one client at a time leaves the device idle, and on
    the CPU where the groups pay (:func:`groups_pay_on_cpu`); one client at a time
    otherwise. Worker processes are the ``processes`` pool's (its ``run.workers``;
    ``run.workers`` > 1 without ``run.pool`` is read as it)."""

    name = "auto"
    Options = NoOptions
    engine: str | None = None  # whichever engine runs: each places its clients itself
    delegates_to = ("batched",)  # the pools whose [run] keys it reads where it picks them

    @classmethod
    def build(cls, options, ctx: PoolContext):
        from fedhet.registry import builtins

        run = ctx.config.run
        if ctx.link is not None:  # the engine handed its pool a link: the pool that declares it
            return engine_pool(ctx.engine).build(NoOptions(), ctx)
        if run.torch_device.type == "cuda" or groups_pay_on_cpu(ctx.config):
            batched = builtins("pool")["batched"].cls  # with its keys the run gives (clients_per_batch)
            return batched.build(run.given_options(batched.Options) or batched.Options(), ctx)
        return builtins("pool")["in-process"].cls.build(NoOptions(), ctx)


def groups_pay_on_cpu(config) -> bool:
    """Whether a run's clients train faster in groups on the CPU: its model declares only
    layers the grouped kernels batch there (``batches_on_cpu``) and its rule's client part
    trains the task's own loss on its data as drawn, so that a group is one kernel per layer
    (benchmarks/overhead.py: the batched pool in 0.63x the in-process pool's loop time on
    the leaderboard's shape)."""
    from fedhet.registry import resolve

    model = config.model.entry("name").cls
    client = resolve("algorithm", config.algorithm_name, "algorithm.name").cls.Client
    plain = not (client.customises_loss or client.selects_samples or client.local_loss_per_client)
    return bool(getattr(model, "batches_on_cpu", False)) and plain


def engine_pool(engine: str):
    """The built-in pool that declares ``engine`` (its ``engine`` attribute)."""
    from fedhet.registry import builtins

    found = [e.cls for e in builtins("pool").values() if getattr(e.cls, "engine", "embedded") == engine]
    if len(found) != 1:
        raise ConfigError(f"run.engine = {engine!r}: {len(found)} built-in pools declare it, not one")
    return found[0]


register("pool")(InProcessPool)
register("pool")(AutoPool)
