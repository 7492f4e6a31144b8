"""The batched pool (``run.pool = "batched"``): a round's clients trained together, as one
computation over stacked copies of the model (:class:`~fedhet.client.batched.BatchedTrainer`),
in this process and on the run's device. On a GPU a small model leaves the device idle one
client at a time; batched, one kernel serves every client of the group.

Tasks are grouped by batch size and sub-model width, at most ``run.clients_per_batch`` to a
group (0: a whole round's); tasks that cannot be batched (probes, wall-clock tasks, FjORD's
and AMSFL's per-step hooks, models with BatchNorm or that ``vmap`` cannot batch) run one at a
time, as in the in-process pool, and a run says once why. Updates come out in task order and
equal the in-process pool's within float tolerance (tests/test_batched_pool.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from fedhet import seeding
from fedhet.checks import at_least
from fedhet.client.batched import BatchedTrainer
from fedhet.engine.client_errors import client_failed
from fedhet.engine.pool import InProcessPool, PoolContext
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.registry import register

log = logging.getLogger(__name__)


@dataclass
class BatchedOptions:
    """``clients_per_batch``: the most clients trained together (0: all of a round's tasks
    that share a batch size and width); lower it when their stacked models and batches do
    not fit the device's memory."""

    clients_per_batch: int = 0

    def validate(self) -> None:
        at_least("run.clients_per_batch", self.clients_per_batch, 0)


class BatchedPool(InProcessPool):
    """The in-process pool, training each group of batchable tasks at once."""

    name = "batched"
    Options = BatchedOptions  # type: ignore[assignment]

    @classmethod
    def build(cls, options: BatchedOptions, ctx: PoolContext) -> BatchedPool:
        pool = cls(None, ctx.client_order, ctx.config.run.on_client_error)
        pool.seed = ctx.config.run.seed
        pool.clients_per_batch = options.clients_per_batch
        return pool

    clients_per_batch = 0
    batched: BatchedTrainer | None = None
    _said: set[str]

    def attach(self, world) -> None:
        super().attach(world)
        self.batched = BatchedTrainer(world.worker)
        self._said = set()
        self.tasks_batched = 0  # tasks trained in groups, and one at a time, so far
        self.tasks_alone = 0

    def _why_alone(self, task: ClientTask) -> str | None:
        side = self.side
        assert side is not None and self.batched is not None
        reason = self.batched.batchable(task, side.world.client_data(task.client), side.world.algorithm)
        if reason and reason not in self._said and reason not in ("a probe", "no local work"):
            self._said.add(reason)
            log.info("batched pool: some tasks run one at a time: %s", reason)
        return reason

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        if self.side is None or self.batched is None:
            raise RuntimeError("the batched pool runs tasks once attached to its world")
        tasks = list(tasks)
        done: dict[int, ClientUpdate | None] = {}
        groups: dict[tuple, list[int]] = {}
        for i, task in enumerate(tasks):
            if self._why_alone(task) is None:
                key = self.batched.group_key(task, self.side.world.client_data(task.client))
                groups.setdefault(key, []).append(i)
        grouped = {i for members in groups.values() for i in members}
        alone = [i for i in range(len(tasks)) if i not in grouped]
        for i in alone:
            done[i] = self._execute(tasks[i], params, buffers)
        self.tasks_alone += len(alone)
        self.tasks_batched += len(grouped)
        limit = self.clients_per_batch or len(tasks)
        for members in groups.values():
            for first in range(0, len(members), limit):
                chunk = members[first : first + limit]
                for i, update in zip(
                    chunk, self._group([tasks[i] for i in chunk], params, buffers), strict=True
                ):
                    done[i] = update
        for i in range(len(tasks)):
            update = done.pop(i)
            if update is not None:
                yield update

    def _group(self, tasks: list[ClientTask], params, buffers) -> list[ClientUpdate | None]:
        side = self.side
        assert side is not None and self.batched is not None
        world = side.world
        rngs = [seeding.client_stream(side.seed, t.round, t.client, "training") for t in tasks]

        def failed(task: ClientTask, exc: BaseException) -> None:
            client_failed(self, exc, task.client, task.round)

        updates = self.batched.train(
            tasks,
            params,
            buffers,
            [world.client_data(t.client) for t in tasks],
            [self.states.of(t.client) for t in tasks],
            rngs,
            world.algorithm,
            failed,
            snapshot=self.on_client_error == "skip",
        )
        for task in tasks:
            self.states.park(task.client)  # on the host until their next task (a GPU run)
        return updates


register("pool")(BatchedPool)
