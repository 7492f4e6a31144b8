"""Server optimizers: a plug-in kind (``[server] optimizer = "..."``) applied to the global
update of any rule, on both drivers.

Each server step (a round, or an event-driven rule's buffer), the rule proposes new
parameters x' from the current x; the server optimizer treats Delta_t = x' - x as a
pseudo-gradient and returns x_{t+1} (Reddi et al., "Adaptive Federated Optimization",
arXiv:2003.00295, Algorithm 2; Hsu et al., arXiv:1909.06335, FedAvgM):

- ``sgd``: x_{t+1} = x + eta Delta_t; eta = 1 (the default) returns the rule's own
  parameters untouched, bit for bit;
- ``momentum``: m_t = beta m_{t-1} + Delta_t; x_{t+1} = x + eta m_t;
- ``adagrad``: v_t = v_{t-1} + Delta_t^2;
- ``yogi``: v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2);
- ``adam``: v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2;
- ``amsgrad``: Adam's v_t, the step divided by v_hat_t = max(v_hat_{t-1}, v_t);

and for the three adaptive ones m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t,
x_{t+1} = x + eta m_t / (sqrt(v_t) + tau), with m_{-1} = 0 and v_{-1} = tau^2, no bias
correction (the paper's Algorithm 2). The moments are the run's server state, checkpointed
(a resumed run continues them). BatchNorm statistics are the rule's. A step whose Delta_t is
exactly zero (nobody delivered) leaves the moments and the model as they are.

One server learning rate: a rule's own ``server_lr`` (its proposal's step, the ``sgd`` step
folded into the rule) other than 1 beside a ``[server]`` optimizer that steps is refused in
one line (the two would multiply). FedAvgM,
FedAdam, FedYogi and FedAdagrad as algorithm names (``algorithms/server_opt.py``) are presets:
FedAvg with these steps, applied by the run as a ``[server]`` optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhet.errors import ConfigError
from fedhet.registry import register


class ServerOptimizer:
    """Base of the kind: ``name``, ``Options`` and :meth:`direction` (the step from the
    pseudo-gradient, the optimizer's own ``state`` dict updated in place)."""

    name = "base"

    def __init__(self, options) -> None:
        self.options = options

    @classmethod
    def build(cls, options, ctx=None) -> ServerOptimizer:
        return cls(options)

    @property
    def is_identity(self) -> bool:
        """Whether every step returns the rule's proposal as it is."""
        return False

    def direction(self, delta: torch.Tensor, state: dict) -> torch.Tensor:
        """x_{t+1} - x_t from the pseudo-gradient Delta_t."""
        raise NotImplementedError

    def step(self, params: torch.Tensor, proposed: torch.Tensor, state: dict) -> torch.Tensor:
        """x_{t+1} from the current ``params`` and the rule's ``proposed`` parameters."""
        if self.is_identity:
            return proposed
        delta = proposed - params
        if not bool(delta.any()):
            return proposed  # nothing delivered: no step, the moments unchanged
        return params + self.direction(delta, state)


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"server.{key} = {value}: must be > 0")


def _fraction(key: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"server.{key} = {value}: must be in [0, 1)")


@dataclass
class SGDOptions:
    """``lr`` eta (1 = the rule's step as it is)."""

    lr: float = 1.0

    def validate(self) -> None:
        _positive("lr", self.lr)


@register("server_optimizer", "sgd")
class ServerSGD(ServerOptimizer):
    """x_{t+1} = x + eta Delta_t (the identity at eta = 1, the default)."""

    name = "sgd"
    Options = SGDOptions

    @property
    def is_identity(self) -> bool:
        return self.options.lr == 1.0

    def direction(self, delta, state):
        return self.options.lr * delta


@dataclass
class MomentumOptions:
    """``lr`` eta and ``momentum`` beta in [0, 1)."""

    lr: float = 1.0
    momentum: float = 0.9

    def validate(self) -> None:
        _positive("lr", self.lr)
        _fraction("momentum", self.momentum)


@register("server_optimizer", "momentum")
class ServerMomentum(ServerOptimizer):
    """FedAvgM (Hsu et al. 2019): m_t = beta m_{t-1} + Delta_t; x_{t+1} = x + eta m_t."""

    name = "momentum"
    Options = MomentumOptions

    def direction(self, delta, state):
        m = state.get("m")
        m = delta.clone() if m is None else m.mul_(self.options.momentum).add_(delta)
        state["m"] = m
        return self.options.lr * m


@dataclass
class AdaptiveOptions:
    """``lr`` eta (Reddi et al. tune it on a log grid; 0.1 here), ``beta1``, ``beta2`` in
    [0, 1) and the adaptivity ``tau`` > 0."""

    lr: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def validate(self) -> None:
        _positive("lr", self.lr)
        _fraction("beta1", self.beta1)
        _fraction("beta2", self.beta2)
        _positive("tau", self.tau)


class AdaptiveServerOptimizer(ServerOptimizer):
    """Reddi et al. Algorithm 2: first moment m, second moment v by :meth:`second_moment`."""

    Options = AdaptiveOptions

    def direction(self, delta, state):
        o = self.options
        if state.get("m") is None:
            state["m"] = torch.zeros_like(delta)
            state["v"] = torch.full_like(delta, o.tau**2)
        m = state["m"].mul_(o.beta1).add_(delta, alpha=1.0 - o.beta1)
        state["v"] = v = self.second_moment(state["v"], delta * delta)
        return o.lr * m / (self.normaliser(state, v).sqrt() + o.tau)

    def second_moment(self, v: torch.Tensor, squared: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def normaliser(self, state: dict, v: torch.Tensor) -> torch.Tensor:
        """What the step divides by (its square root): v_t itself."""
        return v


@register("server_optimizer", "adagrad")
class ServerAdagrad(AdaptiveServerOptimizer):
    """v_t = v_{t-1} + Delta_t^2 (Reddi et al. Algorithm 2, FedAdagrad)."""

    name = "adagrad"

    def second_moment(self, v, squared):
        return v.add_(squared)


@register("server_optimizer", "yogi")
class ServerYogi(AdaptiveServerOptimizer):
    """v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2) (FedYogi)."""

    name = "yogi"

    def second_moment(self, v, squared):
        return v.sub_((1.0 - self.options.beta2) * squared * torch.sign(v - squared))


@register("server_optimizer", "adam")
class ServerAdam(AdaptiveServerOptimizer):
    """v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2 (FedAdam)."""

    name = "adam"

    def second_moment(self, v, squared):
        return v.mul_(self.options.beta2).add_(squared, alpha=1.0 - self.options.beta2)


@register("server_optimizer", "amsgrad")
class ServerAMSGrad(ServerAdam):
    """Adam's v_t, divided by v_hat_t = max(v_hat_{t-1}, v_t) (AMSGrad: Reddi, Kale and Kumar,
    "On the Convergence of Adam and Beyond", ICLR 2018; FADAS's server step), so the
    effective step of a coordinate never grows back after a large update."""

    name = "amsgrad"

    def normaliser(self, state: dict, v: torch.Tensor) -> torch.Tensor:
        peak = state.get("v_hat")
        state["v_hat"] = v.clone() if peak is None else torch.maximum(peak, v, out=peak)
        return state["v_hat"]
