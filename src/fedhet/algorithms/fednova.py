"""FedNova (Wang et al., 2020): normalised averaging of updates made with unequal numbers of
local steps."""

from __future__ import annotations

from dataclasses import dataclass

from fedhet.algorithms.aggregation import client_weights, layerwise_mean_buffers
from fedhet.algorithms.base import register
from fedhet.algorithms.fedavg import FedAvg, FedAvgAggregation, FedAvgOptions
from fedhet.algorithms.mechanisms import Mechanism


def normalising_factor(steps: int, momentum: float) -> float:
    """a_i: tau_i for plain SGD; with momentum rho, sum_{k=1..tau_i} (1 - rho^k) / (1 - rho)
    (FedNova's a_i for SGD with momentum)."""
    if not momentum:
        return float(steps)
    return sum((1.0 - momentum**k) / (1.0 - momentum) for k in range(1, steps + 1))


@dataclass
class FedNovaOptions(FedAvgOptions):
    """``weights`` (p_i: ``uniform`` or ``samples`` over the delivering clients) and
    ``server_lr``, as FedAvg."""


class FedNovaAggregation(FedAvgAggregation):
    """FedNova's normalised averaging: tau_eff sum_i p_i Delta_i / a_i."""

    def aggregate(self, params, buffers, updates, state, context, layout):
        """tau_eff sum_i p_i Delta_i / a_i (FedNova's normalised update)."""
        full = [u for u in updates if u.coverage.is_full() and u.steps > 0]
        if not full:
            return params, buffers
        weights = client_weights(full, self.options.weights)
        momentum = float(self.train.momentum)
        factors = [normalising_factor(u.steps, momentum) for u in full]
        tau_eff = sum(p * a for p, a in zip(weights, factors, strict=True))
        new_params = params.clone()
        for p, a, u in zip(weights, factors, full, strict=True):
            new_params.add_(u.delta, alpha=self.options.server_lr * tau_eff * p / a)
        new_buffers = layerwise_mean_buffers(buffers, full, layout.buffer_slices)
        return new_params, new_buffers


@register
class FedNova(FedAvg):
    """Clients deliver the whole local steps tau_i they finished by the deadline;
    a_i from tau_i (and the momentum of ``[train]``), tau_eff = sum_i p_i a_i,
    w_{t+1} = w_t + eta_s tau_eff sum_i p_i Delta_i / a_i (Delta_i = w_i - w_t)."""

    name = "fednova"
    summary = "FedNova: normalised averaging of unequal local steps finished by the deadline"
    Options = FedNovaOptions
    uses_deadline = True
    partial_work = "steps"
    mechanisms = (
        Mechanism("its normalised averaging (tau_eff sum_i p_i Delta_i / a_i)",
                  needs="train.local_steps >= 2 (with one step every delivering client has a_i = 1: "
                  "the weighted average of FedAvg)", acts=lambda rule: rule.train.local_steps >= 2),
    )  # fmt: skip
    Aggregation = FedNovaAggregation
