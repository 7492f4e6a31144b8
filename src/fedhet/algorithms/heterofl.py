"""HeteroFL (Diao et al., "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021), the width-scaling baseline of SALF and
ADEL-FL: a client too slow for the full model by the deadline trains a sub-model of width
rate r instead (:mod:`fedhet.models.width`), and the server averages each parameter element
over the clients whose sub-models hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedhet.algorithms.base import Algorithm, register
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage
from fedhet.models.width import width_mask

DEFAULT_RATES = [1.0, 0.5, 0.25, 0.125, 0.0625]  # HeteroFL's levels a..e


@dataclass
class HeteroFLOptions:
    """``rates``: the sub-model widths a client may get, largest first (HeteroFL's levels).
    A sub-model of rate r costs r^2 of the full model's compute (HeteroFL Sec. 3.1)."""

    rates: list = field(default_factory=lambda: list(DEFAULT_RATES))
    bn_examples: int = 0  # static BatchNorm: training examples to recompute statistics on (0 = all)

    def validate(self) -> None:
        if self.bn_examples < 0:
            raise ConfigError(f"algorithm.bn_examples = {self.bn_examples}: must be >= 0 (0 = all)")
        rates = self.rates
        if not rates or not all(
            isinstance(r, int | float) and not isinstance(r, bool) and 0 < r <= 1 for r in rates
        ):
            raise ConfigError(f"algorithm.rates = {rates!r}: need rates in (0, 1]")
        if 1 not in rates:
            raise ConfigError(f"algorithm.rates = {rates!r}: must include 1 (the full model)")


@register
class HeteroFL(Algorithm):
    """Client u, whose full local work would take T_u (the system model's ``full_time``),
    trains the largest sub-model with r^2 T_u <= deadline (every layer, all local steps,
    hidden outputs divided by r); a client for which not even the smallest fits is not asked.
    Aggregation: w_{t+1}[e] = w_t[e] + mean over the clients holding e of Delta_u[e];
    elements nobody held keep their value. BatchNorm is static (HeteroFL Sec. 3.1): clients
    normalise with their batches' statistics and send none; the server ignores running
    statistics in aggregation and recomputes them on the full model from training data
    before each evaluation (``bn_examples``; :mod:`fedhet.models.batchnorm`). A sub-model's
    BatchNorm entries outside it are zero, so its dropped channels stay zero."""

    name = "heterofl"
    supports_channels_last = False  # width masks index the contiguous weight order
    summary = "HeteroFL: slow clients train width-reduced sub-models (r^2 of the compute)"
    Options = HeteroFLOptions

    def __init__(self, options, train):
        super().__init__(options, train)
        self.static_batchnorm_examples = int(options.bn_examples)

    def rate_for(self, full_time: float, deadline: float | None) -> float | None:
        """The largest rate r with r^2 * full_time <= deadline (1 without a deadline)."""
        if deadline is None:
            return 1.0
        fitting = [r for r in self.options.rates if r * r * full_time <= deadline * (1 + 1e-12)]
        return max(fitting) if fitting else None

    def client_task(self, context, client: int, state: dict) -> ClientTask | None:
        plan, outcomes = context.plan, context.outcomes
        assignment = plan.assignments[client]
        if not (assignment.asked and outcomes.participates[client]):
            return None
        rate = self.rate_for(float(outcomes.full_time[client]), plan.deadline)
        if rate is None:
            return None
        return self.make_task(plan, client, assignment.local_steps, Coverage(1, float(rate)), state)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """Element-wise mean of the deltas over the clients whose sub-model holds the element
        (HeteroFL Sec. 3.1); with every client at rate 1 this is FedAvg's uniform mean."""
        if not updates:
            return params, buffers
        total = torch.zeros_like(params)
        holders = torch.zeros_like(params)
        masks: dict[float, torch.Tensor] = {}
        for u in updates:
            rate = u.coverage.width
            if rate not in masks:
                masks[rate] = width_mask(layout, rate).to(params.dtype)
            total.add_(u.delta)
            holders.add_(masks[rate])
        step = torch.where(holders > 0, total / holders.clamp(min=1.0), torch.zeros_like(total))
        return params + step, buffers  # static BatchNorm: clients' running statistics are not used
