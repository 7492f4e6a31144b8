"""Server optimizers: FedAvg whose averaged update is a pseudo-gradient for an optimizer on
the server (Reddi et al., "Adaptive Federated Optimization", arXiv:2003.00295, Algorithm 2;
Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv:1909.06335, FedAvgM).

Each round, Delta_t = sum_u a_u Delta_u (FedAvg's weights over the clients that delivered,
:class:`~fedhet.algorithms.fedavg.FedAvg`), then

- FedAvgM: m_t = beta m_{t-1} + Delta_t; x_{t+1} = x_t + eta m_t;
- FedAdagrad: v_t = v_{t-1} + Delta_t^2;
- FedYogi: v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2);
- FedAdam: v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2;

and for the three adaptive rules m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t,
x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau), with m_{-1} = 0 and v_{-1} = tau^2 (the paper's
v_{-1} >= tau^2; no bias correction, as in its Algorithm 2). eta is ``server_lr``; BatchNorm
statistics are averaged as FedAvg's. A round in which no client delivered leaves the model
and the moments as they are. The moments are server state: checkpointed, so a resumed run
continues them.

Each is a *preset*: FedAvg's streamed average, proposed at rate 1, then the server
optimizer of :mod:`fedhet.algorithms.server_optimizers` (``[server] optimizer``, the one
route for a server step) built from the rule's options (``server_lr`` is its ``lr``).
``algorithm.name = "fedadam"`` is ``"fedavg"`` with ``[server] optimizer = "adam"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import register
from fedhet.algorithms.fedavg import FedAvg, FedAvgAggregation, FedAvgOptions
from fedhet.algorithms.server_optimizers import AdaptiveOptions as StepOptions
from fedhet.algorithms.server_optimizers import (
    MomentumOptions,
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerYogi,
)
from fedhet.errors import ConfigError


@dataclass
class FedAvgMOptions(FedAvgOptions):
    """FedAvg's ``weights`` and ``server_lr`` (eta), plus ``momentum`` beta in [0, 1)."""

    momentum: float = 0.9

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"algorithm.momentum = {self.momentum}: must be in [0, 1)")


@dataclass
class AdaptiveOptions(FedAvgOptions):
    """FedAvg's ``weights``; ``server_lr`` eta (Reddi et al. tune it on a log grid; 0.1 by
    default here), ``beta1``, ``beta2`` in [0, 1) and the adaptivity ``tau`` > 0."""

    server_lr: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def validate(self) -> None:
        super().validate()
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"algorithm.{key} = {getattr(self, key)}: must be in [0, 1)")
        if not self.tau > 0:
            raise ConfigError(f"algorithm.tau = {self.tau}: must be > 0")


class PresetServerStep(FedAvgAggregation):
    """FedAvg's aggregation proposing Delta_t as it is, with the preset server step its rule
    names (:meth:`ServerOptimizedFedAvg.make_optimizer`): the run applies that step."""

    @property
    def proposal_lr(self) -> float:
        return 1.0  # Delta_t as it is: server_lr is the optimizer's rate

    def preset_server_optimizer(self) -> ServerOptimizer:
        return self.rule.make_optimizer(self.options)


class ServerOptimizedFedAvg(FedAvg):
    """FedAvg's average as the pseudo-gradient of a server step: a preset of FedAvg and the
    ``[server]`` optimizer :meth:`make_optimizer` builds from the rule's options (the run
    applies it, as it would a ``[server] optimizer``)."""

    Aggregation = PresetServerStep

    def make_optimizer(self, options) -> ServerOptimizer:
        """The server optimizer this rule is a preset for, from its options."""
        raise NotImplementedError


@register
class FedAvgM(ServerOptimizedFedAvg):
    """FedAvg with server momentum (Hsu et al. 2019): m_t = beta m_{t-1} + Delta_t,
    x_{t+1} = x_t + eta m_t; beta = 0 and eta = 1 is FedAvg."""

    name = "fedavgm"
    summary = "FedAvg with server momentum (Hsu et al. 2019)"
    Options = FedAvgMOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        **FedAvg.hyperparameters,
        "momentum": {"low": 0.0, "high": 0.97},
    }

    def make_optimizer(self, options) -> ServerOptimizer:
        return ServerMomentum(MomentumOptions(lr=options.server_lr, momentum=options.momentum))


class AdaptiveFedAvg(ServerOptimizedFedAvg):
    """Reddi et al. Algorithm 2 with the server optimizer :attr:`kind`."""

    Options = AdaptiveOptions
    kind: ClassVar[type[ServerOptimizer]]
    hyperparameters: ClassVar[dict[str, dict]] = {
        "server_lr": {"low": 1e-3, "high": 1.0, "log": True},
        "tau": {"low": 1e-5, "high": 1e-1, "log": True},
    }

    def make_optimizer(self, options) -> ServerOptimizer:
        return self.kind(
            StepOptions(lr=options.server_lr, beta1=options.beta1, beta2=options.beta2, tau=options.tau)
        )


@register
class FedAdagrad(AdaptiveFedAvg):
    """v_t = v_{t-1} + Delta_t^2 (Reddi et al. Algorithm 2)."""

    name = "fedadagrad"
    summary = "FedAvg with an Adagrad server step (Reddi et al. 2021)"
    kind = ServerAdagrad


@register
class FedYogi(AdaptiveFedAvg):
    """v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2) (Reddi et al. Algorithm 2)."""

    name = "fedyogi"
    summary = "FedAvg with a Yogi server step (Reddi et al. 2021)"
    kind = ServerYogi


@register
class FedAdam(AdaptiveFedAvg):
    """v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2 (Reddi et al. Algorithm 2)."""

    name = "fedadam"
    summary = "FedAvg with an Adam server step (Reddi et al. 2021)"
    kind = ServerAdam
