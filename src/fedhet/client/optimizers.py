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

from dataclasses import dataclass

import torch

from fedhet.checks import in_range
from fedhet.client.state import ComponentState
from fedhet.errors import ConfigError
from fedhet.registry import register


class LocalOptimizer:
    """Base of local optimizers. A fresh :meth:`begin` starts each task; ``plain`` says the
    step is w <- w - lr g exactly (the trainer may then update parameters in place without
    a flat copy of the gradient)."""

    name = "base"

    @property
    def plain(self) -> bool:
        """Whether a step is w <- w - lr g and nothing else (the trainer then updates the
        parameters in place, without a flat copy of the gradient)."""
        return False

    def begin(self, state: ComponentState, size: int) -> None:
        """Start a task for a client with ``state``; ``size`` = the full flat parameter count."""

    def step(self, region: torch.Tensor, grad: torch.Tensor, lr: float, where: slice) -> None:
        raise NotImplementedError

    def end(self, state: ComponentState) -> None:
        """After the task: keep what must survive the round in the client's ``state``."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, saved: dict[str, torch.Tensor]) -> None:
        pass


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
        self.buffer: torch.Tensor | None = None
        self.size = 0

    @classmethod
    def build(cls, options: SGDOptions, ctx=None) -> SGD:
        return cls(options.momentum, options.weight_decay, options.keep_momentum)

    @property
    def plain(self) -> bool:
        return not self.momentum and not self.weight_decay

    def begin(self, state: ComponentState, size: int) -> None:
        self.size = size
        kept = self.momentum and self.keep_momentum
        self.buffer = state.get(self.STATE_KEY) if kept else None

    def step(self, region: torch.Tensor, grad: torch.Tensor, lr: float, where: slice) -> None:
        if self.weight_decay:
            grad.add_(region, alpha=self.weight_decay)
        if self.momentum:
            if self.buffer is None:
                self.buffer = region.new_zeros(self.size)
                self.buffer[where] = grad
            else:
                self.buffer = self.buffer.to(region.device)  # no copy when already there
                self.buffer[where].mul_(self.momentum).add_(grad)
            grad = self.buffer[where]
        region.sub_(grad, alpha=lr)

    def end(self, state: ComponentState) -> None:
        if self.buffer is not None and self.keep_momentum:
            state.update(self.state_dict())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.buffer is None else {self.STATE_KEY: self.buffer}

    def load_state_dict(self, saved: dict[str, torch.Tensor]) -> None:
        self.buffer = saved.get(self.STATE_KEY)


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
        self.exp_avg = torch.zeros(0)  # sized by begin()
        self.exp_avg_sq = torch.zeros(0)
        self.steps = torch.zeros(0)  # per element: the steps that reached it

    @classmethod
    def build(cls, options: AdamOptions, ctx=None) -> Adam:
        return cls(options)

    def begin(self, state: ComponentState, size: int) -> None:
        saved = {k: state[k] for k in self.KEYS if k in state} if self.options.keep_state else {}
        if len(saved) == len(self.KEYS) and saved["adam.exp_avg"].numel() == size:
            self.load_state_dict(saved)
        else:
            self.exp_avg, self.exp_avg_sq = torch.zeros(size), torch.zeros(size)
            self.steps = torch.zeros(size)

    def step(self, region: torch.Tensor, grad: torch.Tensor, lr: float, where: slice) -> None:
        o = self.options
        if self.exp_avg.device != region.device:  # begun on the host; the model lives elsewhere
            self.exp_avg, self.exp_avg_sq, self.steps = (
                s.to(region.device) for s in (self.exp_avg, self.exp_avg_sq, self.steps)
            )
        if o.weight_decay:
            grad.add_(region, alpha=o.weight_decay)
        m, v, t = self.exp_avg[where], self.exp_avg_sq[where], self.steps[where]
        t.add_(1.0)
        m.mul_(o.beta1).add_(grad, alpha=1.0 - o.beta1)  # Adam Algorithm 1
        v.mul_(o.beta2).addcmul_(grad, grad, value=1.0 - o.beta2)
        first = 1.0 - torch.pow(o.beta1, t)  # bias corrections, per element's own count
        second = 1.0 - torch.pow(o.beta2, t)
        denominator = (v / second).sqrt_().add_(o.eps)
        region.sub_(m / first / denominator, alpha=lr)

    def end(self, state: ComponentState) -> None:
        if self.options.keep_state:
            state.update(self.state_dict())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"adam.exp_avg": self.exp_avg, "adam.exp_avg_sq": self.exp_avg_sq, "adam.steps": self.steps}

    def load_state_dict(self, saved: dict[str, torch.Tensor]) -> None:
        self.exp_avg = saved["adam.exp_avg"].clone()
        self.exp_avg_sq = saved["adam.exp_avg_sq"].clone()
        self.steps = saved["adam.steps"].clone()
