"""What each device sent, received and computed: bytes up and down and training FLOPs,
per client and summed over the run, beside the seconds and joules of
:mod:`fedhet.system.energy` (the same per-client account, kept in the run state, so a
resumed run goes on counting).

- **Bytes down** (server to client): what a task sends, the global model's float32
  parameters and buffers; a width sub-model's task (HeteroFL, FedRolex, FIARSE) sends only
  the sub-model's elements.
- **Bytes up** (client to server): what a delivered update carries, as it travels: the
  parameters of the layers it reached (``depth..L``; a sub-model's elements only), the
  payload vectors its rule sends with it, each after the postprocessors (a compressor's
  bits, :func:`fedhet.client.postprocess.payload_bytes`), and its float buffers but those
  local training never changes (a LoRA base held in the global model: the server sends it,
  the client has nothing of it to return).
- **Training FLOPs**: of the local steps a delivered update reports, each
  :func:`fedhet.models.cost.training_step_flops` on the task's batch at the depth it
  reached (a sub-model's steps scaled by :func:`fedhet.models.cost.sub_model_step_share`).
  Work that was never delivered (a straggler dropped at the deadline) is in the energy
  account's seconds and joules, not here: the simulator times it but computes nothing.
"""

from __future__ import annotations

import numpy as np

from fedhet.messages import ClientTask, ClientUpdate

TRAFFIC = ("bytes_up", "bytes_down", "train_flops")  # per client, summed over the run


class TrafficAccount:
    """The run's bytes and FLOPs per client (:data:`TRAFFIC`), in ``state`` (the run
    state's per-client account: a resumed run goes on counting)."""

    def __init__(self, state: dict, world) -> None:
        for name in TRAFFIC:
            state.setdefault(name, [0.0] * world.num_clients)
        self.state, self.world = state, world
        self.shares: dict[tuple, float] = {}

    def sent(self, task: ClientTask) -> None:
        """A task's download: the client's model (or sub-model) bytes."""
        self._add("bytes_down", task.client, download(self.world, task))

    def sent_round(self, tasks: list[ClientTask], charged) -> None:
        """A round's downloads: each task's, and the whole model for every other client the
        round puts to work (``charged``, a mask over clients: a straggler whose work the rule
        will discard still received the model, though the simulator computes nothing for it)."""
        tasked = set()
        for task in tasks:
            self.sent(task)
            tasked.add(task.client)
        whole = 4.0 * (int(self.world.initial_params.numel()) + int(self.world.initial_buffers.numel()))
        for client in np.flatnonzero(charged):
            if int(client) not in tasked:
                self._add("bytes_down", int(client), whole)

    def trained(self, update: ClientUpdate, batch_size: int) -> None:
        """The FLOPs of the local steps an update reports, on batches of ``batch_size``."""
        share = self._share(update.coverage)
        self._add("train_flops", update.client, flops(self.world, update, batch_size, share))

    def uploaded(self, update: ClientUpdate) -> None:
        """An update's upload bytes, as it travels."""
        self._add("bytes_up", update.client, upload(self.world, update))

    def _share(self, coverage) -> float | None:
        """A sub-model's step as a share of the full model's (computed once per shape);
        None at full width."""
        from fedhet.models.cost import sub_model_step_share

        if not coverage.masked:
            return None
        key = (float(coverage.width), int(coverage.full_layers), int(coverage.depth), int(coverage.layers))
        if key not in self.shares:
            self.shares[key] = sub_model_step_share(
                self.world.flat.layout, self.world.layer_multiply_adds, *key
            )
        return self.shares[key]

    def _add(self, name: str, client: int, amount: float) -> None:
        self.state[name][client] = float(self.state[name][client]) + float(amount)


def traffic_totals(account: dict) -> dict[str, float]:
    """Each quantity of :data:`TRAFFIC` summed over the clients (summary.json's), 0 where
    the run state has none."""
    return {name: float(np.sum(account.get(name, ()))) for name in TRAFFIC}


def traffic_columns(account: dict, client: int) -> dict[str, float]:
    """One client's :data:`TRAFFIC` (clients.csv's columns)."""
    return {name: float(account[name][client]) if name in account else 0.0 for name in TRAFFIC}


def _kept(world, coverage, region: slice) -> int:
    """The elements of ``region`` the coverage's sub-model keeps (all at full width)."""
    if not coverage.masked:
        return region.stop - region.start
    mask = world.worker.masks(*coverage.width_key())
    return int(mask[region].sum())


def download(world, task: ClientTask) -> float:
    """Bytes the task sends the client: float32 parameters (a sub-model's only) and buffers."""
    everything = slice(0, int(world.initial_params.numel()))
    params = _kept(world, task.coverage, everything)
    return 4.0 * (params + int(world.initial_buffers.numel()))


def upload(world, update: ClientUpdate) -> float:
    """Bytes of a delivered update on the wire (see the module's docstring)."""
    from fedhet.client.postprocess import payload_bytes

    if update.delta.numel() == 0:
        return 0.0
    region = update.coverage.region(world.flat.layout)
    elements = _kept(world, update.coverage, region)
    payload = [int(update.payload[key].numel()) for key in update.wire if key in update.payload]
    buffers = update.delta_buffers.numel() - untrained_buffers(
        world.flat.layout, update.coverage.buffer_region(world.flat.layout)
    )
    return float(payload_bytes(world.worker.postprocessors, elements, payload) + 4 * buffers)


def untrained_buffers(layout, region: slice) -> int:
    """The float buffer elements in ``region`` that local training never changes: the base
    weights of LoRA projections held in the global model (``model.lora_base = "global"``)."""
    return sum(
        adapter.b_shape[0] * adapter.a_shape[1]
        for adapter in layout.adapters
        if adapter.weight >= 0 and region.start <= adapter.weight < region.stop
    )


def flops(world, update: ClientUpdate, batch_size: int, share: float | None = None) -> float:
    """FLOPs of the update's local steps on batches of ``batch_size`` (see the module's
    docstring); ``share``: a sub-model's step as a share of the full model's (None: the
    full width, back-propagated to the update's depth)."""
    from fedhet.models.cost import training_step_flops

    depth = update.coverage.depth
    if update.steps <= 0 or depth > world.flat.num_layers:
        return 0.0
    if share is not None:
        return float(update.steps * training_step_flops(world.layer_multiply_adds, batch_size) * share)
    return float(update.steps * training_step_flops(world.layer_multiply_adds, batch_size, depth))
