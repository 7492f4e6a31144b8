"""Client work: a :class:`~fedhet.messages.ClientTask` in, a
:class:`~fedhet.messages.ClientUpdate` out, with truly truncated back-propagation.

A client computes from its task, the global parameters it was sent, its own data
(:class:`ClientData`), its own state (a dict of tensors from :class:`ClientStates`) and its
own random stream, and nothing else. The algorithm's client-side rule enters through hooks
(:class:`ClientRule`): a correction added to every step's gradient (FedProx's proximal
term, SCAFFOLD's control variates, FedDyn's linear term), a step after the local work that
updates the client's state and fills the update's payload, and, for rules that set
``tracks_gradient_differences``, each step's gradient beside the gradient at the received
model on the same batch (AMSFL's gradient difference approximation; it costs one more
backward pass per step on the host, not on the simulated clock).

One working model (a :class:`~fedhet.models.FlatModel`) serves every client: it is reloaded
from the global vectors in place before each client's work (DESIGN idea 5). A client with
coverage depth d trains layers d..L only: the forward pass runs layers below d without a
graph (:meth:`LayeredModel.forward`), ``torch.autograd.grad`` is asked for the reached
layers' parameters only, and the SGD step touches only their flat region, so unreached layers
get no gradient, cost no backward compute and do not move (SALF Sec. III-A).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.layers import FlatModel

ClientState = dict[str, torch.Tensor]


@dataclass
class ClientData:
    """One client's examples: its index array into the shared training tensors (no copy)."""

    x: torch.Tensor
    y: torch.Tensor
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def batch(self, rng: np.random.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` examples drawn without replacement (all of them when fewer)."""
        chosen = self.indices[rng.choice(len(self.indices), size=min(size, len(self.indices)), replace=False)]
        return self.x[chosen], self.y[chosen]


class ClientStates:
    """Every client's own state (momentum buffers, SCAFFOLD's c_i, FedDyn's g_i, ...), kept
    between rounds and checkpointed with the run. A client sees only its own entry."""

    def __init__(self) -> None:
        self._states: dict[int, ClientState] = {}

    def of(self, client: int) -> ClientState:
        """Client ``client``'s state (created empty on first use)."""
        return self._states.setdefault(int(client), {})

    def state_dict(self) -> dict[int, ClientState]:
        return self._states

    def load_state_dict(self, states: dict[int, ClientState]) -> None:
        self._states = {int(k): dict(v) for k, v in states.items()}


class ClientRule(Protocol):
    """The client-side hooks of an algorithm (see :class:`fedhet.algorithms.Algorithm`)."""

    def gradient_correction(
        self, task: ClientTask, state: ClientState, region: slice, local: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor | None: ...

    def finish_local_work(
        self,
        task: ClientTask,
        update: ClientUpdate,
        state: ClientState,
        region: slice,
        local: torch.Tensor,
        anchor: torch.Tensor,
    ) -> None: ...

    def observe_gradients(
        self,
        task: ClientTask,
        state: ClientState,
        local_grad: torch.Tensor,
        anchor_grad: torch.Tensor,
        distance: float,
    ) -> None: ...


@dataclass
class SGDSettings:
    """Plain minibatch SGD (PyTorch's conventions for momentum and weight decay)."""

    momentum: float = 0.0
    weight_decay: float = 0.0
    keep_momentum: bool = False  # per-client momentum buffers kept across rounds (client state)


class LocalWorker:
    """Runs client tasks on one reused working model."""

    def __init__(self, flat: FlatModel, sgd: SGDSettings | None = None):
        self.flat = flat
        self.sgd = sgd or SGDSettings()

    @property
    def num_layers(self) -> int:
        return self.flat.num_layers

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
        """Do ``task`` (``"train"`` or ``"probe"``) for the client owning ``data``."""
        if task.kind == "probe":
            return self.probe(task, params, buffers, data, rng)
        if task.kind != "train":
            raise ValueError(f"unknown task kind {task.kind!r}")
        return self.train(task, params, buffers, data, state, rng, rule)

    def train(
        self,
        task: ClientTask,
        params: torch.Tensor,
        buffers: torch.Tensor,
        data: ClientData,
        state: ClientState,
        rng: np.random.Generator,
        rule: ClientRule | None = None,
    ) -> ClientUpdate:
        """``task.local_steps`` SGD steps on the covered layers ``depth..L``.

        Each step draws a batch of ``task.batch_size`` examples without replacement from the
        client's data; the gradient gets the rule's correction before weight decay and
        momentum."""
        if task.coverage.width != 1.0:
            raise NotImplementedError("sub-models of a reduced width are not supported yet")
        depth, steps = task.coverage.depth, task.local_steps
        flat = self.flat
        pslice = flat.param_slices.from_depth(depth)
        bslice = flat.buffer_slices.from_depth(depth)
        n = len(data)
        if depth > flat.num_layers or steps <= 0:
            return ClientUpdate(
                task.client, task.coverage, 0, n, float("nan"), torch.zeros(0), model_round=task.model_round
            )
        flat.load(params, buffers)
        model = flat.model
        model.train()
        reached = flat.parameters_from_depth(depth)
        region = flat.params[pslice]
        buf = state.get("momentum") if (self.sgd.momentum and self.sgd.keep_momentum) else None
        track = rule is not None and getattr(rule, "tracks_gradient_differences", False)
        losses = []
        for _ in range(steps):
            x, y = data.batch(rng, task.batch_size)
            loss = F.cross_entropy(model(x, depth), y)
            grads = torch.autograd.grad(loss, reached)
            losses.append(float(loss.detach()))
            with torch.no_grad():
                grad = torch.cat([g.reshape(-1) for g in grads])
            if track:
                anchor_grad = self._gradient_at(params[pslice], buffers, x, y, depth, reached, pslice)
                with torch.no_grad():
                    distance = float((region - params[pslice]).norm())
                rule.observe_gradients(task, state, grad, anchor_grad, distance)
            with torch.no_grad():
                if rule is not None:
                    correction = rule.gradient_correction(task, state, pslice, flat.params, params)
                    if correction is not None:
                        grad.add_(correction)
                if self.sgd.weight_decay:
                    grad.add_(region, alpha=self.sgd.weight_decay)
                if self.sgd.momentum:
                    if buf is None:
                        buf = torch.zeros_like(flat.params)
                        buf[pslice] = grad
                    else:
                        buf[pslice].mul_(self.sgd.momentum).add_(grad)
                    grad = buf[pslice]
                region.sub_(grad, alpha=task.lr)
        if buf is not None and self.sgd.keep_momentum:
            state["momentum"] = buf
        with torch.no_grad():
            update = ClientUpdate(
                client=task.client,
                coverage=task.coverage,
                steps=steps,
                num_samples=n,
                loss=float(np.mean(losses)),
                delta=region - params[pslice],
                delta_buffers=flat.buffers[bslice] - buffers[bslice],
                model_round=task.model_round,
            )
            if rule is not None:
                rule.finish_local_work(task, update, state, pslice, flat.params, params)
        return update

    def _gradient_at(
        self,
        point: torch.Tensor,
        buffers: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        depth: int,
        reached: list,
        pslice: slice,
    ) -> torch.Tensor:
        """The gradient over the covered layers at ``point`` (their values) on the batch
        (x, y), leaving the working model's parameters and buffers as they were."""
        flat = self.flat
        with torch.no_grad():
            saved_params = flat.params[pslice].clone()
            saved_buffers = flat.buffers.clone()
            flat.params[pslice].copy_(point)
        loss = F.cross_entropy(flat.model(x, depth), y)
        grads = torch.autograd.grad(loss, reached)
        with torch.no_grad():
            flat.params[pslice].copy_(saved_params)
            flat.buffers.copy_(saved_buffers)
            return torch.cat([g.reshape(-1) for g in grads])

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
            loss = F.cross_entropy(flat.model(x), y)
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
            delta=torch.zeros(0),
            model_round=task.model_round,
            payload={"grad_sq_norm": mean_sq_norm, "grad_variance": size * variance},
        )


@torch.no_grad()
def evaluate(
    flat: FlatModel,
    params: torch.Tensor,
    buffers: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 2048,
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of the model ``(params, buffers)`` on ``(x, y)``."""
    flat.load(params, buffers)
    model = flat.model
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        out = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        total_loss += float(F.cross_entropy(out, target, reduction="sum"))
        correct += int((out.argmax(1) == target).sum())
    return total_loss / len(y), correct / len(y)
