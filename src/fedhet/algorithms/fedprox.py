"""FedProx (Li et al., 2020): local work on F_i(w) + (mu/2)||w - w_t||^2; a slow client's
partial work (the whole local steps it finished by the deadline) is accepted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedhet.algorithms.base import register
from fedhet.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhet.algorithms.mechanisms import Mechanism
from fedhet.algorithms.parts import ClientPart, Reporting
from fedhet.errors import ConfigError


@dataclass
class FedProxOptions(FedAvgOptions):
    """Plus ``mu`` >= 0, the proximal weight (mu = 0 is FedAvg with partial work)."""

    mu: float = 0.01

    def validate(self) -> None:
        super().validate()
        if not self.mu >= 0:
            raise ConfigError(f"algorithm.mu = {self.mu}: must be >= 0")


class FedProxClient(ClientPart):
    """FedProx's client: the proximal term's gradient mu (w - w_t) added to each step."""

    corrects_gradients = True

    def gradient_correction(self, task, state, region, local, anchor):
        """grad of (mu/2)||w - w_t||^2 over the covered region: mu (w - w_t)."""
        return self.options.mu * (local[region] - anchor[region])


class FedProxReporting(Reporting):
    """FedProx's caveat: at one local step it is drop-stragglers."""

    def caveats(self) -> list[str]:
        """With one local step FedProx is drop-stragglers: a step is all or nothing (no partial
        work to accept) and the proximal gradient mu (w - w_t) is zero at the first step."""
        if self.train.local_steps == 1:
            return [
                "fedprox with train.local_steps = 1 is drop-stragglers (one step is all or nothing, "
                "and the proximal term is zero at the first step)"
            ]
        return []


@register
class FedProx(FedAvg):
    """Each client minimises F_i(w) + (mu/2)||w - w_t||^2 for the steps it manages by the
    deadline (its gradient gets + mu (w - w_t)); the server takes the weighted average of the
    delivered models, w_{t+1} = w_t + eta_s sum_u a_u Delta_u (a_u = 1/|S| or n_u/n)."""

    name = "fedprox"
    summary = "FedProx: proximal term mu, partial local work by the deadline accepted"
    Options = FedProxOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        **FedAvg.hyperparameters,
        "mu": {"low": 1e-4, "high": 1.0, "log": True},
    }
    uses_deadline = True
    partial_work = "steps"
    mechanisms = (
        Mechanism("its proximal term (mu/2)||w - w_t||^2 (FedProx eq. (2))",
                  needs="train.local_steps >= 2 (its gradient mu (w - w_t) is zero at the first local step)",
                  acts=lambda rule: rule.train.local_steps >= 2, knobs=("mu",)),
        Mechanism("its acceptance of partial local work",
                  needs="train.local_steps >= 2 (one local step is all or nothing)",
                  acts=lambda rule: rule.train.local_steps >= 2),
    )  # fmt: skip
    Client = FedProxClient
    Reporting = FedProxReporting
