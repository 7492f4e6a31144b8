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

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.layers import FlatModel
from fedhet.models.width import scaler_hooks, width_mask

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
    """The client-side hooks of an algorithm (see :class:`fedhet.algorithms.Algorithm`).
    ``corrects_gradients`` is False when :meth:`gradient_correction` always returns None."""

    corrects_gradients: bool

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
        self.slowdown = 1.0  # wall-clock tasks: this device runs `slowdown` times slower
        self.layer_delay = 0.0  # wall-clock tasks: extra seconds per layer back-propagated

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
        rate = task.coverage.width
        if rate != 1.0 and (task.coverage.depth != 1 or task.time_limit):
            raise ValueError("a width-reduced sub-model trains every layer on the simulated clock")
        depth, steps = task.coverage.depth, task.local_steps
        flat = self.flat
        n = len(data)
        clock = None
        first = None
        if task.time_limit and depth <= flat.num_layers and steps > 0:
            x, y = data.batch(rng, task.batch_size)
            self._warm_up(x, y)
            flat.load(params, buffers)  # after the warm-up, which may touch BatchNorm statistics
            flat.model.train()
            clock = WallClockBudget(task.time_limit, self.slowdown, self.layer_delay)
            depth, first = timed_first_step(flat.model, x, y, depth, clock)
        coverage = task.coverage if clock is None else Coverage(depth, task.coverage.width)
        pslice = flat.param_slices.from_depth(depth)
        bslice = flat.buffer_slices.from_depth(depth)
        if depth > flat.num_layers or steps <= 0:
            return ClientUpdate(
                task.client, coverage, 0, n, float("nan"), torch.zeros(0), model_round=task.model_round
            )
        if first is None:
            flat.load(params, buffers)
        model = flat.model
        model.train()
        mask, hooks = None, []
        if rate != 1.0:  # HeteroFL: the sub-model's elements only, hidden outputs scaled by 1/r
            mask = self.width_mask(rate)
            with torch.no_grad():
                flat.params.mul_(mask)
            hooks = scaler_hooks(model, rate)
        reached = flat.parameters_from_depth(depth)
        region = flat.params[pslice]
        buf = state.get("momentum") if (self.sgd.momentum and self.sgd.keep_momentum) else None
        track = rule is not None and getattr(rule, "tracks_gradient_differences", False)
        plain = (  # plain SGD: the same update as the general path, without its copies
            mask is None
            and not track
            and not self.sgd.weight_decay
            and not self.sgd.momentum
            and (rule is None or not getattr(rule, "corrects_gradients", True))
        )
        losses = []
        done = 0
        for step in range(steps):
            if step == 0 and first is not None:  # the timed step already ran
                loss, grads = first
            else:
                if clock is not None and not clock.fits_another_step():
                    break
                x, y = data.batch(rng, task.batch_size)
                loss = F.cross_entropy(model(x, depth), y)
                grads = gradients(loss, reached)
                if clock is not None:
                    clock.step_done(flat.num_layers + 1 - depth)
            done += 1
            losses.append(float(loss.detach()))
            if plain:  # w <- w - lr g on the reached parameters, in place: no flat copy of g
                with torch.no_grad():
                    for parameter, g in zip(reached, grads, strict=True):
                        parameter.sub_(g, alpha=task.lr)
                continue
            with torch.no_grad():
                grad = torch.cat([g.reshape(-1) for g in grads])
                if mask is not None:
                    grad.mul_(mask)
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
        for handle in hooks:
            handle.remove()
        if buf is not None and self.sgd.keep_momentum:
            state["momentum"] = buf
        with torch.no_grad():
            delta = region - params[pslice]
            if mask is not None:
                delta.mul_(mask)  # elements outside the sub-model are not the client's
            update = ClientUpdate(
                client=task.client,
                coverage=coverage,
                steps=done,
                num_samples=n,
                loss=float(np.mean(losses)),
                delta=delta,
                delta_buffers=flat.buffers[bslice] - buffers[bslice],
                model_round=task.model_round,
            )
            if rule is not None:
                rule.finish_local_work(task, update, state, pslice, flat.params, params)
        return update

    def width_mask(self, rate: float) -> torch.Tensor:
        """The flat parameters a sub-model of ``rate`` holds (cached per rate)."""
        cache = self.__dict__.setdefault("_width_masks", {})
        if rate not in cache:
            cache[rate] = width_mask(self.flat.layout, rate)
        return cache[rate]

    def _warm_up(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Once per process, before the first timed task: autograd's first calls are slow
        (a fresh process pays a quarter of a second), which is no property of the device."""
        if getattr(self, "_warm", False):
            return
        self.flat.model.train()
        timed_first_step(self.flat.model, x[:2], y[:2], 1, WallClockBudget(60.0))
        self._warm = True

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


def gradients(loss: torch.Tensor, parameters: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """d loss / d parameters, and nothing below them. ``backward(inputs=...)`` rather than
    ``torch.autograd.grad``: the same gradients, about 10% faster per step on pfl-research's
    benchmark CNN (PyTorch 2.13, CPU, timed per step). The parameters' ``.grad`` are left unset."""
    for parameter in parameters:
        parameter.grad = None
    loss.backward(inputs=parameters)
    grads = [parameter.grad for parameter in parameters]
    for parameter in parameters:
        parameter.grad = None
    return grads


@torch.no_grad()
def evaluate(
    flat: FlatModel,
    params: torch.Tensor,
    buffers: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 256,
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of the model ``(params, buffers)`` on ``(x, y)``.

    Batches of 256 keep a small CNN's activations in the CPU's cache: evaluating cnn2 on
    10,000 images took 3x less time than in batches of 2048 (benchmarks/evaluation.py)."""
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


class WallClockBudget:
    """A wall-clock task's time: started now, ``limit`` seconds to deliver; on a device
    ``slowdown`` times slower than this host (each measured piece of work is followed by a
    sleep of ``slowdown - 1`` times its duration) plus ``layer_delay`` seconds per layer
    back-propagated."""

    def __init__(self, limit: float, slowdown: float = 1.0, layer_delay: float = 0.0):
        self.limit, self.slowdown, self.layer_delay = float(limit), float(slowdown), float(layer_delay)
        self.start = time.perf_counter()
        self.mark = self.start
        self.last_step = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def spend(self, seconds: float, layers: int = 1) -> float:
        """Make ``seconds`` of measured work last as long as on the slow device; returns the
        device time it took."""
        extra = (self.slowdown - 1.0) * seconds + self.layer_delay * layers
        if extra > 0:
            time.sleep(extra)
        return seconds + max(extra, 0.0)

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.limit

    def step_done(self, layers: int) -> None:
        now = time.perf_counter()
        self.spend(now - self.mark, layers)
        end = time.perf_counter()
        self.last_step, self.mark = end - self.mark, end

    def fits_another_step(self) -> bool:
        self.mark = time.perf_counter()
        return self.fits(self.last_step)


def timed_first_step(model, x: torch.Tensor, y: torch.Tensor, depth: int, clock: WallClockBudget):
    """One local step back-propagated layer by layer from the output, timing each layer and
    stopping before the deadline would pass (SALF on real hardware): returns the layer
    reached (``L + 1`` if not even the output layer fits) and ``(loss, gradients of the
    reached layers' parameters)`` or None.

    The forward pass runs block by block with each block's input detached, so that each
    layer's backward is its own ``autograd.grad`` call whose time is measured; a layer is
    started only if the time left covers its predicted time (the previous layer's measured
    backward time scaled by the two layers' forward times; the first from its forward time)."""
    blocks = model.blocks
    num_layers = len(blocks)
    with torch.no_grad():
        for block in blocks[: depth - 1]:
            x = block(x)
    inputs, outputs, forward_times = [], [], []
    h = x.detach()
    for index, block in enumerate(blocks[depth - 1 :]):
        start = time.perf_counter()
        inp = h.detach().requires_grad_(index > 0)
        out = block(inp)
        forward_times.append(clock.spend(time.perf_counter() - start, 0))
        inputs.append(inp)
        outputs.append(out)
        h = out
    loss = F.cross_entropy(h, y)
    grad_out = torch.autograd.grad(loss, outputs[-1])[0]
    per_layer: dict[int, tuple] = {}
    estimate = 2.0 * forward_times[-1] + clock.layer_delay
    reached = num_layers + 1
    for index in reversed(range(len(outputs))):
        layer = depth + index
        if not clock.fits(estimate):
            break
        params = list(blocks[layer - 1].parameters())
        wanted = params + ([inputs[index]] if index > 0 else [])
        start = time.perf_counter()
        results = torch.autograd.grad(outputs[index], wanted, grad_outputs=grad_out)
        took = clock.spend(time.perf_counter() - start)
        per_layer[layer] = results[: len(params)]
        reached = layer
        if index > 0:
            grad_out = results[-1]
            ratio = forward_times[index - 1] / max(forward_times[index], 1e-9)
            estimate = (took - clock.layer_delay) * ratio + clock.layer_delay
    clock.mark, clock.last_step = time.perf_counter(), clock.elapsed()
    if reached > num_layers:
        return reached, None
    grads = tuple(g for layer in range(reached, num_layers + 1) for g in per_layer[layer])
    return reached, (loss, grads)
