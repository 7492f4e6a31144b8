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

Implementations: :class:`InProcessPool` (this process, the embedded engine),
:class:`~fedhet.engine.processes.ProcessPool` (worker processes on this machine,
``run.workers``) and :class:`~fedhet.engine.flower.FlowerPool` (one Flower message per task).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from fedhet import seeding
from fedhet.client import ClientStates
from fedhet.client.state import ClientState
from fedhet.errors import FedhetError
from fedhet.messages import ClientTask, ClientUpdate

TaskOrder = Callable[[list[ClientTask]], Sequence[ClientTask]]


class WorkerDied(FedhetError):
    """A process running client tasks ended while the run needed it (killed, out of memory):
    the run stops with one line naming it and the round."""


class ClientPool(Protocol):
    """Runs client tasks; owns the client-state store."""

    states: ClientStates

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        """The updates of ``tasks``, in task order (a client that failed yields nothing)."""
        ...

    def submit_evaluation(self, params: torch.Tensor, buffers: torch.Tensor):
        """Start evaluating the global model ``(params, buffers)`` on the test set elsewhere
        and return a handle whose ``result()`` gives (loss, accuracy); or None: the run
        evaluates it itself, now."""
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

    world: object
    seed: int

    def execute(
        self, task: ClientTask, params: torch.Tensor, buffers: torch.Tensor, state: ClientState
    ) -> ClientUpdate:
        stream = "probe" if task.kind == "probe" else "training"
        rng = seeding.client_stream(self.seed, task.round, task.client, stream)
        world = self.world
        return world.worker.execute(
            task, params, buffers, world.client_data(task.client), state, rng, world.algorithm
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

    def __init__(self, side: WorkerSide, order: TaskOrder | None = None):
        self.side = side
        self.order = order
        self.states = ClientStates()

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        tasks = list(tasks)
        if self.order is None:
            for task in tasks:
                yield self.side.execute(task, params, buffers, self.states.of(task.client))
            return
        position = {id(task): i for i, task in enumerate(tasks)}
        done: dict[int, ClientUpdate] = {}
        following = 0
        for task in self.order(list(tasks)):
            done[position[id(task)]] = self.side.execute(task, params, buffers, self.states.of(task.client))
            while following in done:  # hand out in task order as soon as possible
                yield done.pop(following)
                following += 1

    def submit_evaluation(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        return None  # evaluated by the run, in this process

    def state_dict(self) -> dict:
        return self.states.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.states.load_state_dict(saved)

    def close(self) -> None:
        pass
