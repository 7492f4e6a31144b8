"""The batched pool (``run.pool = "batched"``): a round's clients trained in groups, each
group one computation of the one local trainer
(:meth:`~fedhet.client.LocalTrainer.train_group`), in this process and on the run's device.
On a GPU a small model leaves the device idle one client at a time; in a group, one kernel
serves every client.

Tasks are grouped by shape (:meth:`~fedhet.client.LocalTrainer.group_key`: batch size,
width, depth, learning rate), at most ``run.clients_per_batch`` to a group (0: a whole
round's). Probes, wall-clock tasks (timed one by one) and tasks with no local work run as
groups of one, as in the in-process pool. Updates come out in task order and equal the
in-process pool's within float tolerance (tests/test_batched_pool.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from fedhet import seeding
from fedhet.checks import at_least, one_of, resumable
from fedhet.client.group import Member
from fedhet.engine.client_errors import client_failed
from fedhet.engine.pool import InProcessPool, PoolContext
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.registry import register


@dataclass
class BatchedOptions:
    """``clients_per_batch``: the most clients trained together (0: all of a round's tasks
    that share a batch size and width); lower it when their stacked models and batches do
    not fit the device's memory. ``stacked``: a group's gradients in one computation over
    its clients, batched kernels where they know the layers and the rule keeps the task's
    loss (:mod:`fedhet.client.grouped`), else one ``vmap`` ("auto": where it pays, so not
    for convolutions on the CPU; "always": wherever it can; "never": one client after
    another, the group sharing the optimizer's and the postprocessors' steps)."""

    clients_per_batch: int = resumable(0)
    stacked: str = resumable("auto")

    def validate(self) -> None:
        at_least("run.clients_per_batch", self.clients_per_batch, 0)
        one_of("run.stacked", self.stacked, ("auto", "always", "never"))


# why a task the batched pool grouped trained alone all the same
GROUP_OF_ONE = "groups of one (no other task of the round shared its shape)"


class BatchedPool(InProcessPool):
    """The in-process pool, training each group of batchable tasks at once."""

    name = "batched"
    Options = BatchedOptions  # type: ignore[assignment]

    @classmethod
    def build(cls, options: BatchedOptions, ctx: PoolContext) -> BatchedPool:
        pool = cls(None, ctx.client_order, ctx.config.run.on_client_error)
        pool.seed = ctx.config.run.seed
        pool.clients_per_batch = options.clients_per_batch
        pool.stacked = options.stacked
        return pool

    clients_per_batch = 0
    stacked = "auto"

    def attach(self, world) -> None:
        super().attach(world)
        world.worker.gradients.policy = self.stacked
        self.tasks_batched = 0  # tasks trained in groups of two or more, and alone, so far
        self.tasks_alone = 0
        self.alone_reasons: Counter[str] = Counter()  # tasks alone, by why

    def one_at_a_time(self) -> dict[str, int]:
        """Tasks that trained one client at a time so far, by reason: alone (a probe, a
        wall-clock task, no local work) or in a group computed row by row (a rule's per-client
        loss, a model ``vmap`` cannot batch, convolutions on the CPU, ``run.stacked``)."""
        assert self.side is not None
        return {**self.alone_reasons, **self.side.world.worker.gradients.row_by_row}

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        if self.side is None:
            raise RuntimeError("the batched pool runs tasks once attached to its world")
        tasks, trainer = list(tasks), self.side.world.worker
        done: dict[int, ClientUpdate | None] = {}
        groups: dict[tuple, list[int]] = {}
        for i, task in enumerate(tasks):
            key = trainer.group_key(task, self.side.world.client_data(task.client))
            groups.setdefault(("alone", i) if key is None else key, []).append(i)
        limit = self.clients_per_batch or len(tasks)
        for key, members in groups.items():
            if key[0] == "alone":  # a probe, a wall-clock task, no local work
                task = tasks[members[0]]
                done[members[0]] = self._execute(task, params, buffers)
                self.tasks_alone += 1
                self.alone_reasons[
                    trainer.alone_reason(task, self.side.world.client_data(task.client)) or ""
                ] += 1
                continue
            for first in range(0, len(members), limit):
                chunk = members[first : first + limit]
                if len(chunk) == 1:  # a group of one trains as a task alone does
                    self.tasks_alone += 1
                    self.alone_reasons[GROUP_OF_ONE] += 1
                else:
                    self.tasks_batched += len(chunk)
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
        assert side is not None
        world = side.world

        def failed(task: ClientTask, exc: BaseException) -> None:
            client_failed(self, exc, task.client, task.round)

        members = [
            Member(t, world.client_data(t.client), self.states.of(t.client),
                   seeding.client_stream(side.seed, t.round, t.client, "training"))
            for t in tasks
        ]  # fmt: skip
        updates = world.worker.train_group(
            members, params, buffers, world.algorithm.client, failed, snapshot=self.on_client_error == "skip"
        )
        for task in tasks:
            self.states.park(task.client)  # on the host until their next task (a GPU run)
        return updates


register("pool")(BatchedPool)
