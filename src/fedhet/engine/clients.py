"""Running client tasks in this process: each client's own data, own state and own random
stream (seed, round, client), on one reused working model. Replies come back sorted by
client, whatever order the tasks ran in, so the server's result does not depend on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fedhet import seeding
from fedhet.client import ClientData, ClientRule, ClientStates, LocalWorker
from fedhet.messages import ClientTask, ClientUpdate

TaskOrder = Callable[[list[ClientTask]], Sequence[ClientTask]]


class InProcessClients:
    """The embedded engine's clients."""

    def __init__(
        self,
        worker: LocalWorker,
        data: Callable[[int], ClientData],
        seed: int,
        rule: ClientRule | None = None,
        order: TaskOrder | None = None,
    ):
        self.worker = worker
        self.data = data
        self.seed = seed
        self.rule = rule
        self.order = order

    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor, states: ClientStates
    ) -> list[ClientUpdate]:
        """Execute ``tasks`` against the global ``params``/``buffers``; updates by client."""
        ordered = self.order(list(tasks)) if self.order else tasks
        updates = []
        for task in ordered:
            stream = "probe" if task.kind == "probe" else "training"
            rng = seeding.client_stream(self.seed, task.round, task.client, stream)
            state = states.of(task.client)
            updates.append(
                self.worker.execute(task, params, buffers, self.data(task.client), state, rng, self.rule)
            )
        return sorted(updates, key=lambda u: u.client)
