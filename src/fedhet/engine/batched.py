"""The batched pool (``run.pool = "batched"``): a round's clients trained in groups, each
group one computation of the one local trainer
(:meth:`~fedhet.client.LocalTrainer.train_group`), in this process and on the run's device.
On a GPU a small model leaves the device idle one client at a time; in a group, one kernel
serves every client.

Tasks are grouped by shape (:meth:`~fedhet.client.LocalTrainer.group_key`: batch size,
width, depth, learning rate), at most ``run.clients_per_batch`` to a group (0: a whole
round's); a group computed row by row (convolutions on the CPU, a rule's per-client loss)
holds at most 4 MiB of stacked rows, past which its clients train one by one in the working
model (:meth:`~fedhet.client.LocalTrainer.row_group_limit`). Probes, wall-clock tasks
(timed one by one) and tasks with no local work run as groups of one, as in the in-process
pool. Updates come out in task order and equal the
in-process pool's within float tolerance (tests/test_batched_pool.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

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
    client_side: str | None = None  # Request.client_side, computed once

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
        return dict(self.alone_reasons + self.side.world.worker.gradients.row_by_row)

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        if self.side is None:
            raise RuntimeError("the batched pool runs tasks once attached to its world")
        for update in self.train(Request(self, list(tasks), params, buffers)):
            if update is not None:
                yield update

    def train(self, request: Request) -> list[ClientUpdate | None]:
        """The request's updates in task order (None: the client failed): one run's round
        as groups of its own (:func:`train_requests`); runs in lockstep train theirs together
        (:class:`fedhet.engine.cohort.CohortPool`)."""
        return self.train_many([request])[0]

    def train_many(self, requests: list[Request]) -> list[list[ClientUpdate | None]]:
        """Several requests of this run (tasks from different models) as one computation;
        each request's updates in its task order, its clients' errors handled here."""
        updates = train_requests(requests)
        for request in requests:
            for task, exc in request.errors:  # recorded where the requests shared a group
                client_failed(self, exc, task.client, task.round)
        return updates

    def run_from_models(
        self, batches: list[tuple[list[ClientTask], torch.Tensor, torch.Tensor]]
    ) -> list[list[ClientUpdate | None]]:
        """Tasks that start from different models as one grouped computation: ``batches``
        are (tasks, params, buffers), e.g. an event-driven run's clients, each on the model
        sent at its start; each batch's updates in its task order (None: the client failed).
        A pool that declares this lets the event driver train its starts together."""
        if self.side is None:
            raise RuntimeError("the batched pool runs tasks once attached to its world")
        requests = [Request(self, list(tasks), params, buffers) for tasks, params, buffers in batches]
        return self.train_many(requests)

    def alone(self, task: ClientTask, params, buffers) -> ClientUpdate | None:
        """A task that trains by itself (a probe, a wall-clock task, no local work), counted."""
        assert self.side is not None
        self.tasks_alone += 1
        self.alone_reasons[
            self.side.world.worker.alone_reason(task, self.side.world.client_data(task.client)) or ""
        ] += 1
        return self._execute(task, params, buffers)

    def count(self, tasks: int, grouped: bool, reason: str = GROUP_OF_ONE) -> None:
        """``tasks`` of this run trained in a group of two or more, or a group of one
        (``reason``: why)."""
        if grouped:
            self.tasks_batched += tasks
        else:
            self.tasks_alone += tasks
            self.alone_reasons[reason] += tasks


@dataclass
class Request:
    """One run's round of tasks for the grouped computation: its pool (world, client states,
    seed, counters), its tasks and global model. ``errors`` collects its clients' failures
    when the computation spans several runs: each run then handles its own."""

    pool: BatchedPool
    tasks: list[ClientTask]
    params: torch.Tensor
    buffers: torch.Tensor
    errors: list[tuple[ClientTask, BaseException]] = field(default_factory=list)

    @property
    def world(self):
        assert self.pool.side is not None
        return self.pool.side.world

    @property
    def client_side(self) -> str:
        """What decides how its clients compute besides a task's shape: the run's model,
        ``[train]`` (optimizer, postprocessors) and ``[algorithm]`` sections. Runs group
        their clients together only where these are the same (one trainer and rule serve
        a group)."""
        if self.pool.client_side is None:
            import json

            document = self.world.config.to_dict()
            sections = {key: document.get(key) for key in ("model", "train", "algorithm")}
            self.pool.client_side = json.dumps(sections, sort_keys=True, default=str)
        return self.pool.client_side


def train_requests(requests: list[Request]) -> list[list[ClientUpdate | None]]:
    """Every request's updates in its task order: the tasks of all requests grouped by
    shape (:meth:`~fedhet.client.LocalTrainer.group_key`), at most ``clients_per_batch`` to a
    group (a group computed row by row: at most what the row budget holds,
    :meth:`~fedhet.client.LocalTrainer.row_group_limit`), each group one computation of one
    trainer, each client from its own run's model;
    probes, wall-clock tasks and tasks with no local work alone, in their own run. One run's
    round is the case of one request."""
    done: list[list[ClientUpdate | None]] = [[None] * len(r.tasks) for r in requests]
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for k, request in enumerate(requests):
        world = request.world
        for i, task in enumerate(request.tasks):
            key = world.worker.group_key(task, world.client_data(task.client))
            groups.setdefault(("alone", k, i) if key is None else (request.client_side, *key), []).append(
                (k, i)
            )
    limit = requests[0].pool.clients_per_batch or sum(len(r.tasks) for r in requests)
    for key, positions in groups.items():
        k, i = positions[0]
        if key[0] == "alone":
            request = requests[k]
            done[k][i] = request.pool.alone(request.tasks[i], request.params, request.buffers)
            continue
        world = requests[k].world
        row_limit, reason = world.worker.row_group_limit(
            world.algorithm.client, world.client_data(requests[k].tasks[i].client).x
        )
        size = min(limit, row_limit or limit)
        capped = reason if size < limit and len(positions) > 1 else GROUP_OF_ONE  # why a group is one
        for first in range(0, len(positions), size):
            chunk = positions[first : first + size]
            updates = _train_group(requests, chunk, capped)
            for (k, i), update in zip(chunk, updates, strict=True):
                done[k][i] = update
    return done


def _train_group(
    requests: list[Request], chunk: list[tuple[int, int]], alone: str = GROUP_OF_ONE
) -> list[ClientUpdate | None]:
    """One group (positions (request, task)) as one computation of the first request's
    trainer and rule; a client of another run than the first starts from its run's model.
    A client's failure: its run's (at once for one run; recorded when runs share the group).
    ``alone``: why a group of one is one."""
    lead = requests[chunk[0][0]]
    runs = Counter(k for k, _ in chunk)
    mixed = len(runs) > 1
    owners: dict[int, Request] = {}
    members = []
    for k, i in chunk:
        request, task = requests[k], requests[k].tasks[i]
        side = request.pool.side
        assert side is not None
        member = Member(task, side.world.client_data(task.client), request.pool.states.of(task.client),
                        seeding.client_stream(side.seed, task.round, task.client, "training"))  # fmt: skip
        if request is not lead:
            member.start, member.start_buffers = request.params, request.buffers
        owners[id(task)] = request
        members.append(member)
    for k, count in runs.items():
        requests[k].pool.count(count, grouped=len(chunk) > 1, reason=alone)

    def failed(task: ClientTask, exc: BaseException) -> None:
        owner = owners[id(task)]
        if mixed:
            owner.errors.append((task, exc))
        else:
            client_failed(owner.pool, exc, task.client, task.round)

    snapshot = mixed or any(requests[k].pool.on_client_error == "skip" for k in runs)
    world = lead.world
    updates = world.worker.train_group(members, lead.params, lead.buffers, world.algorithm.client, failed,
                                       snapshot=snapshot)  # fmt: skip
    for k, i in chunk:
        requests[k].pool.states.park(requests[k].tasks[i].client)  # on the host until their next task
    return updates


register("pool")(BatchedPool)
