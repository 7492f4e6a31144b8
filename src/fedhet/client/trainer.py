"""The local trainer: a :class:`~fedhet.messages.ClientTask` in, a
:class:`~fedhet.messages.ClientUpdate` out, composed of declared pieces:

- a :class:`~fedhet.client.coverage.CoverageView` (the layers and width the task covers);
- a :class:`~fedhet.client.budget.SimulatedBudget` or
  :class:`~fedhet.client.budget.WallClockBudget` (how much work: given by the system side);
- the algorithm's gradient transform (FedProx's proximal term, SCAFFOLD's control variates,
  FedDyn's linear term: :meth:`Algorithm.gradient_correction`), added to each step's gradient;
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

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.client.budget import SimulatedBudget, WallClockBudget, timed_first_step
from fedhet.client.coverage import CoverageView, WidthMasks
from fedhet.client.gradients import gradients
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
from fedhet.data.task import Classification, Task
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models.layers import FlatModel


@dataclass
class _LocalRun:
    """One task's local work in progress: what its steps read."""

    task: ClientTask
    params: torch.Tensor
    data: ClientData
    state: Namespace  # the algorithm's part of the client's state
    rng: np.random.Generator
    rule: ClientRule | None
    view: CoverageView
    budget: SimulatedBudget | WallClockBudget
    depth: int


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
        self.objective = objective or Classification()  # the dataset's task: its training loss
        self.optimizer = optimizer or SGD()
        self.postprocessors = list(postprocessors or [])
        self.namespaces = component_names([step.name for step in self.postprocessors])
        self.masks = WidthMasks(flat)
        self.slowdown = 1.0  # wall-clock tasks: this device runs `slowdown` times slower
        self.layer_delay = 0.0  # wall-clock tasks: extra seconds per layer back-propagated
        self._warm = False

    @property
    def num_layers(self) -> int:
        return self.flat.num_layers

    def payload_bytes(self, depth: int = 1, rule: ClientRule | None = None) -> int:
        """Bytes a full-width update covering layers ``depth..L`` has on the wire: its
        float32 parameters, the payload vectors the ``rule`` sends with it
        (:meth:`~fedhet.algorithms.base.Algorithm.upload_payload`), both after the
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
        """Do ``task`` (``"train"`` or ``"probe"``) for the client owning ``data``."""
        if task.kind == "probe":
            return self.probe(task, params, buffers, data, rng)
        if task.kind != "train":
            raise ValueError(f"unknown task kind {task.kind!r}")
        update = self.train(task, params, buffers, data, state, rng, rule)
        return self.finish(task, update, state, rng, rule)

    def finish(
        self,
        task: ClientTask,
        update: ClientUpdate,
        state: ClientState,
        rng: np.random.Generator,
        rule: ClientRule | None = None,
    ) -> ClientUpdate:
        """After the local steps: the payload vectors the rule sends with the update, then the
        postprocessor chain (its random draws from the client's stream, after training's);
        the client's state checked."""
        if rule is not None and update.steps > 0:
            update.wire = tuple(rule.upload_payload(int(update.delta.numel())))
        if self.postprocessors and update.steps > 0:
            generator = generator_for(rng)
            for step, name in zip(self.postprocessors, self.namespaces, strict=True):
                update = step.process(update, Namespace(state, name), generator)
        check_serialisable(state, task.client)
        return update

    def budget_for(self, task: ClientTask) -> SimulatedBudget | WallClockBudget:
        """The work budget the system side gave the task: its steps and depth on the virtual
        clock, or real seconds (``task.time_limit``)."""
        if task.time_limit:
            return WallClockBudget(task.time_limit, self.slowdown, self.layer_delay)
        return SimulatedBudget(task.local_steps, task.coverage.depth)

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
        """``task.local_steps`` optimizer steps on the covered layers ``depth..L`` within the
        task's budget. Each step draws a batch of ``task.batch_size`` examples without
        replacement from the client's data; the gradient gets the rule's correction, then
        the optimizer's step."""
        if task.coverage.width != 1.0 and (task.coverage.depth != 1 or task.time_limit):
            raise ValueError("a width-reduced sub-model trains every layer on the simulated clock")
        if task.time_limit and rule is not None and rule.customises_loss:
            raise ValueError("a rule with its own local loss trains on the simulated clock")
        flat = self.flat
        budget, depth, first = self._begin(task, params, buffers, data, rng)
        coverage = Coverage(depth, task.coverage.width) if budget.timed else task.coverage
        if depth > flat.num_layers or task.local_steps <= 0:
            return ClientUpdate(
                task.client,
                coverage,
                0,
                len(data),
                float("nan"),
                params.new_zeros(0),
                model_round=task.model_round,
            )
        if first is None:
            flat.load(params, buffers)
        flat.model.train()
        scale = rule is None or rule.scales_sub_models
        view = CoverageView(flat, depth, task.coverage.width, self.masks, scale=scale)
        view.enter()
        own, optimizer_state = Namespace(state, ALGORITHM), Namespace(state, OPTIMIZER)
        self.optimizer.begin(optimizer_state, flat.params.numel())
        run = _LocalRun(task, params, data, own, rng, rule, view, budget, depth)
        losses = self._steps(run, first)
        view.exit()
        self.optimizer.end(optimizer_state)
        delta, delta_buffers = view.deltas(params, buffers)
        update = ClientUpdate(
            client=task.client,
            coverage=coverage,
            steps=len(losses),
            num_samples=len(data),
            loss=float(np.mean(losses)),
            delta=delta,
            delta_buffers=delta_buffers,
            model_round=task.model_round,
        )
        if rule is not None:
            with torch.no_grad():
                rule.finish_local_work(task, update, own, view.param_slice, flat.params, params)
        return update

    def _begin(self, task, params, buffers, data, rng):
        """The task's work budget, the depth it starts from and, for a wall-clock task, its
        first step, timed layer by layer (None on the simulated clock)."""
        flat, depth = self.flat, task.coverage.depth
        if not (task.time_limit and depth <= flat.num_layers and task.local_steps > 0):
            return self.budget_for(task), depth, None
        x, y = data.batch(rng, task.batch_size)
        self._warm_up(x, y)
        flat.load(params, buffers)  # after the warm-up, which may touch BatchNorm statistics
        flat.model.train()
        budget = self.budget_for(task)  # the device's time starts now, warmed up
        depth, first = timed_first_step(flat.model, x, y, depth, budget, self.objective.loss)
        return budget, depth, None if first is None else (*first, x, y)

    def _steps(self, run: _LocalRun, first) -> list[float]:
        """The local steps the budget allows; their losses."""
        flat, task, view = self.flat, run.task, run.view
        rule = run.rule
        track = rule is not None and rule.tracks_gradient_differences
        corrects = rule is not None and rule.corrects_gradients
        custom = rule is not None and rule.customises_loss
        plain = view.mask is None and not track and not corrects and self.optimizer.plain
        losses: list[float] = []
        x = y = None
        for step in range(task.local_steps):
            if step == 0 and first is not None:  # the timed step already ran, on batch (x, y)
                loss, grads, x, y = first
            else:
                if not run.budget.allows_another_step():
                    break
                x, y = run.data.batch(run.rng, task.batch_size)
                if custom and rule is not None:  # the rule's own loss (FjORD)
                    loss = rule.local_loss(
                        task, run.state, flat.model, x, y, run.depth, self.objective.loss, run.rng
                    )
                else:
                    loss = self.objective.loss(flat.model(x, run.depth), y)
                grads = gradients(loss, view.reached)
                run.budget.step_done(flat.num_layers + 1 - run.depth)
            losses.append(float(loss.detach()))
            if plain:  # w <- w - lr g on the reached parameters, in place: no flat copy of g
                with torch.no_grad():
                    for parameter, g in zip(view.reached, grads, strict=True):
                        parameter.sub_(g, alpha=task.lr)
                continue
            with torch.no_grad():
                grad = view.restrict(torch.cat([g.reshape(-1) for g in grads]))
            if track:
                self._observe(run, grad, x, y, own=len(losses) == 1 and first is None)
            with torch.no_grad():
                if corrects and rule is not None:  # the algorithm's gradient transform
                    correction = rule.gradient_correction(
                        task, run.state, view.param_slice, flat.params, run.params
                    )
                    if correction is not None:
                        grad.add_(correction)
                self.optimizer.step(view.region, grad, task.lr, view.param_slice)
        return losses

    def _observe(self, run: _LocalRun, grad: torch.Tensor, x, y, own: bool) -> None:
        """AMSFL's gradient differences: the step's gradient beside the gradient at the
        received model on the same batch (step 1 starts there: its own gradient is it)."""
        view, pslice = run.view, run.view.param_slice
        if own:
            anchor_grad = grad.clone()
        else:
            anchor_grad = self._gradient_at(run.params[pslice], x, y, run.depth, view.reached, pslice)
        with torch.no_grad():
            distance = float((view.region - run.params[pslice]).norm())
        if run.rule is not None:
            run.rule.observe_gradients(run.task, run.state, grad, anchor_grad, distance)

    def _warm_up(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Once per process, before the first timed task: autograd's first calls are slow
        (a fresh process pays a quarter of a second), which is no property of the device."""
        if self._warm:
            return
        self.flat.model.train()
        timed_first_step(self.flat.model, x[:2], y[:2], 1, WallClockBudget(60.0), self.objective.loss)
        self._warm = True

    def _gradient_at(
        self, point: torch.Tensor, x: torch.Tensor, y: torch.Tensor, depth: int, reached: list, pslice: slice
    ) -> torch.Tensor:
        """The gradient over the covered layers at ``point`` (their values) on the batch
        (x, y), leaving the working model's parameters and buffers as they were."""
        flat = self.flat
        with torch.no_grad():
            saved_params = flat.params[pslice].clone()
            saved_buffers = flat.buffers.clone()
            flat.params[pslice].copy_(point)
        loss = self.objective.loss(flat.model(x, depth), y)
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
