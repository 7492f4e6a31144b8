"""FedDyn (Acar et al., 2021): dynamic regularisation with a per-client linear term and a
server state h."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhet.algorithms.aggregation import layerwise_mean_buffers
from fedhet.algorithms.base import Algorithm, RunSetting, register
from fedhet.algorithms.parts import Aggregation, ClientPart
from fedhet.errors import ConfigError


@dataclass
class FedDynOptions:
    """``alpha`` > 0, the weight of the dynamic regulariser."""

    alpha: float = 0.01

    def validate(self) -> None:
        if not self.alpha > 0:
            raise ConfigError(f"algorithm.alpha = {self.alpha}: must be > 0")


class FedDynClient(ClientPart):
    """FedDyn's client: the dynamic regulariser's linear and proximal terms, and its own
    gradient state updated after its steps."""

    def _linear(self, state: dict, like: torch.Tensor) -> torch.Tensor:
        """g_i, zero at first, on ``like``'s device and of its size (the model)."""
        if "linear" not in state:
            state["linear"] = torch.zeros_like(like)
        state["linear"] = state["linear"].to(like.device)  # no copy when already there
        return state["linear"]

    corrects_gradients = True

    def gradient_correction(self, task, state, region, local, anchor):
        """-g_i + alpha (theta - theta_t) over the covered region."""
        g = self._linear(state, local)
        return self.options.alpha * (local[region] - anchor[region]) - g[region]

    def finish_local_work(self, task, update, state, region, local, anchor):
        """g_i <- g_i - alpha (theta_i - theta_t)."""
        g = self._linear(state, local).clone()
        g[region] -= self.options.alpha * update.delta
        state["linear"] = g


class FedDynAggregation(Aggregation):
    """FedDyn's aggregation: the mean model corrected by the server state h."""

    def init_state(self, setting: RunSetting) -> dict:
        return {"h": torch.zeros(setting.num_params)}

    def aggregate(self, params, buffers, updates, state, context, layout):
        """h <- h - alpha (1/N) sum_S Delta_i; theta = theta_t + mean_S Delta_i - h / alpha."""
        full = [u for u in updates if u.coverage.is_full() and u.steps > 0]
        if not full:
            return params, buffers
        alpha = self.options.alpha
        mean_delta = torch.zeros_like(params)
        h = state["h"].clone()
        for u in full:
            mean_delta.add_(u.delta, alpha=1.0 / len(full))
            h.add_(u.delta, alpha=-alpha / context.num_clients)
        state["h"] = h
        return params + mean_delta - h / alpha, layerwise_mean_buffers(buffers, full, layout.buffer_slices)


@register
class FedDyn(Algorithm):
    """Client i minimises F_i(theta) - <g_i, theta> + (alpha/2)||theta - theta_t||^2 for the
    steps it finishes by the deadline (gradient + (-g_i + alpha (theta - theta_t))), then
    g_i <- g_i - alpha (theta_i - theta_t). Server: h <- h - alpha (1/N) sum_S
    (theta_i - theta_t); theta_{t+1} = mean_S theta_i - h / alpha.

    State: server h (P floats, ``state["h"]``); client g_i (P floats each, client state
    ``"linear"``, zeros until its first round)."""

    name = "feddyn"
    summary = "FedDyn: dynamic regularisation (alpha); partial steps accepted"
    Options = FedDynOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"alpha": {"low": 1e-4, "high": 1.0, "log": True}}
    partial_work = "steps"
    Client = FedDynClient
    Aggregation = FedDynAggregation
