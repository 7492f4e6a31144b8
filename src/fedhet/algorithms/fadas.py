"""FADAS (Yujia Wang, Shiqiang Wang, Songtao Lu, Jinghui Chen, "FADAS: Towards Federated
Adaptive Asynchronous Optimization", ICML 2024, arXiv 2407.18365): FedBuff's buffered
asynchronous aggregation whose server step is AMSGrad on the buffer's mean update, with a
global learning rate that shrinks when the buffer holds a very stale update. Runs on the
event-driven driver, as FedBuff.

Each server step t, on the M buffered updates Delta_t^i (each from the model its client was
sent, tau_i server steps ago):

    Delta_t = (1/M) sum_i Delta_t^i
    m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t
    v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2,   v_hat_t = max(v_hat_{t-1}, v_t)
    eta_t = eta if tau_max_t <= tau_c, else min(eta, 1 / tau_max_t)
    x_{t+1} = x_t + eta_g eta_t m_t / (sqrt(v_hat_t) + epsilon)

with tau_max_t the largest staleness in the buffer and tau_c the delay threshold (the
delay-adaptive variant; ``delay_threshold = 0`` is plain FADAS, eta_t = eta). The moments
are fedhet's adaptive server optimizers' (:class:`~fedhet.algorithms.server_optimizers.
ServerAMSGrad`): m_{-1} = 0, v_{-1} = v_hat_{-1} = epsilon^2, no bias correction; epsilon is
``tau``. The updates are not staleness-weighted (FedBuff's 1/sqrt(1 + tau) is not FADAS's).
eta_g is fedhet's one server learning rate (``server.lr``, 1 by default: the paper's step as
it is), as for every rule; a bench that searches it scales the whole step, while the delay
rule compares ``eta`` itself with 1 / tau_max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import register
from fedhet.algorithms.fedbuff import FedBuff, FedBuffAggregation, FedBuffOptions, FedBuffReporting
from fedhet.algorithms.server_optimizers import AdaptiveOptions, ServerAMSGrad
from fedhet.errors import ConfigError


@dataclass
class FADASOptions(FedBuffOptions):
    """FedBuff's ``buffer_size`` M, ``max_concurrency`` and ``server_lr`` eta_g (fedhet's
    one server rate, 1); ``eta`` the AMSGrad step's rate (0.1, as fedhet's adaptive server
    optimizers), ``beta1``, ``beta2``, the adaptivity ``tau`` (epsilon), and
    ``delay_threshold`` tau_c (0: no delay adaptation)."""

    eta: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    delay_threshold: int = 0

    def validate(self) -> None:
        super().validate()
        if not self.eta > 0:
            raise ConfigError(f"algorithm.eta = {self.eta}: must be > 0")
        AdaptiveOptions(1.0, self.beta1, self.beta2, self.tau).validate()
        if self.delay_threshold < 0:
            raise ConfigError(f"algorithm.delay_threshold = {self.delay_threshold}: must be >= 0 (0 = none)")


class FADASAggregation(FedBuffAggregation):
    """FADAS's server step (the module's recurrence)."""

    def init_state(self, setting) -> dict:
        return {**super().init_state(setting), "moments": {}}

    def step_rate(self, staleness: list[int]) -> float:
        """eta_t: eta, or min(eta, 1 / tau_max) past the delay threshold."""
        eta, threshold, largest = self.options.eta, self.options.delay_threshold, max(staleness)
        return eta if not threshold or largest <= threshold else min(eta, 1.0 / largest)

    def apply_buffer(self, params, buffers, entries, state: dict, version: int):
        """One server step from the buffer ``entries`` = [(update, staleness), ...]."""
        k = len(entries)
        mean = params.new_zeros(params.shape)
        new_buffers = buffers.clone()
        for update, _ in entries:
            mean.add_(update.delta, alpha=1.0 / k)
            if buffers.numel():
                new_buffers.add_(update.delta_buffers, alpha=1.0 / k)
        o = self.options
        amsgrad = ServerAMSGrad(AdaptiveOptions(lr=1.0, beta1=o.beta1, beta2=o.beta2, tau=o.tau))
        staleness = [s for _, s in entries]
        rate = self.step_rate(staleness)
        new_params = params + (o.server_lr * rate) * amsgrad.direction(mean, state["moments"])
        state["log"].append({"step": version + 1, "clients": [u.client for u, _ in entries],
                             "staleness": staleness, "rate": rate})  # fmt: skip
        return new_params, new_buffers


class FADASReporting(FedBuffReporting):
    """FADAS's report: the server steps, their staleness and rate."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"fadas": {"server_steps": state["log"]}}


@register
class FADAS(FedBuff):
    """FedBuff's buffer and concurrency, AMSGrad's server step on the buffer's mean update
    with a delay-adaptive rate (FADAS Algorithm 1 and its delay-adaptive variant; the
    module's recurrence)."""

    name = "fadas"
    summary = "FADAS: buffered asynchronous aggregation with an AMSGrad server step and a delay-adaptive rate"
    Options = FADASOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        **FedBuff.hyperparameters,
        "eta": {"low": 1e-3, "high": 1.0, "log": True},
        "tau": {"low": 1e-5, "high": 1e-1, "log": True},
    }
    Aggregation = FADASAggregation
    Reporting = FADASReporting
