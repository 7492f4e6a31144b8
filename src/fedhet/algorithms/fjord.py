"""FjORD (Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and
Accurate Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS 2021,
arXiv:2102.13451): nested sub-models by ordered dropout; each client trains up to the
widest one its device affords, sampling a width per batch, with self-distillation from its
widest sub-model.

- **Ordered dropout** (FjORD Sec. 3.1): the sub-model of width p keeps the leading
  ceil(p K) units (channels) of every hidden layer of K, the input and the classes whole
  (:func:`fedhet.models.width.ordered_dropout_hooks`); the sub-models are nested, p < q
  gives a prefix of q, and nothing is rescaled.
- **Client width** (Sec. 3.2): client u's p_max is the widest p in ``rates`` (the paper's
  uniform grid {0.2, 0.4, ..., 1}) whose step cost fits the round's deadline, priced on the
  clock like HeteroFL's sub-models (``sub_model_cost``: multiply-adds by default); a client
  for which even the narrowest does not fit is not asked. (The paper draws each client's
  tier from its device class once; under fedhet's system models the device's speed is what
  decides, round by round.)
- **Local training** (Sec. 3.2, Algorithm 1): every batch samples p uniformly from the rates
  <= p_max and trains the width-p sub-model; with ``distillation`` (Sec. 3.3, the default,
  "FjORD w/ KD") the p_max sub-model is trained on the batch with cross-entropy and the
  sampled one against the p_max outputs' softmax as soft targets, the two gradients summed
  (as the authors' public baseline does). Only elements inside p_max move.
- **Aggregation** (Sec. 3.2): each element is the example-weighted average over the
  clients whose p_max sub-model holds it (sum_u n_u Delta_u[e] / sum_{u holds e} n_u);
  elements nobody held keep their value.

With BatchNorm the authors keep one set of statistics per width; fedhet keeps one set, made
static (recomputed at full width before evaluation, as for HeteroFL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from fedhet.algorithms.base import register
from fedhet.algorithms.heterofl import HeteroFL, HeteroFLAggregation, HeteroFLOptions
from fedhet.algorithms.parts import ClientPart
from fedhet.algorithms.sub_models import require_unit_layers
from fedhet.errors import ConfigError
from fedhet.models.width import ordered_dropout_hooks, width_mask

FJORD_RATES = [1.0, 0.8, 0.6, 0.4, 0.2]  # FjORD Sec. 5: p in {0.2, 0.4, ..., 1}


@dataclass
class FjORDOptions(HeteroFLOptions):
    """HeteroFL's width options (``rates``, ``width_rule``, ``sub_model_cost``, ...), with
    FjORD's grid of widths, plus ``distillation`` (FjORD w/ KD, Sec. 3.3)."""

    rates: list = field(default_factory=lambda: list(FJORD_RATES))
    distillation: bool = True

    def validate(self) -> None:
        super().validate()
        if self.aggregate != "held":
            raise ConfigError(
                f"algorithm.aggregate = {self.aggregate!r}: FjORD averages each element over its holders"
            )


class FjORDClient(ClientPart):
    """FjORD's client: ordered dropout over the widths up to its own, with self-distillation."""

    scales_sub_models: ClassVar[bool] = False

    local_loss_per_client: ClassVar[bool] = True  # a width drawn per batch from the client's stream

    def widths_up_to(self, p_max: float) -> list[float]:
        """The rates a client of width ``p_max`` samples from, ascending."""
        return sorted(float(r) for r in self.options.rates if float(r) <= p_max + 1e-12)

    def local_loss(self, task, state, model, x, y, depth, loss, rng):
        """FjORD Algorithm 1: sample p uniformly from the rates <= p_max; the loss of the
        width-p sub-model, plus, with distillation, the p_max sub-model's cross-entropy with
        the sampled one trained on its softmax."""
        p_max = float(task.coverage.width)
        widths = self.widths_up_to(p_max)
        p = widths[int(rng.integers(len(widths)))]
        teacher = None
        if self.options.distillation:
            teacher = model(x, depth)  # p_max: the elements beyond it are zero
            total = loss(teacher, y)
        handles = ordered_dropout_hooks(model, p) if p < p_max else []
        try:
            student = model(x, depth)
        finally:
            for handle in handles:
                handle.remove()
        if teacher is None:
            return loss(student, y)
        distill = getattr(loss, "distillation", None)  # the dataset's task (fedhet.data.task)
        if distill is None:  # a bare loss function: the classification reading of FjORD Sec. 3.3
            return total + F.cross_entropy(student, teacher.detach().softmax(dim=1))
        return total + distill(student, teacher.detach())


class FjORDAggregation(HeteroFLAggregation):
    """FjORD's aggregation: each width's elements averaged over the clients that trained them."""

    def init_state(self, setting) -> dict:
        """Ordered dropout drops units of the blocks' outputs: a model of units only."""
        require_unit_layers(setting.layout, self.rule.name, ranks=False)
        return super().init_state(setting)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w[e] + sum_u n_u Delta_u[e] / sum_{u holds e} n_u (FjORD Sec. 3.2); elements held
        by nobody keep their value. BatchNorm statistics are static (recomputed)."""
        if not updates:
            return params, buffers
        total = torch.zeros_like(params)
        weight = torch.zeros_like(params)
        masks: dict[float, torch.Tensor] = {}
        for u in updates:
            rate = float(u.coverage.width)
            if rate not in masks:
                masks[rate] = width_mask(layout, rate).to(params.dtype)
            total.add_(u.delta, alpha=float(u.num_samples))
            weight.add_(masks[rate], alpha=float(u.num_samples))
        step = torch.where(weight > 0, total / weight.clamp(min=1e-300), torch.zeros_like(total))
        return params + step, buffers


@register
class FjORD(HeteroFL):
    """Nested ordered-dropout sub-models: p ~ U{rates <= p_max} per batch, self-distillation
    from p_max, example-weighted averages over the clients holding each element."""

    name = "fjord"
    summary = "FjORD: ordered dropout, a width per batch up to the device's p_max, self-distillation"
    Options = FjORDOptions
    Client = FjORDClient
    Aggregation = FjORDAggregation
