"""SCAFFOLD (Karimireddy et al., 2020), option II, with server and client control variates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhet.algorithms.aggregation import layerwise_mean_buffers
from fedhet.algorithms.base import SERVER_LR_RANGE, Algorithm, RunSetting, register
from fedhet.algorithms.parts import Aggregation, ClientPart, Planner
from fedhet.errors import ConfigError


@dataclass
class ScaffoldOptions:
    """``server_lr``: eta_g in w += eta_g mean_S (y_i - w_t)."""

    server_lr: float = 1.0

    def validate(self) -> None:
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class ScaffoldPlanner(Planner):
    """SCAFFOLD's planner: each task carries the server's control variate c."""

    def task_payload(self, client, state):
        return {"control": state["control"]}


class ScaffoldClient(ClientPart):
    """SCAFFOLD's client: the correction c - c_i on each step, and c_i updated after its steps."""

    def upload_payload(self, covered: int) -> dict[str, int]:
        """Delta c_i travels with Delta y_i: the update is twice the model's size."""
        return {"control_change": covered}

    def _client_control(self, state: dict, like: torch.Tensor) -> torch.Tensor:
        """c_i, zero at first, on ``like``'s device and of its size (the global c)."""
        if "control" not in state:
            state["control"] = torch.zeros_like(like)
        state["control"] = state["control"].to(like.device)  # no copy when already there
        return state["control"]

    corrects_gradients = True

    def gradient_correction(self, task, state, region, local, anchor):
        """c - c_i over the covered region."""
        c = task.payload["control"]
        return c[region] - self._client_control(state, c)[region]

    def finish_local_work(self, task, update, state, region, local, anchor):
        """Option II: c_i+ = c_i - c + (w_t - y_i) / (K eta_l); send c_i+ - c_i."""
        c = task.payload["control"]
        c_i = self._client_control(state, c)
        change = torch.zeros_like(c)
        change[region] = -c[region] - update.delta / (task.local_steps * task.lr)
        state["control"] = c_i + change
        update.payload["control_change"] = change


class ScaffoldAggregation(Aggregation):
    """SCAFFOLD's aggregation: the mean update, and c moved by the mean control change."""

    def init_state(self, setting: RunSetting) -> dict:
        return {"control": torch.zeros(setting.num_params)}

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w += eta_g mean_S Delta_i; c += (1/N) sum_S Delta c_i."""
        full = [u for u in updates if u.coverage.is_full() and u.steps > 0]
        if not full:
            return params, buffers
        new_params = params.clone()
        control = state["control"].clone()
        for u in full:
            new_params.add_(u.delta, alpha=self.options.server_lr / len(full))
            control.add_(u.payload["control_change"], alpha=1.0 / context.num_clients)
        state["control"] = control
        return new_params, layerwise_mean_buffers(buffers, full, layout.buffer_slices)


@register
class Scaffold(Algorithm):
    """The server sends c with each task; client i steps with grad - c_i + c, and after its
    K_i steps (those finished by the deadline) sets
    c_i+ = c_i - c + (w_t - y_i) / (K_i eta_l) (option II) and returns Delta c_i = c_i+ - c_i.
    Server: w += eta_g mean_S (y_i - w_t); c += (1/N) sum_S Delta c_i.

    State: server c (P floats, ``state["control"]``); client c_i (P floats each, client state
    ``"control"``, zeros until its first round). Each update carries Delta c_i beside its
    delta (``upload_payload``): postprocessors process it and the clock counts its bytes."""

    name = "scaffold"
    summary = "SCAFFOLD (option II): control variates correct client drift; partial steps accepted"
    Options = ScaffoldOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": SERVER_LR_RANGE}
    partial_work = "steps"
    Planner = ScaffoldPlanner
    Client = ScaffoldClient
    Aggregation = ScaffoldAggregation
