"""The local trainer: a :class:`~fedhet.messages.ClientTask` in, a
:class:`~fedhet.messages.ClientUpdate` out, composed of declared pieces:

- a :class:`~fedhet.client.coverage.CoverageView` (the layers and width the task covers);
- a :class:`~fedhet.client.budget.SimulatedBudget` or
  :class:`~fedhet.client.budget.WallClockBudget` (how much work: given by the system side);
- the algorithm's gradient transform (FedProx's proximal term, SCAFFOLD's control variates,
  FedDyn's linear term: :meth:`ClientPart.gradient_correction`), added to each step's gradient;
- a :class:`~fedhet.client.optimizers.LocalOptimizer` (SGD, Adam, ...; its state in the
  client's state);
- a chain of :class:`~fedhet.client.postprocess.Postprocessor` applied to the update.

A client computes from its task, the global parameters it was sent, its own data, its own
state and its own random stream, and nothing else. One working model (a
:class:`~fedhet.models.FlatModel`) serves every client, reloaded in place before each task.
A client covering depth d trains layers d..L only: the forward pass runs the layers below d
without a graph, autograd is asked for the reached parameters only, and the optimizer
touches only their flat region (SALF Sec. III-A).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedhet.client.budget import SimulatedBudget, WallClockBudget, timed_first_step
from fedhet.client.coverage import CoverageView, WidthMasks
from fedhet.client.group import (
    Finished,
    GroupGradients,
    Member,
    PerClient,
    per_client_reason,
    scalar_payload,
)
from fedhet.client.optimizers import SGD, LocalOptimizer
from fedhet.client.postprocess import Postprocessor, generator_for, payload_bytes
from fedhet.client.rule import ClientRule
from fedhet.client.state import (
    ALGORITHM,
    OPTIMIZER,
    ClientData,
    ClientState,
    Namespace,
    check_serialisable,
    component_names,
)
from fedhet.data.task import Task, default_task
from fedhet.errors import FedhetError
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.layers import FlatModel

log = logging.getLogger(__name__)

# the most float elements of stacked rows (4 MiB of float32) a group computed row by row holds
ROW_GROUP_ELEMENTS = 1 << 20


OnError = Callable[[ClientTask, BaseException], None]  # a client's hook raised: stop, or mark it failed


@dataclass
class _Group:
    """A group's local work in progress: its clients' parameter rows (the working model's
    own storage for a group of one), their buffers, and what every step reads."""

    members: list[Member]  # by local steps, most first: at step s the first k_s still work
    params: torch.Tensor  # the global model they start from
    buffers: torch.Tensor
    rows: torch.Tensor
    buffer_rows: torch.Tensor
    view: CoverageView
    rule: ClientRule | None
    stacked: bool
    on_error: OnError | None
    kept: dict
    first: tuple | None = None  # a wall-clock task's timed first step: (loss, grads, x, y)
    shared: bool = False  # a group of one, trained in the working model's own storage
    starts: torch.Tensor | None = (
        None  # each row's own start (k x P): its run's model, the rule's start_point
    )
    buffer_starts: torch.Tensor | None = None  # each row's own received buffers (k x B), likewise

    def __post_init__(self) -> None:
        pslice, bslice = self.view.param_slice, self.view.buffer_slice
        self.regions = self.rows[:, pslice]  # the covered columns of every row, and what was sent
        self.sent_region = self.params[pslice]
        self.buffer_regions, self.sent_buffers = self.buffer_rows[:, bslice], self.buffers[bslice]
        if self.buffer_starts is not None:
            self.sent_buffers = self.buffer_starts[:, bslice]  # one row each

    def start(self, i: int) -> torch.Tensor:
        """The parameters row ``i`` started from: its own start, else the received ones."""
        return self.params if self.starts is None else self.starts[i]

    def fail(self, member: Member, exc: BaseException) -> None:
        """A client's hook raised: stop the run (``on_error`` raises), or leave the client
        out with the state it had."""
        if self.on_error is None or isinstance(exc, FedhetError):  # already one line
            raise exc
        self.on_error(member.task, exc)
        member.failed = True
        if id(member) in self.kept:
            member.state.clear()
            member.state.update(self.kept[id(member)])


class LocalTrainer:
    """Runs client tasks on one reused working model with ``optimizer`` (default plain SGD)
    and the ``postprocessors`` chain."""

    def __init__(
        self,
        flat: FlatModel,
        optimizer: LocalOptimizer | None = None,
        postprocessors: list[Postprocessor] | None = None,
        objective: Task | None = None,
    ):
        self.flat = flat
        self.objective = objective or default_task()  # the dataset's task: its training loss
        self.optimizer = optimizer or SGD()
        self.postprocessors = list(postprocessors or [])
        self.namespaces = component_names([step.name for step in self.postprocessors])
        self.masks = WidthMasks(flat)
        self.gradients = GroupGradients(flat, self.objective)  # the task: its loss, by call
        self.slowdown = 1.0  # wall-clock tasks: this device runs `slowdown` times slower
        self.layer_delay = 0.0  # wall-clock tasks: extra seconds per layer back-propagated
        self._warm = False
        # per client: its index array and its examples in the loss pass's chunks, decoded once
        self._loss_chunks: dict[int, tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    @property
    def num_layers(self) -> int:
        return self.flat.num_layers

    def payload_bytes(self, depth: int = 1, rule: ClientRule | None = None) -> int:
        """Bytes a full-width update covering layers ``depth..L`` has on the wire: its
        float32 parameters, the payload vectors the ``rule`` sends with it
        (:meth:`~fedhet.algorithms.parts.ClientPart.upload_payload`), both after the
        postprocessors, and its float32 buffers."""
        flat = self.flat
        params = flat.param_slices.from_depth(depth)
        buffers = flat.buffer_slices.from_depth(depth)
        elements = (params.stop - params.start) if depth <= flat.num_layers else 0
        extra = (buffers.stop - buffers.start) * 4 if depth <= flat.num_layers else 0
        payload = rule.upload_payload(elements).values() if rule is not None and elements else ()
        return payload_bytes(self.postprocessors, elements, payload) + extra

    def execute(
        self,
        task: ClientTask,
        params: torch.Tensor,
        buffers: torch.Tensor,
        data: ClientData,
        state: ClientState,
        rng: np.random.Generator,
        rule: ClientRule | None = None,
    ) -> ClientUpdate:
        """Do ``task`` (``"train"`` or ``"probe"``) for the client owning ``data``: a group
        of one."""
        if task.kind == "probe":
            return self.probe(task, params, buffers, data, rng)
        if task.kind != "train":
            raise ValueError(f"unknown task kind {task.kind!r}")
        update = self.train_group([Member(task, data, state, rng)], params, buffers, rule)[0]
        assert update is not None  # without on_error a failure raises
        return update

    def train(self, task, params, buffers, data, state, rng, rule=None) -> ClientUpdate:
        """One client's local steps (:meth:`train_group` of one), before the upload's
        payload and postprocessors."""
        update = self.train_group([Member(task, data, state, rng)], params, buffers, rule, finish=False)[0]
        assert update is not None
        return update

    def finish(
        self,
        task: ClientTask,
        update: ClientUpdate,
        state: ClientState,
        rng: np.random.Generator,
        rule: ClientRule | None = None,
    ) -> ClientUpdate:
        """One client's :meth:`finish_group`."""
        return self.finish_group([Finished(task, update, state, rng)], rule)[0]

    def finish_group(self, clients: list[Finished], rule: ClientRule | None = None) -> list[ClientUpdate]:
        """After the local steps of a group: each update's payload vectors the rule sends
        with it, then the postprocessor chain, each step once over the group's updates that
        did local work (their random draws from each client's own stream, after training's);
        each client's state checked."""
        working = [c for c in clients if c.update.steps > 0]
        if rule is not None:
            for client in working:
                client.update.wire = tuple(rule.upload_payload(int(client.update.delta.numel())))
        if self.postprocessors and working:
            updates = [c.update for c in working]
            generators = [generator_for(c.rng) for c in working]
            for step, name in zip(self.postprocessors, self.namespaces, strict=True):
                updates = step.process_group(updates, [Namespace(c.state, name) for c in working], generators)
            for client, update in zip(working, updates, strict=True):
                client.update = update
        for client in clients:
            check_serialisable(client.state, client.task.client)
        return [c.update for c in clients]

    def budget_for(self, task: ClientTask) -> SimulatedBudget | WallClockBudget:
        """The work budget the system side gave the task: its steps and depth on the virtual
        clock, or real seconds (``task.time_limit``)."""
        if task.time_limit:
            return WallClockBudget(task.time_limit, self.slowdown, self.layer_delay)
        return SimulatedBudget(task.local_steps, task.coverage.depth)

    # -- groups ---------------------------------------------------------------------------
    @staticmethod
    def alone_reason(task: ClientTask, data: ClientData) -> str | None:
        """Why a task trains in a group of its own whatever its pool (None: it can share)."""
        if task.kind != "train":
            return "probes (gradients at the sent model) run alone"
        if task.time_limit:
            return "wall-clock tasks are timed one by one"
        if task.local_steps <= 0 or not len(data):
            return "tasks with no local work run alone"
        return None

    def row_group_limit(self, rule, example) -> tuple[int, str | None]:
        """(the most clients a group of ``rule`` should hold, why) for a group computed row
        by row (:meth:`GroupGradients.row_reason`; ``(0, None)``: the group is stacked, no
        limit). Such a group shares no arithmetic, and each of its steps loads every client's
        row into the working model and steps the stacked rows; past :data:`ROW_GROUP_ELEMENTS`
        that copying costs more than the group saves, and a group of one trains in the
        working model's own storage: on pfl-research's CIFAR-10 shape (1.6 million
        parameters, cohorts of 50) groups of one took 0.83x the time of the whole cohort's
        group, with the same numbers."""
        reason = self.gradients.row_reason(rule, example)
        if reason is None:
            return 0, None
        return max(1, ROW_GROUP_ELEMENTS // max(1, self.flat.params.numel())), reason

    @classmethod
    def group_key(cls, task: ClientTask, data: ClientData) -> tuple | None:
        """Train tasks that can share one computation have equal keys: the same batch size,
        width, depth, learning rate and scalar payload. None: the task runs alone
        (:meth:`alone_reason`)."""
        if cls.alone_reason(task, data) is not None:
            return None
        coverage = task.coverage
        shape = (min(task.batch_size, len(data)), *coverage.width_key(), coverage.depth)
        return (*shape, float(task.lr), scalar_payload(task))

    def train_group(
        self,
        members: list[Member],
        params: torch.Tensor,
        buffers: torch.Tensor,
        rule: ClientRule | None = None,
        on_error: OnError | None = None,
        snapshot: bool = False,
        finish: bool = True,
    ) -> list[ClientUpdate | None]:
        """The updates of a group of clients whose tasks share a shape (:meth:`group_key`),
        in their order: ``task.local_steps`` optimizer steps each on the covered layers
        ``depth..L`` within its budget, each step on a batch of ``task.batch_size`` examples
        drawn without replacement from the client's own data and stream; the gradient gets
        the rule's correction, then the optimizer's step. A client whose hook raises goes to
        ``on_error``, which stops the run (raises) or returns: the client then yields None
        and, with ``snapshot``, keeps the state it had."""
        for i, member in enumerate(members):
            member.position = i
        lead = members[0].task
        coverage = lead.coverage
        if coverage.width != 1.0 and (coverage.depth > max(1, coverage.full_layers) or lead.time_limit):
            raise ValueError(
                "a width-reduced sub-model trains every layer above its whole ones on the simulated clock"
            )
        if lead.time_limit and rule is not None and (rule.customises_loss or rule.selects_samples
                                                     or rule.starts_elsewhere):  # fmt: skip
            raise ValueError("a rule with its own local loss, samples or start trains on the simulated clock")
        if rule is not None and rule.selects_samples:
            self._select_samples(members, params, buffers, rule)
        group = self._open(members, params, buffers, rule, on_error, snapshot)
        if group is None:
            return [self._nothing(m.task, len(m.data), params) for m in members]
        try:
            self._steps(group)
        finally:
            group.view.exit()
        states = [Namespace(m.state if not m.failed else {}, OPTIMIZER) for m in group.members]
        self.optimizer.end(states)  # a failed client keeps the state it had
        out: list[ClientUpdate | None] = [None] * len(members)
        for i, member in enumerate(group.members):
            if not member.failed:
                try:
                    out[member.position] = self._close(group, i)
                except Exception as exc:  # noqa: BLE001  (a rule's bug)
                    group.fail(member, exc)
        if finish:
            self._finish_members(group, out)
        return out

    def _select_samples(self, members: list[Member], params, buffers, rule: ClientRule) -> None:
        """Each client's data narrowed to the examples the rule selects from their losses
        at the received model (evaluated in eval mode, in chunks, without gradients)."""
        flat = self.flat
        flat.model.eval()
        try:
            with torch.no_grad():
                loaded = None
                for member in members:
                    received = params if member.start is None else member.start
                    if received is not loaded:  # the model it received
                        flat.load(received, buffers if member.start_buffers is None else member.start_buffers)
                        loaded = received
                    data = member.data
                    losses = [
                        self.objective.example_losses(flat.model(x, 1), y)
                        for x, y in self._loss_pass_chunks(member.task.client, data)
                    ]
                    own = Namespace(member.state, ALGORITHM)
                    values = torch.cat(losses).float().cpu().numpy()
                    chosen = rule.select_samples(member.task, own, values, member.rng)
                    if chosen is not None:
                        member.data = replace(data, indices=data.indices[np.asarray(chosen, dtype=np.int64)])
        finally:
            flat.model.train()

    def _loss_pass_chunks(self, client: int, data: ClientData) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The client's examples and labels in chunks of at most 1,024 for the sample-loss
        pass, gathered (and images decoded) at its first task and kept while its index array
        is the same: a rule that selects samples passes over every example at every task
        (FedBalancer), and gathering and decoding them cost a third of that pass."""
        kept = self._loss_chunks.get(client)
        if kept is not None and kept[0] is data.indices:
            return kept[1]
        pieces = np.array_split(data.indices, max(1, -(-len(data) // 1024)))
        chunks = [(data.x[chunk], data.y[chunk]) for chunk in pieces]
        self._loss_chunks[client] = (data.indices, chunks)
        return chunks

    def _finish_members(self, group: _Group, out: list[ClientUpdate | None]) -> None:
        """The group's :meth:`finish_group`; a postprocessor that raises fails each of the
        group's clients (their updates were finished together)."""
        done = [m for m in group.members if not m.failed and out[m.position] is not None]
        clients = [Finished(m.task, out[m.position], m.state, m.rng) for m in done]  # type: ignore[arg-type]
        try:
            finished = self.finish_group(clients, group.rule)
        except Exception as exc:  # noqa: BLE001  (a rule's or postprocessor's bug)
            for member in done:
                out[member.position] = None
                group.fail(member, exc)
            return
        for member, update in zip(done, finished, strict=True):
            out[member.position] = update

    def _open(self, members, params, buffers, rule, on_error, snapshot) -> _Group | None:
        """The group's rows and coverage, the optimizer begun; None: there is nothing to do."""
        flat, lead = self.flat, members[0]
        first = None
        if len(members) == 1 and lead.task.time_limit:
            lead.budget, depth, first = self._begin(lead.task, params, buffers, lead.data, lead.rng)
        else:
            depth = lead.task.coverage.depth
            for member in members:
                member.budget = self.budget_for(member.task)
        reached = flat.param_slices.from_depth(min(depth, flat.num_layers + 1))
        if depth > flat.num_layers or lead.task.local_steps <= 0 or reached.stop == reached.start:
            # nothing to train: no layer reached, no step, or the layers reached hold no
            # trainable parameter (a frozen head: LoRA's)
            lead.task = replace(lead.task, coverage=replace(lead.task.coverage, depth=depth))
            return None
        if len(members) > 1:
            members.sort(key=lambda m: -m.task.local_steps)  # stable: the working clients first
        starts = self._starts(members, rule, params)
        buffer_starts = self._buffer_starts(members, buffers)
        if first is None:
            one = len(members) == 1
            flat.load(params if starts is None or not one else starts[0],
                      buffers if buffer_starts is None or not one else buffer_starts[0])  # fmt: skip
        if not flat.model.training:  # train()/eval() are set on the whole model, never on a part
            flat.model.train()
        scale = rule is None or rule.scales_sub_models
        coverage = lead.task.coverage
        view = CoverageView(flat, depth, coverage.width, self.masks, scale=scale, offset=coverage.offset,
                            full_layers=coverage.full_layers, layers=coverage.layers)  # fmt: skip
        view.enter()  # a sub-model's mask on the working model, the scaler hooks on
        rows, buffer_rows = self._rows(len(members), starts, buffer_starts, view)
        kept = {id(m): {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in m.state.items()}
                for m in members} if snapshot else {}  # fmt: skip
        reason = self.gradients.row_reason(rule, lead.data.x) if len(members) > 1 else None
        if reason is not None:
            self.gradients.row_by_row[reason] += len(members)
        stacked = len(members) > 1 and reason is None
        group = _Group(
            members, params, buffers, rows, buffer_rows, view, rule, stacked, on_error, kept, first,
            shared=len(members) == 1, starts=starts, buffer_starts=buffer_starts,
        )  # fmt: skip
        self.optimizer.begin(
            [Namespace(m.state, OPTIMIZER) for m in members], flat.params.numel(), flat.device
        )
        return group

    def _rows(
        self, count: int, starts, buffer_starts, view: CoverageView
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's parameter and buffer rows: the working model's own storage for one
        client; else each row from its own start (a sub-model's mask on it) or the loaded
        model."""
        flat = self.flat
        if count == 1:
            return flat.params.unsqueeze(0), flat.buffers.unsqueeze(0)
        if starts is None:
            rows = flat.params.detach().unsqueeze(0).repeat(count, 1)
        else:
            rows = starts.clone()
            if view.mask is not None:
                rows.mul_(view.mask)  # as enter() did to the working model
        buffer_rows = (
            flat.buffers.detach().unsqueeze(0).repeat(count, 1)
            if buffer_starts is None
            else buffer_starts.clone()
        )
        return rows, buffer_rows

    @staticmethod
    def _starts(members: list[Member], rule: ClientRule | None, params: torch.Tensor) -> torch.Tensor | None:
        """Each member's own start, one row each: the rule's ``start_point``, else the model
        the member received (``member.start``, else the group's ``params``); None when every
        member starts at ``params``."""
        elsewhere = rule is not None and rule.starts_elsewhere
        if not elsewhere and all(m.start is None for m in members):
            return None
        rows = []
        for member in members:
            received = params if member.start is None else member.start
            start = rule.start_point(member.task, Namespace(member.state, ALGORITHM)) if elsewhere else None  # type: ignore[union-attr]
            if start is not None and start.shape != params.shape:
                raise ValueError(f"start_point of client {member.task.client}: {tuple(start.shape)} for "
                                 f"{tuple(params.shape)} parameters")  # fmt: skip
            rows.append(received if start is None else start.to(params.device, params.dtype))
        return torch.stack(rows)

    @staticmethod
    def _buffer_starts(members: list[Member], buffers: torch.Tensor) -> torch.Tensor | None:
        """Each member's received buffers, one row each; None when all are the group's."""
        if all(m.start_buffers is None for m in members):
            return None
        return torch.stack([buffers if m.start_buffers is None else m.start_buffers for m in members])

    @staticmethod
    def _nothing(task: ClientTask, num_samples: int, params: torch.Tensor) -> ClientUpdate:
        """The update of a client that computed nothing (depth L+1, or no steps)."""
        return ClientUpdate(
            task.client, task.coverage, 0, num_samples, float("nan"), params.new_zeros(0),
            model_round=task.model_round,
        )  # fmt: skip

    def _begin(self, task, params, buffers, data, rng):
        """A wall-clock task's budget, the depth it reached and its first step, timed layer
        by layer (None when it reached nothing)."""
        flat, depth = self.flat, task.coverage.depth
        if not (depth <= flat.num_layers and task.local_steps > 0):
            return self.budget_for(task), depth, None
        x, y = data.batch(rng, task.batch_size)
        self._warm_up(x, y)
        flat.load(params, buffers)  # after the warm-up, which may touch BatchNorm statistics
        flat.model.train()
        budget = self.budget_for(task)  # the device's time starts now, warmed up
        depth, first = timed_first_step(flat.model, x, y, depth, budget, self.objective.loss)
        return budget, depth, None if first is None else (*first, x, y)

    def _steps(self, group: _Group) -> None:
        """The local steps every client's budget allows, as one computation per step."""
        members, depth = group.members, group.view.depth
        track = group.rule is not None and group.rule.tracks_gradient_differences
        for step in range(max(m.task.local_steps for m in members)):
            first = group.first if step == 0 else None
            active = len(members) if first is not None else self._working(members)
            if not active:
                break
            x, y = self._batches(members[:active]) if first is None else ([first[2]], [first[3]])
            grads = self._gradients(group, active, x, y, first)
            for member in members[:active]:
                if first is None:
                    member.budget.step_done(self.flat.num_layers + 1 - depth)
            group.view.restrict_rows(grads)  # plain tensors: no graph to keep out of
            if track:
                self._observe(group, grads, x, y, own=step == 0 and group.first is None)
            with torch.no_grad():
                self._correct(group, grads)
                region = group.view.param_slice
                regions = group.regions if active == len(members) else group.regions[:active]
                self.optimizer.step(regions, grads, members[0].task.lr, region)

    @staticmethod
    def _working(members: list[Member]) -> int:
        """How many of the group's first clients take another step: their tasks ask for
        more steps and their budgets allow one."""
        count = 0
        while count < len(members):
            member = members[count]
            if len(member.losses) >= member.task.local_steps or not member.budget.allows_another_step():
                break
            count += 1
        return count

    @staticmethod
    def _batches(members: list[Member]) -> tuple[torch.Tensor | list, torch.Tensor | list]:
        """Each working client's next batch from its own data and stream, stacked (one
        client: in a list, indexed the same way)."""
        if len(members) == 1:
            m = members[0]
            x, y = m.data.batch(m.rng, m.task.batch_size)
            return [x], [y]
        chosen = [m.data.draw(m.rng, m.task.batch_size) for m in members]
        sources: dict[
            tuple[int, int], list[int]
        ] = {}  # one gather per dataset (runs in lockstep: one per run)
        for j, m in enumerate(members):
            sources.setdefault((id(m.data.x), id(m.data.y)), []).append(j)
        size, first = len(chosen[0]), members[0].data
        if len(sources) == 1:
            index = torch.from_numpy(np.concatenate(chosen)).to(first.x.device)
            return (first.x.index_select(0, index).view(len(members), size, *first.x.shape[1:]),
                    first.y.index_select(0, index).view(len(members), size, *first.y.shape[1:]))  # fmt: skip
        x = first.x.new_empty((len(members), size, *first.x.shape[1:]))
        y = first.y.new_empty((len(members), size, *first.y.shape[1:]))
        for positions in sources.values():
            data = members[positions[0]].data
            index = torch.from_numpy(np.concatenate([chosen[j] for j in positions])).to(data.x.device)
            rows = torch.tensor(positions, device=x.device)
            x[rows] = data.x.index_select(0, index).view(len(positions), size, *data.x.shape[1:])
            y[rows] = data.y.index_select(0, index).view(len(positions), size, *data.y.shape[1:])
        return x, y

    def _gradients(self, group: _Group, active: int, x, y, first) -> torch.Tensor:
        """The working rows' gradients over the covered region (k x m); each client's loss
        appended to its record."""
        members, depth, engine = group.members[:active], group.view.depth, self.gradients
        if first is not None:
            loss, grads = first[0], first[1]
            members[0].losses.append(float(loss.detach()))
            with torch.no_grad():
                return self.flat.flatten(grads).unsqueeze(0)
        if group.stacked:
            try:
                loss_fn = engine.shared_loss(members[0].task, group.rule)
                start = group.view.param_slice.start
                grads, values = engine.stacked(
                    group.rows[:active], group.buffer_rows[:active], start, x, y, depth, loss_fn
                )
                for member, value in zip(members, values, strict=True):
                    member.losses.append(value)
                return grads
            except PerClient as reason:
                engine.per_client.add(type(group.rule))
                engine.row_by_row[per_client_reason(group.rule)] += len(group.members)
                name = getattr(group.rule, "name", type(group.rule).__name__)
                log.info("%s's local loss %s: its clients' losses are computed one by one", name, reason)
                group.stacked = False
        return self._row_by_row(group, members, x, y)

    def _row_by_row(self, group: _Group, members: list[Member], x, y) -> torch.Tensor:
        """Each working row's gradient on the working model (loaded with the row unless the
        group is one client, trained in the working model's own storage)."""
        flat, depth = self.flat, group.view.depth
        out = []
        for i, member in enumerate(members):
            if not group.shared:
                flat.load(group.rows[i], group.buffer_rows[i])
            try:
                grad, loss = self.gradients.on_working_model(member, x[i], y[i], depth, group.rule)
            except Exception as exc:  # noqa: BLE001  (a rule's local loss raised)
                group.fail(member, exc)
                grad, loss = (
                    flat.params.new_zeros(flat.params.numel() - group.view.param_slice.start),
                    float("nan"),
                )
            member.losses.append(loss)
            if not group.shared:
                group.buffer_rows[i].copy_(flat.buffers)
            out.append(grad)
        return torch.stack(out) if len(out) > 1 else out[0].unsqueeze(0)

    def _correct(self, group: _Group, grads: torch.Tensor) -> None:
        """The rule's gradient transform (FedProx's proximal term, SCAFFOLD's c - c_i,
        FedDyn's linear term) added to each working client's gradient."""
        rule = group.rule
        if rule is None or not rule.corrects_gradients:
            return
        region = group.view.param_slice
        for i, member in enumerate(group.members[: len(grads)]):
            if member.failed:
                continue
            try:
                own = Namespace(member.state, ALGORITHM)
                correction = rule.gradient_correction(member.task, own, region, group.rows[i], group.start(i))
                if correction is not None:
                    grads[i].add_(correction)
            except Exception as exc:  # noqa: BLE001  (a rule's bug)
                group.fail(member, exc)

    def _observe(self, group: _Group, grads: torch.Tensor, x, y, own: bool) -> None:
        """AMSFL's gradient differences: each step's gradient beside the gradient at the
        received model on the same batch (step 1 starts there: its own gradient is it)."""
        region, depth, count = group.view.param_slice, group.view.depth, len(grads)
        anchor = group.params[region] if group.starts is None else group.starts[:count, region]
        if own:
            anchors = grads.clone()
        elif group.stacked:
            own_starts = group.starts
            rows = (
                group.params.unsqueeze(0).expand(count, -1) if own_starts is None else own_starts[:count]
            ).clone()
            buffer_rows = group.buffer_rows[:count].clone()
            loss_fn = self.gradients.shared_loss(group.members[0].task, None)
            anchors, _ = self.gradients.stacked(rows, buffer_rows, region.start, x, y, depth, loss_fn)
        else:
            anchors = torch.stack([self._anchor_row(group, i, x[i], y[i]) for i in range(len(grads))])
        with torch.no_grad():
            distances = (group.rows[: len(grads), region] - anchor).norm(dim=1).tolist()
        for i, member in enumerate(group.members[: len(grads)]):
            if not member.failed and group.rule is not None:
                own_state = Namespace(member.state, ALGORITHM)
                group.rule.observe_gradients(member.task, own_state, grads[i], anchors[i], distances[i])

    def _anchor_row(self, group: _Group, i: int, x, y) -> torch.Tensor:
        """Row ``i``'s gradient at the received model, on the working model."""
        if not group.shared:
            self.flat.load(group.rows[i], group.buffer_rows[i])
        return self.gradients.at_point(group.start(i)[group.view.param_slice], x, y, group.view.depth)

    def _close(self, group: _Group, i: int) -> ClientUpdate:
        """Client ``i``'s update from its row: the delta over its covered elements, the
        rule's ``finish_local_work`` (the postprocessors follow, for the whole group)."""
        member, view, params, task = group.members[i], group.view, group.start(i), group.members[i].task
        with torch.no_grad():
            sent = group.sent_region if group.starts is None else params[view.param_slice]
            delta = group.regions[i] - sent
            if view.mask is not None:
                delta.mul_(view.mask[view.param_slice])  # elements outside the sub-model are not the client's
            sent_buffers = group.sent_buffers if group.buffer_starts is None else group.sent_buffers[i]
            delta_buffers = group.buffer_regions[i] - sent_buffers
        update = ClientUpdate(
            client=task.client,
            coverage=replace(task.coverage, depth=view.depth) if group.first else task.coverage,
            steps=len(member.losses),
            num_samples=len(member.data),
            loss=float(member.losses[0]) if len(member.losses) == 1 else float(np.mean(member.losses)),
            delta=delta,
            delta_buffers=delta_buffers,
            model_round=task.model_round,
        )
        if group.rule is not None:
            with torch.no_grad():
                own = Namespace(member.state, ALGORITHM)
                group.rule.finish_local_work(task, update, own, view.param_slice, group.rows[i], params)
        return update

    def _warm_up(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Once per process, before the first timed task: autograd's first calls are slow
        (a fresh process pays a quarter of a second), which is no property of the device."""
        if self._warm:
            return
        self.flat.model.train()
        timed_first_step(self.flat.model, x[:2], y[:2], 1, WallClockBudget(60.0), self.objective.loss)
        self._warm = True

    def probe(
        self,
        task: ClientTask,
        params: torch.Tensor,
        buffers: torch.Tensor,
        data: ClientData,
        rng: np.random.Generator,
    ) -> ClientUpdate:
        """Full-depth minibatch gradients at the sent model; nothing is trained.

        Draws ``payload["batches"]`` batches of ``task.batch_size`` and replies with payload
        ``grad_sq_norm`` (mean ||g_b||^2) and ``grad_variance`` sigma^2 = batch size x the
        unbiased sample variance of the batch gradients (under ADEL-FL's A2 a batch of S has
        variance sigma^2 / S)."""
        num_batches = int(task.payload.get("batches", 8))
        if num_batches < 2:
            raise ValueError("a gradient probe needs at least 2 batches for a variance")
        flat = self.flat
        size = min(task.batch_size, len(data))
        params_list = list(flat.parameters_from_depth(1))
        grads = []
        for _ in range(num_batches):
            flat.load(params, buffers)
            flat.model.train()
            x, y = data.batch(rng, size)
            loss = self.objective.loss(flat.model(x), y)
            grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params_list)]))
        flat.load(params, buffers)
        stacked = torch.stack(grads).double()
        mean_sq_norm = float((stacked**2).sum(dim=1).mean())
        variance = float(((stacked - stacked.mean(0)) ** 2).sum(dim=1).sum() / (num_batches - 1))
        return ClientUpdate(
            client=task.client,
            coverage=Coverage(flat.num_layers + 1),
            steps=0,
            num_samples=len(data),
            loss=float("nan"),
            delta=params.new_zeros(0),
            model_round=task.model_round,
            payload={"grad_sq_norm": mean_sq_norm, "grad_variance": size * variance},
        )
