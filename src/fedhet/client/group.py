"""The gradients of a *group* of clients: the one computation behind every pool.

A group is a set of train tasks that share a shape (batch size, sub-model width, depth,
learning rate, the task's scalar payload); each client is one row of a parameter matrix.
:class:`GroupGradients` gives every working row its loss and the gradient over the covered
region on its own batch, in one of two ways, with the same hooks:

- **stacked**: with the task's own loss and a model of layers it knows, the grouped
  kernels of :mod:`fedhet.client.grouped` (one ``baddbmm`` per dense layer, one grouped
  convolution, one ``batch_norm`` over the clients' channels; the sum of the rows' losses
  differentiated once); otherwise one ``torch.func.vmap`` over the rows of
  ``torch.func.grad`` of the row's loss, the model called through
  ``torch.func.functional_call`` (BatchNorm's running statistics are rows too); either
  way the layers below the group's depth run without a graph, as one client's would
  (SALF Sec. III-A);
- **row by row** on the working model (:class:`~fedhet.models.FlatModel`), autograd asked
  for the reached parameters only: a group of one (the in-process pool, bit for bit the
  single-client computation), a model ``vmap`` cannot batch, or a rule whose local loss
  differs per client (:attr:`ClientPart.local_loss_per_client`).

The loss is the rule's :meth:`~fedhet.algorithms.parts.ClientPart.local_loss` where it has one,
else the task's. Called once for a stacked group, the hook sees the group's shared task
fields (round, learning rate, batch size, coverage, scalar payload); a hook that reads a
client's own state, its stream or a per-client payload tensor is found out on its first
call (:class:`PerClient` is raised) and the rule is computed row by row from then on.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from fedhet.client.budget import SimulatedBudget, WallClockBudget
from fedhet.client.gradients import gradients
from fedhet.client.grouped import GroupedForward
from fedhet.client.state import ALGORITHM, ClientData, ClientState, Namespace
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.models.layers import FlatModel

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One client of a group: its task, data, state, stream, and how its work goes."""

    task: ClientTask
    data: ClientData
    state: ClientState
    rng: np.random.Generator
    position: int = 0  # its index in the caller's list
    budget: SimulatedBudget | WallClockBudget = field(default_factory=lambda: SimulatedBudget(0, 1))
    losses: list[float] = field(default_factory=list)
    failed: bool = False
    # the model this client received when it is not the group's (runs trained as one
    # computation: each client starts from its own run's global model)
    start: torch.Tensor | None = None
    start_buffers: torch.Tensor | None = None


@dataclass
class Finished:
    """A client whose local work is done: its task, update, state and stream, for the
    upload's payload and the postprocessors."""

    task: ClientTask
    update: ClientUpdate
    state: ClientState
    rng: np.random.Generator


def scalar_payload(task: ClientTask) -> tuple:
    """The task's payload entries that are plain scalars (DepthFL's exit count): part of a
    group's shape, and what a stacked local loss may read."""
    return tuple(sorted((k, v) for k, v in task.payload.items() if isinstance(v, (bool, int, float, str))))


def per_client_reason(rule) -> str:
    """Why a rule's groups are computed row by row: its local loss is one client's."""
    return f"{getattr(rule, 'name', type(rule).__name__)}'s local loss reads one client's own data"


class PerClient(Exception):
    """A local loss called once for a stacked group read something of one client."""


class _SharedStream:
    """The stream a stacked group's local loss gets: drawing from it is per client."""

    def __getattr__(self, name: str):
        raise PerClient(f"draws from the client's stream ({name})")


class _SharedState(Mapping):
    """The state a stacked group's local loss gets: reading it is per client."""

    def __getitem__(self, key):
        raise PerClient(f"reads the client's state ({key!r})")

    def __iter__(self):
        raise PerClient("reads the client's state")

    def __len__(self) -> int:
        raise PerClient("reads the client's state")


class _SharedTask:
    """The task a stacked group's local loss gets: the group's shared fields; the client's
    id and per-client payload entries are per client."""

    def __init__(self, task: ClientTask):
        self._task = task
        self.payload = dict(scalar_payload(task))

    def __getattr__(self, name: str):
        if name in ("client", "local_steps"):
            raise PerClient(f"reads task.{name}")
        return getattr(self._task, name)


class _Call(torch.nn.Module):
    """``fn(model, *args)`` as a module call, so that ``functional_call`` puts a row's
    tensors in every submodule for the whole of a rule's local loss."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn, *args):
        return fn(self.model, *args)


class GroupGradients:
    """Losses and covered-region gradients for the working rows of a group (see the module's
    docstring): stacked where the model and the rule allow it, else row by row."""

    def __init__(self, flat: FlatModel, task_loss):
        self.flat = flat
        self.task_loss = task_loss  # the dataset's task, called as its training loss (fedhet.data.task)
        self.caller = _Call(flat.model)
        names = {id(p): name for name, p in flat.model.named_parameters()}
        self.pieces: list[tuple[str, int, int, torch.nn.Parameter]] = []
        offset = 0
        for p in (p for params in flat.layer_params for p in params):
            self.pieces.append((f"model.{names[id(p)]}", offset, offset + p.numel(), p))
            offset += p.numel()
        self.buffer_pieces, self.other_buffers = self._buffer_names()
        self.per_client: set[type] = set()  # rules found to compute their loss per client
        self.row_by_row: Counter[str] = Counter()  # clients of groups computed row by row, by reason
        self.policy = "auto"  # stack groups: "auto" (where it pays), "always" (where vmap can), "never"
        self.unsupported: str | None = None
        self._checked = False
        self.kernels = GroupedForward(flat)  # a group's forward in batched kernels, where it knows the layers
        self.example_losses = hasattr(task_loss, "example_losses")

    def _buffer_names(self) -> tuple[list[tuple[str, int, torch.Size]], dict[str, torch.Tensor]]:
        """The model's float buffers as regions of the flat buffer vector, and the others
        (BatchNorm's step counter), which a stacked group carries as rows it then drops."""
        flat, pieces, others = self.flat, [], {}
        base, size = flat.buffers.data_ptr(), flat.buffers.element_size()
        for name, buf in flat.model.named_buffers():
            if (
                buf.is_floating_point()
                and flat.buffers.numel()
                and buf.untyped_storage().data_ptr() == (flat.buffers.untyped_storage().data_ptr())
            ):
                start = (buf.data_ptr() - base) // size
                pieces.append((f"model.{name}", start, buf.shape))
            else:
                others[f"model.{name}"] = buf
        return pieces, others

    # -- which way ------------------------------------------------------------------------
    def stacks(self, rule, example: torch.Tensor) -> bool:
        """Whether a group of several clients of ``rule`` is computed stacked."""
        return self.row_reason(rule, example) is None

    def row_reason(self, rule, example: torch.Tensor) -> str | None:
        """Why a group of several clients of ``rule`` is computed row by row (None: stacked)."""
        if self.policy == "never":
            return "run.stacked = 'never'"
        if rule is not None and (rule.local_loss_per_client or type(rule) in self.per_client):
            return per_client_reason(rule)
        return self.model_reason(example)

    def model_reason(self, example: torch.Tensor) -> str | None:
        """Why the model is computed row by row (None: it stacks), found once on one example:
        an operation ``vmap`` cannot batch, or convolutions on the CPU, where ``vmap``'s
        grouped convolutions are slower than one client after another (4.5x on
        pfl-research's CIFAR-10 shape, benchmarks/batched_cpu.py)."""
        if not self._checked:
            self._checked = True
            if self.convolutions and self.flat.device.type == "cpu" and self.policy == "auto":
                self.unsupported = "convolutions on the CPU: vmap's grouped convolutions are slower there"
                log.info("clients' gradients are computed one at a time: %s", self.unsupported)
                return self.unsupported
            try:
                region = self.flat.params.detach().clone().unsqueeze(0)
                buffers = self._buffer_rows(self.flat.buffers.detach().unsqueeze(0))
                x = example[:2].unsqueeze(0)
                y = torch.zeros(1, x.shape[1], dtype=torch.long, device=x.device)
                with torch.no_grad():
                    torch.func.vmap(self._row_loss, in_dims=(0, 0, 0, 0, 0, None, None))(
                        region, region[:, :0], buffers, x, y, 1, lambda model, x, y, d: model(x, d).sum()
                    )
            except Exception as exc:  # noqa: BLE001  (any operation vmap cannot batch)
                text = (str(exc).strip().splitlines() or [""])[0][:160]
                self.unsupported = f"torch.func.vmap cannot batch this model ({type(exc).__name__}: {text})"
                log.info("clients train one at a time: %s", self.unsupported)
        return self.unsupported

    def loss(self, model, task, state, rng, x, y, depth: int, rule) -> torch.Tensor:
        """The loss one local step differentiates: the rule's local loss (``state``: the
        client's state, seen as the rule's part of it; a stacked group's stand-in as it is),
        or the task's."""
        if rule is not None and rule.customises_loss:
            own = state if isinstance(state, _SharedState) else Namespace(state, ALGORITHM)
            return rule.local_loss(task, own, model, x, y, depth, self.task_loss, rng)
        return self.task_loss(model(x, depth), y)

    # -- stacked ------------------------------------------------------------------------
    def _row_loss(self, region, below, buffers: dict, x, y, depth, loss_fn):
        """One row's loss (vmapped): its tensors put into the model for the call; its
        buffers (BatchNorm's statistics, one standalone tensor each) change in place."""
        row = torch.cat([below, region])
        tensors = {name: self._shaped(row[start:stop], p) for name, start, stop, p in self.pieces}
        loss = torch.func.functional_call(self.caller, {**tensors, **buffers}, (loss_fn, x, y, depth))
        return loss, loss.detach()

    def _buffer_rows(self, buffer_rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each buffer of each row as a standalone tensor (vmap updates those in place): the
        float ones from ``buffer_rows``, the others (a step counter) from the model."""
        count = len(buffer_rows)
        out = {name: buffer_rows[:, start : start + shape.numel()].reshape(count, *shape).clone()
               for name, start, shape in self.buffer_pieces}  # fmt: skip
        for name, buf in self.other_buffers.items():
            out[name] = buf.unsqueeze(0).repeat(count, *[1] * buf.dim())
        return out

    def _keep_buffers(self, buffer_rows: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        for name, start, shape in self.buffer_pieces:
            buffer_rows[:, start : start + shape.numel()].copy_(rows[name].reshape(len(buffer_rows), -1))

    def _shaped(self, values: torch.Tensor, p: torch.nn.Parameter) -> torch.Tensor:
        if self.flat.channels_last and p.dim() == 4:
            out, inp, height, width = p.shape
            return values.view(out, height, width, inp).permute(0, 3, 1, 2)
        return values.view(p.shape)

    def stacked(self, rows, buffer_rows, start: int, x, y, depth: int, loss_fn):
        """(gradients over columns ``start:`` of ``rows``, losses) of every row at once;
        ``buffer_rows`` change in place as the model's buffers would. With the task's loss
        and a model the grouped kernels know, those kernels; else one ``vmap``."""
        if getattr(loss_fn, "plain", False) and self.kernels_pay() and not self.kernels.hooked():
            return self._grouped(rows, buffer_rows, start, x, y, depth)
        step = torch.func.grad(self._row_loss, argnums=0, has_aux=True)
        buffers = self._buffer_rows(buffer_rows)
        grads, values = torch.func.vmap(step, in_dims=(0, 0, 0, 0, 0, None, None))(
            rows[:, start:], rows[:, :start], buffers, x, y, depth, loss_fn
        )
        self._keep_buffers(buffer_rows, buffers)
        return grads, values.tolist()

    def kernels_pay(self) -> bool:
        """Whether the grouped kernels compute this model's groups: they know its layers,
        it is on the CPU (where they were measured against ``vmap``: benchmarks/overhead.py)
        and it has no convolution (grouped convolutions are slower there than ``vmap``)."""
        return self.kernels.reason() is None and self.flat.device.type == "cpu" and not self.convolutions

    @functools.cached_property
    def convolutions(self) -> bool:
        """Whether the model has a convolution (found once: its layers do not change)."""
        kinds = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
        return any(isinstance(m, kinds) for m in self.flat.model.modules())

    def _grouped(self, rows, buffer_rows, start: int, x, y, depth: int):
        """:meth:`stacked` through :class:`~fedhet.client.grouped.GroupedForward`: the sum
        of the rows' task losses differentiated once, each row's gradient its own."""
        count = len(rows)
        if isinstance(x, list):  # one working row's batch, as the trainer hands a single client's
            x, y = torch.stack(x), torch.stack(y)
        tensors, leaves = self.kernels.leaves(rows, start)
        out = self.kernels(tensors, buffer_rows, x, depth)
        losses = self._row_losses(out, y)
        grads = torch.autograd.grad(losses.sum(), leaves)
        with torch.no_grad():
            return torch.cat([g.reshape(count, -1) for g in grads], 1), losses.detach().tolist()

    def _row_losses(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each row's mean task loss over its batch: the task's per-example losses where it
        defines them, else its loss row by row."""
        count, size = out.shape[:2]
        if self.example_losses:
            try:
                merged = self.task_loss.example_losses(out.reshape(count * size, *out.shape[2:]),
                                                       y.reshape(count * size, *y.shape[2:]))  # fmt: skip
                return merged.view(count, size).mean(1)
            except NotImplementedError:
                self.example_losses = False
        return torch.stack([self.task_loss(out[i], y[i]) for i in range(count)])

    def shared_loss(self, lead: ClientTask, rule):
        """A stacked group's loss function: the hook sees the group's shared fields only."""
        task, state, stream = _SharedTask(lead), _SharedState(), _SharedStream()

        def loss_fn(model, x, y, depth):
            return self.loss(model, task, state, stream, x, y, depth, rule)

        loss_fn.plain = rule is None or not rule.customises_loss  # type: ignore[attr-defined]  # the task's loss
        return loss_fn

    # -- row by row ---------------------------------------------------------------------
    def on_working_model(self, member: Member, x, y, depth: int, rule) -> tuple[torch.Tensor, float]:
        """(the flat gradient over layers ``depth..L``, the loss) of the working model as
        loaded, truncated back-propagation asking autograd for the reached parameters only."""
        loss = self.loss(self.flat.model, member.task, member.state, member.rng, x, y, depth, rule)
        grads = gradients(loss, self.flat.parameters_from_depth(depth))
        with torch.no_grad():
            return self.flat.flatten(grads), float(loss.detach())

    def at_point(self, point: torch.Tensor, x, y, depth: int) -> torch.Tensor:
        """The task loss's gradient over layers ``depth..L`` with those layers' flat values
        set to ``point``, on the batch (x, y); the working model's parameters and buffers
        are left as they were (AMSFL's gradient at the received model)."""
        flat = self.flat
        region = flat.params[flat.param_slices.from_depth(depth)]
        with torch.no_grad():
            saved_params, saved_buffers = region.clone(), flat.buffers.clone()
            region.copy_(point)
        loss = self.task_loss(flat.model(x, depth), y)
        grads = torch.autograd.grad(loss, flat.parameters_from_depth(depth))
        with torch.no_grad():
            region.copy_(saved_params)
            flat.buffers.copy_(saved_buffers)
            return flat.flatten(list(grads))
