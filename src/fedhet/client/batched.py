"""Many clients' local work as one computation: the round's clients trained together over
stacked copies of the model (``torch.func.functional_call`` under ``torch.func.vmap``), the
same tasks, draws and updates as :class:`~fedhet.client.trainer.LocalTrainer` running them
one after another (equal within float tolerance: a batched kernel sums in another order).

A group is a set of tasks with the same batch size and sub-model width. Within it:

- each client draws its batches from its own stream, in the same order as alone;
- every client trains from the global model; its parameter row gets its steps' updates only
  (clients sorted by steps: at step s the first k_s rows are the clients still working);
- a client of depth d gets no update below layer d: the forward pass builds no graph below the
  group's lowest depth, and each row's gradient is zeroed below its own (SALF Sec. III-A;
  the reached layers' gradients are the ones truncated back-propagation computes);
- a sub-model (HeteroFL) starts from the masked model, runs with the scaler hooks, and its
  gradient is restricted to its elements, as :class:`~fedhet.client.coverage.CoverageView`;
- the rule's gradient correction (FedProx's proximal term, SCAFFOLD's c - c_i, FedDyn's
  linear term) and ``finish_local_work`` run per client on its row; a plain SGD step updates
  every row at once, another optimizer (momentum, Adam) steps each row with its own state.

What cannot be batched runs one at a time (:meth:`BatchedTrainer.batchable` says why): probes,
wall-clock tasks, rules with their own loss or per-step gradient tracking (FjORD, AMSFL),
models with float buffers (BatchNorm's running statistics), channels-last weights, and models
whose operations ``vmap`` does not support (found once, on a tiny input).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedhet.client.optimizers import SGD
from fedhet.client.state import ALGORITHM, OPTIMIZER, ClientData, ClientState, Namespace
from fedhet.client.trainer import LocalTrainer
from fedhet.errors import FedhetError
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.models.width import scaler_hooks

OnError = Callable[[ClientTask, BaseException], None]  # a client's hook raised: stop, or mark it failed


@dataclass
class _Member:
    """One client of a group: its task, data, state, stream, and where it stands."""

    task: ClientTask
    data: ClientData
    state: ClientState
    rng: np.random.Generator
    position: int  # its index in the caller's list
    failed: bool = False


class BatchedTrainer:
    """Trains groups of clients at once on ``trainer``'s model (its objective, optimizer,
    postprocessors and width masks)."""

    def __init__(self, trainer: LocalTrainer):
        self.trainer = trainer
        flat = trainer.flat
        names = {id(p): name for name, p in flat.model.named_parameters()}
        self._pieces: list[tuple[str, int, int, tuple[int, ...]]] = []
        offset = 0
        for params in flat.layer_params:
            for p in params:
                self._pieces.append((names[id(p)], offset, offset + p.numel(), tuple(p.shape)))
                offset += p.numel()
        self._unsupported: str | None = None
        self._checked = False

    # -- what can be batched --------------------------------------------------------------
    def model_reason(self, example: torch.Tensor) -> str | None:
        """Why this model cannot be trained batched (None: it can). Checked once, on one
        example: ``vmap`` over the model's operations."""
        flat = self.trainer.flat
        if flat.buffers.numel():
            return "the model has float buffers (BatchNorm's running statistics)"
        if flat.channels_last:
            return "run.memory_format = 'channels_last'"
        if not self._checked:
            self._checked = True
            try:
                rows = flat.params.detach().clone().unsqueeze(0)
                x = example[:1].unsqueeze(0)
                with torch.no_grad():
                    torch.func.vmap(self._forward, in_dims=(0, 0, None))(rows, x, 1)
            except Exception as exc:  # noqa: BLE001  (any operation vmap cannot batch)
                text = (str(exc).strip().splitlines() or [""])[0][:160]
                self._unsupported = f"torch.func.vmap cannot batch this model ({type(exc).__name__}: {text})"
        return self._unsupported

    def batchable(self, task: ClientTask, data: ClientData, rule) -> str | None:
        """Why ``task`` runs one at a time (None: it can join a group)."""
        if task.kind != "train":
            return "a probe"
        if task.time_limit:
            return "a wall-clock task"
        if task.local_steps <= 0 or task.coverage.depth > self.trainer.flat.num_layers or not len(data):
            return "no local work"
        if task.coverage.width != 1.0 and task.coverage.depth != 1:
            return "a partial sub-model"  # the trainer refuses it in one line
        if rule is not None and (rule.customises_loss or rule.tracks_gradient_differences):
            return "the rule's own loss or gradient tracking"
        return self.model_reason(data.x)

    @staticmethod
    def group_key(task: ClientTask, data: ClientData) -> tuple[int, float]:
        """Tasks that train together: the same batch size and width."""
        return min(task.batch_size, len(data)), float(task.coverage.width)

    # -- the computation ------------------------------------------------------------------
    def _tensors(self, row: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's parameters as views of one flat row."""
        return {name: row[start:stop].view(shape) for name, start, stop, shape in self._pieces}

    def _forward(self, row: torch.Tensor, x: torch.Tensor, depth: int) -> torch.Tensor:
        return torch.func.functional_call(self.trainer.flat.model, self._tensors(row), (x, depth))

    def _loss(self, row: torch.Tensor, x: torch.Tensor, y: torch.Tensor, depth: int):
        loss = self.trainer.objective.loss(self._forward(row, x, depth), y)
        return loss, loss.detach()

    def train(
        self,
        tasks: list[ClientTask],
        params: torch.Tensor,
        buffers: torch.Tensor,
        datas: list[ClientData],
        states: list[ClientState],
        rngs: list[np.random.Generator],
        rule=None,
        on_error: OnError | None = None,
        snapshot: bool = False,
    ) -> list[ClientUpdate | None]:
        """The updates of one group's ``tasks`` (same batch size and width), in their order.
        A client whose hook raises goes to ``on_error``, which stops the run (raises) or
        returns: the client then yields None and, with ``snapshot``, keeps the state it had."""
        trainer, flat = self.trainer, self.trainer.flat
        members = [
            _Member(task, data, state, rng, i)
            for i, (task, data, state, rng) in enumerate(zip(tasks, datas, states, rngs, strict=True))
        ]
        members.sort(key=lambda m: -m.task.local_steps)  # stable: the working clients come first
        width = members[0].task.coverage.width
        size = min(members[0].task.batch_size, len(members[0].data))
        mask = trainer.masks(width) if width != 1.0 else None
        count, num_params = len(members), params.numel()
        kept = {id(m): {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in m.state.items()}
                for m in members} if snapshot else {}  # fmt: skip
        rows = params.detach().unsqueeze(0).repeat(count, 1)
        if mask is not None:
            rows.mul_(mask)
        low = min(m.task.coverage.depth for m in members)
        starts = [flat.param_slices.start(m.task.coverage.depth) for m in members]
        keep = None  # rows' gradient masks: nothing below each client's own depth, its sub-model
        if any(start > flat.param_slices.start(low) for start in starts) or mask is not None:
            keep = torch.ones(count, num_params, dtype=params.dtype, device=params.device)
            for i, start in enumerate(starts):
                keep[i, :start] = 0.0
            if mask is not None:
                keep.mul_(mask)
        lrs = torch.tensor([m.task.lr for m in members], dtype=params.dtype, device=params.device)
        optimizer = trainer.optimizer
        plain = optimizer.plain
        rows_sgd = None if plain or type(optimizer) is not SGD else _RowsSGD(optimizer, members, starts, rows)
        optimizers = [copy.copy(optimizer) for _ in members]
        if rows_sgd is None:
            for m, own in zip(members, optimizers, strict=True):
                own.begin(Namespace(m.state, OPTIMIZER), num_params)
        steps = max(m.task.local_steps for m in members)
        losses = torch.full((count, steps), float("nan"), dtype=params.dtype, device=params.device)
        corrects = rule is not None and rule.corrects_gradients
        gradient = torch.func.vmap(torch.func.grad(self._loss, has_aux=True), in_dims=(0, 0, 0, None))
        hooks = (
            scaler_hooks(flat.model, width)
            if mask is not None and (rule is None or rule.scales_sub_models)
            else []
        )
        x_all, y_all = members[0].data.x, members[0].data.y
        flat.model.train()
        try:
            for step in range(steps):
                active = sum(1 for m in members if m.task.local_steps > step)
                chosen = np.concatenate([members[i].data.draw(members[i].rng, size) for i in range(active)])
                index = torch.from_numpy(chosen).to(x_all.device)
                x = x_all[index].view(active, size, *x_all.shape[1:])
                y = y_all[index].view(active, size, *y_all.shape[1:])
                grads, values = gradient(rows[:active], x, y, low)
                losses[:active, step] = values
                if keep is not None:
                    grads.mul_(keep[:active])
                for i in range(active):
                    m = members[i]
                    if m.failed:
                        continue
                    region = flat.param_slices.from_depth(m.task.coverage.depth)
                    try:
                        if corrects:
                            part = Namespace(m.state, ALGORITHM)
                            correction = rule.gradient_correction(m.task, part, region, rows[i], params)
                            if correction is not None:
                                grads[i, region].add_(correction)
                        if not plain and rows_sgd is None:
                            optimizers[i].step(rows[i, region], grads[i, region], m.task.lr, region)
                    except Exception as exc:  # noqa: BLE001  (a rule's or optimizer's bug)
                        self._fail(m, exc, kept, on_error)
                if rows_sgd is not None:
                    rows_sgd.step(rows[:active], grads, lrs[:active])
                elif plain:
                    rows[:active].sub_(grads * lrs[:active, None])
        finally:
            for handle in hooks:
                handle.remove()
        step_losses = losses.cpu()
        out: list[ClientUpdate | None] = [None] * count
        for i, m in enumerate(members):
            if m.failed:
                continue
            if rows_sgd is not None:
                rows_sgd.end(i, m.state)
            try:
                out[m.position] = self._finish(
                    m,
                    rows[i],
                    params,
                    buffers,
                    step_losses[i],
                    None if rows_sgd else optimizers[i],
                    rule,
                    mask,
                )
            except Exception as exc:  # noqa: BLE001
                self._fail(m, exc, kept, on_error)
        return out

    def _finish(self, m: _Member, row, params, buffers, losses, optimizer, rule, mask) -> ClientUpdate:
        """One client's update from its row: the delta over its covered elements, the rule's
        ``finish_local_work``, the optimizer's kept state, the postprocessors."""
        trainer, flat, task = self.trainer, self.trainer.flat, m.task
        region = flat.param_slices.from_depth(task.coverage.depth)
        if optimizer is not None:  # None: the rows' SGD kept its state already
            optimizer.end(Namespace(m.state, OPTIMIZER))
        with torch.no_grad():
            delta = row[region] - params[region]
            if mask is not None:
                delta.mul_(mask)
        update = ClientUpdate(
            client=task.client,
            coverage=task.coverage,
            steps=task.local_steps,
            num_samples=len(m.data),
            loss=float(losses[: task.local_steps].double().mean()),
            delta=delta,
            delta_buffers=buffers.new_zeros(0),
            model_round=task.model_round,
        )
        if rule is not None:
            with torch.no_grad():
                rule.finish_local_work(task, update, Namespace(m.state, ALGORITHM), region, row, params)
        return trainer.finish(task, update, m.state, m.rng, rule)

    @staticmethod
    def _fail(m: _Member, exc: BaseException, kept: dict, on_error: OnError | None) -> None:
        """A client's hook raised: stop the run (``on_error`` raises), or leave the client
        out with the state it had."""
        if on_error is None or isinstance(exc, FedhetError):  # already one line
            raise exc
        on_error(m.task, exc)
        m.failed = True
        if id(m) in kept:
            m.state.clear()
            m.state.update(kept[id(m)])


class _RowsSGD:
    """:class:`~fedhet.client.optimizers.SGD` with momentum or weight decay stepping every row
    at once: the same arithmetic as its ``step`` on each client's region (layers ``depth..L``),
    with each client's momentum buffer (kept in its state, or new) as one row of a matrix."""

    def __init__(self, optimizer: SGD, members: list[_Member], starts: list[int], rows: torch.Tensor):
        self.momentum, self.weight_decay = optimizer.momentum, optimizer.weight_decay
        self.keep = bool(optimizer.momentum and optimizer.keep_momentum)
        columns = torch.arange(rows.shape[1], device=rows.device)
        self.region = columns.unsqueeze(0) >= torch.tensor(starts, device=rows.device).unsqueeze(1)
        self.buffers = torch.zeros_like(rows) if self.momentum else None
        if self.buffers is not None and self.keep:
            for i, m in enumerate(members):
                saved = Namespace(m.state, OPTIMIZER).get(SGD.STATE_KEY)
                if saved is not None:
                    self.buffers[i] = saved.to(rows.device)

    def step(self, rows: torch.Tensor, grads: torch.Tensor, lrs: torch.Tensor) -> None:
        """One step of the first ``len(rows)`` clients (the ones still working)."""
        region = self.region[: len(rows)]
        if self.weight_decay:  # L2 on the region's values
            grads.add_(torch.where(region, rows, 0.0), alpha=self.weight_decay)
        direction = grads
        if self.buffers is not None:  # buf = m buf + g on the region; elsewhere kept
            buffers = self.buffers[: len(rows)]
            buffers.copy_(torch.where(region, buffers * self.momentum + grads, buffers))
            direction = torch.where(region, buffers, 0.0)
        rows.sub_(direction * lrs[:, None])

    def end(self, i: int, state: ClientState) -> None:
        """Client ``i``'s momentum buffer into its state (``keep_momentum``)."""
        if self.keep and self.buffers is not None:
            Namespace(state, OPTIMIZER)[SGD.STATE_KEY] = self.buffers[i].clone()
