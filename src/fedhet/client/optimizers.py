"""Local optimizers, in the manner of ``torch.optim``: plain state, a ``step`` that updates
the covered parameters in place, and a ``state_dict`` that lives in the client's own state
(:mod:`fedhet.client.state`), so that an optimizer kept across rounds (momentum, Adam's
moments) is checkpointed and resumed with the run.

Each optimizer is a ``local_optimizer`` plug-in (:mod:`fedhet.registry`): ``[train]
optimizer = "sgd"`` (default) or ``"adam"``, with its options in ``[train]``.

The step works on the flat region of the covered layers: ``region`` (a view of the working
model's flat parameters), ``grad`` (the gradient over the same elements, after the
algorithm's gradient transforms) and ``where`` (the slice of the region in the full flat
vector, for state kept over the whole model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedhet.checks import in_range
from fedhet.client.state import ComponentState
from fedhet.errors import ConfigError
from fedhet.registry import register


class LocalOptimizer:
    """Base of local optimizers. One optimizer steps a *group* of clients at once (a group of
    one in the in-process pool): their covered regions are the rows of a matrix, their state
    (momentum, Adam's moments) one row each, read from and kept in each client's state.

    :meth:`begin` starts a group's task; :meth:`step` updates ``regions`` (k x m: the first k
    clients still working, their covered elements ``where`` of the flat vector) in place
    from ``grads`` (same shape, after the rule's gradient transforms); :meth:`end` keeps
    what must survive the round in each client's state. ``plain`` says the step is
    w <- w - lr g exactly."""

    name = "base"

    @property
    def plain(self) -> bool:
        """Whether a step is w <- w - lr g and nothing else."""
        return False

    def begin(self, states: Sequence[ComponentState], size: int, device: torch.device | None = None) -> None:
        """Start a task for the clients with ``states`` (one row each, in group order);
        ``size`` = the full flat parameter count."""

    def step(self, regions: torch.Tensor, grads: torch.Tensor, lr: float, where: slice) -> None:
        """One step of the first ``len(regions)`` clients of the group, in place."""
        raise NotImplementedError

    def end(self, states: Sequence[ComponentState]) -> None:
        """After the task: keep each client's row of state in its ``states`` entry."""


@dataclass
class SGDOptions:
    """``momentum`` (PyTorch's convention: buf = m buf + g), ``weight_decay`` (L2 added to
    the gradient), ``keep_momentum``: keep each client's momentum buffer across rounds
    (otherwise it restarts every round)."""

    momentum: float = 0.0
    weight_decay: float = 0.0
    keep_momentum: bool = False

    def validate(self) -> None:
        in_range("train.momentum", self.momentum, 0.0, 1.0, high_open=True)
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay = {self.weight_decay}: must be >= 0")


@register("local_optimizer")
class SGD(LocalOptimizer):
    """Minibatch SGD with optional momentum and weight decay (PyTorch's conventions)."""

    name = "sgd"
    Options = SGDOptions

    STATE_KEY = "momentum"

    def __init__(self, momentum: float = 0.0, weight_decay: float = 0.0, keep_momentum: bool = False):
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.keep_momentum = bool(keep_momentum)
        self.buffers: torch.Tensor | None = None  # clients x parameters, while a group trains

    @classmethod
    def build(cls, options: SGDOptions, ctx=None) -> SGD:
        return cls(options.momentum, options.weight_decay, options.keep_momentum)

    @property
    def plain(self) -> bool:
        return not self.momentum and not self.weight_decay

    def begin(self, states: Sequence[ComponentState], size: int, device: torch.device | None = None) -> None:
        self.buffers = None
        if self.momentum:  # one row per client: its kept buffer, or zeros (a fresh start)
            self.buffers = torch.zeros(len(states), size, device=device)
            if self.keep_momentum:
                for row, state in zip(self.buffers, states, strict=True):
                    saved = state.get(self.STATE_KEY)
                    if saved is not None:
                        row.copy_(saved)

    def step(self, regions: torch.Tensor, grads: torch.Tensor, lr: float, where: slice) -> None:
        """w <- w - lr (m buf + g + wd w) over each row's region (PyTorch's SGD)."""
        if self.weight_decay:
            grads.add_(regions, alpha=self.weight_decay)
        if self.buffers is not None:
            buffers = self.buffers[: len(regions), where]
            buffers.mul_(self.momentum).add_(grads)
            grads = buffers
        regions.sub_(grads, alpha=lr)

    def end(self, states: Sequence[ComponentState]) -> None:
        if self.buffers is not None and self.keep_momentum:
            for row, state in zip(self.buffers, states, strict=True):
                state[self.STATE_KEY] = row.clone()
        self.buffers = None


@dataclass
class AdamOptions:
    """Adam (Kingma & Ba, arXiv:1412.6980, Algorithm 1): ``beta1``, ``beta2``, ``eps``;
    ``weight_decay`` as L2 added to the gradient (``torch.optim.Adam``'s convention);
    ``keep_state``: keep each client's moments and step count across rounds (otherwise Adam
    restarts every round, as a stateless client would)."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    keep_state: bool = True

    def validate(self) -> None:
        in_range("train.beta1", self.beta1, 0.0, 1.0, high_open=True)
        in_range("train.beta2", self.beta2, 0.0, 1.0, high_open=True)
        if not self.eps > 0:
            raise ConfigError(f"train.eps = {self.eps}: must be > 0")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay = {self.weight_decay}: must be >= 0")


@register("local_optimizer")
class Adam(LocalOptimizer):
    """Adam over the covered parameters; moments of layers a step does not reach stay as
    they were (their elements get no gradient, as under ``torch.optim.Adam`` with
    ``grad = None``), and the bias correction counts each client's own steps."""

    name = "adam"
    Options = AdamOptions

    KEYS = ("adam.exp_avg", "adam.exp_avg_sq", "adam.steps")

    def __init__(self, options: AdamOptions):
        self.options = options
        self.moments: tuple[torch.Tensor, ...] = ()  # exp_avg, exp_avg_sq, steps: clients x parameters

    @classmethod
    def build(cls, options: AdamOptions, ctx=None) -> Adam:
        return cls(options)

    def begin(self, states: Sequence[ComponentState], size: int, device: torch.device | None = None) -> None:
        """Each client's kept moments and per-element step counts (``keep_state``), or zeros."""
        self.moments = tuple(torch.zeros(len(states), size, device=device) for _ in self.KEYS)
        if not self.options.keep_state:
            return
        for i, state in enumerate(states):
            saved = [state.get(key) for key in self.KEYS]
            kept = [value for value in saved if isinstance(value, torch.Tensor)]
            if len(kept) == len(self.KEYS) and kept[0].numel() == size:
                for matrix, value in zip(self.moments, kept, strict=True):
                    matrix[i].copy_(value)

    def step(self, regions: torch.Tensor, grads: torch.Tensor, lr: float, where: slice) -> None:
        o = self.options
        if o.weight_decay:
            grads.add_(regions, alpha=o.weight_decay)
        m, v, t = (matrix[: len(regions), where] for matrix in self.moments)
        t.add_(1.0)
        m.mul_(o.beta1).add_(grads, alpha=1.0 - o.beta1)  # Adam Algorithm 1
        v.mul_(o.beta2).addcmul_(grads, grads, value=1.0 - o.beta2)
        first = 1.0 - torch.pow(o.beta1, t)  # bias corrections, per element's own count
        second = 1.0 - torch.pow(o.beta2, t)
        denominator = (v / second).sqrt_().add_(o.eps)
        regions.sub_(m / first / denominator, alpha=lr)

    def end(self, states: Sequence[ComponentState]) -> None:
        if self.options.keep_state:
            for i, state in enumerate(states):
                state.update(
                    {key: matrix[i].clone() for key, matrix in zip(self.KEYS, self.moments, strict=True)}
                )
        self.moments = ()
