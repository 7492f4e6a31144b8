"""SALF: layer-wise aggregation of stragglers' partial updates (SALF eq. (9))."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhet.algorithms.aggregation import (
    expand_per_layer,
    layerwise_mean,
    layerwise_mean_buffers,
    layerwise_sum,
)
from fedhet.algorithms.base import Algorithm, register
from fedhet.algorithms.parts import Aggregation
from fedhet.algorithms.streaming import LayerwiseSumAggregator
from fedhet.errors import ConfigError

NORMALIZATIONS = ("reached", "all", "inverse-reach")


@dataclass
class SALFOptions:
    """``bias_correction``: divide layer l's mean update by 1 - p_l (eq. (9)); ``normalize``:
    ``reached`` (mean over U_l, the paper), ``all`` (sum over U_l divided by U, the
    authors' public code, which applies no p_l) or ``inverse-reach`` (ours: each client's
    update on layer l weighted by 1 / (U P[u reaches l]), a Horvitz-Thompson estimate that
    stays unbiased when clients reach layers with different probabilities, where the
    papers' rule, which assumes exchangeable clients, does not)."""

    bias_correction: bool = True
    normalize: str = "reached"

    def validate(self) -> None:
        if self.normalize not in NORMALIZATIONS:
            raise ConfigError(
                f"algorithm.normalize = {self.normalize!r}: must be one of {', '.join(NORMALIZATIONS)}"
            )


def salf_layer_factor(
    counts: torch.Tensor, no_reach_prob: torch.Tensor, bias_correction: bool
) -> torch.Tensor:
    """Per-layer factor turning the sum over U_l of Delta_u^l into SALF's step:
    1 / (|U_l| (1 - p_l)) where |U_l| > 0, else 0 (layer kept) — SALF eq. (9), ADEL-FL eq. (5).
    """
    correction = 1.0 - no_reach_prob if bias_correction else torch.ones_like(no_reach_prob)
    return torch.where(counts > 0, 1.0 / (counts.clamp(min=1.0) * correction), torch.zeros_like(counts))


class SALFAggregation(Aggregation):
    """SALF's layer-wise aggregation (SALF eq. (9)), streamed: per-layer sums and counts."""

    def streaming_aggregator(self, params, buffers, tasks, state, context, layout):
        """Streams eq. (9) (and the authors' sum / U): per-layer sums and counts are
        accumulated as the updates arrive; the inverse-reach weighting takes the list."""
        if self.options.normalize == "inverse-reach":
            return None

        def finish(param_sums, buffer_sums):
            slices = layout.param_slices
            sums, counts = param_sums.total, param_sums.counts
            if self.options.normalize == "all":
                factor = torch.full_like(counts, 1.0 / context.num_clients)
            else:
                p_l = torch.as_tensor(context.marginals.no_reach_prob, dtype=torch.float32)
                factor = salf_layer_factor(counts, p_l, self.options.bias_correction)
            new_params = params + sums * expand_per_layer(factor, slices, params.numel())
            return new_params, layerwise_mean(buffers, buffer_sums)

        return LayerwiseSumAggregator(params, buffers, layout, finish)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """SALF eq. (9) (``normalize='reached'``), the authors' sum / U (``'all'``) or the
        inverse-reach-probability weighting (``'inverse-reach'``)."""
        slices = layout.param_slices
        if self.options.normalize == "inverse-reach":
            reach = torch.as_tensor(context.marginals.reach_prob, dtype=torch.float64)
            weights = torch.where(reach > 0, 1.0 / (context.num_clients * reach.clamp(min=1e-300)), 0.0)
            sums, _ = layerwise_sum(updates, slices, params.numel(), weights=weights)
            new_buffers = layerwise_mean_buffers(buffers, updates, layout.buffer_slices)
            return params + sums, new_buffers
        aggregator = self.streaming_aggregator(params, buffers, [], state, context, layout)
        for update in updates:  # the same sums as streaming, over the list
            aggregator.add(update)
        return aggregator.result()


@register
class SALF(Algorithm):
    """Stragglers send the layers they reached; the server aggregates layer by layer:
    w^l_{t+1} = w^l_t + mean_{u in U_l} Delta^l_u / (1 - p_l), w^l_t kept if U_l is empty.
    p_l = P[no client reaches l] comes from the system model in use."""

    name = "salf"
    summary = "Stragglers-aware layer-wise FL (SALF eq. (9)), p_l from the system model"
    Options = SALFOptions
    partial_work = "layers"
    Aggregation = SALFAggregation
