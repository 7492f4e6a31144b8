"""FedAWE (Ming Xiang, Stratis Ioannidis, Edmund Yeh, Carlee Joe-Wong, Lili Su, "Efficient
Federated Learning against Heterogeneous and Non-stationary Client Unavailability", NeurIPS
2024, arXiv 2409.17446): a returning client echoes the rounds it missed, and the server
averages where the available clients stand, with no memory of absent clients' updates.

Client i keeps x_i, the global model of the round after its last participation tau_i (x^0
before any). In round t each available client i that delivers (the set A_t) runs its s local
steps from x_i, not from the current global model, and reports its innovation
G_i = x_i^(t,s) - x_i (fedhet's sign: the change its steps made). The server then sets

    x^(t+1) = (1/|A_t|) sum_{i in A_t} x_i + eta_g clip( (1/|A_t|) sum_{i in A_t} (t - tau_i) G_i )

(FedAWE Algorithm 1: the mean of the x_i is the *implicit gossiping*, the factor t - tau_i
the *adaptive innovation echoing*: a client absent for k rounds counts its innovation k
times), and every i in A_t sets x_i = x^(t+1) and tau_i = t. With no client in A_t the model
stays. clip(v) = v min(1, c / ||v||) with c = ``echo_clip`` (0.5, the authors' code; 0: none,
the paper's Algorithm 1); eta_g = ``echo_lr`` (1, the authors' ``lr_global``). The mean is
unweighted, as in the paper. tau_i starts at -1 (rounds count from 0): a client's first
innovation counts t + 1 times.

Where x_i lives: in FedAWE each device keeps its own x_i (O(1) server memory). fedhet's
engines hand a client a model only with a task, so the simulation keeps, for every client,
which round's model is its x_i, and one copy of each such model (at most one per round a
client last took part in); a task carries its client's x_i as the model to start from
(one model down, as FedAWE's broadcast at the end of the round). The echo factor is applied
by the server, which knows t - tau_i as the client does; a postprocessor (clip-noise)
therefore acts on G_i itself. Stragglers: a client that would not finish its steps by the
deadline is not asked (``partial_work = "none"``) and is absent that round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch

from fedhet.algorithms.aggregation import layerwise_mean_buffers
from fedhet.algorithms.base import Algorithm, RunSetting, register
from fedhet.algorithms.parts import Aggregation, ClientPart, Planner, Reporting
from fedhet.errors import ConfigError


@dataclass
class FedAWEOptions:
    """``echo_lr``: eta_g, the rate of the echoed innovations (1); ``echo_clip``: the norm
    their mean is clipped to (0.5, the authors' code; 0: no clip, the paper's Algorithm 1)."""

    echo_lr: float = 1.0
    echo_clip: float = 0.5

    def validate(self) -> None:
        if not self.echo_lr > 0:
            raise ConfigError(f"algorithm.echo_lr = {self.echo_lr}: must be > 0")
        if not self.echo_clip >= 0:
            raise ConfigError(f"algorithm.echo_clip = {self.echo_clip}: must be >= 0 (0 = no clip)")


class FedAWEPlanner(Planner):
    """FedAWE's tasks: each carries the client's own x_i, the model it starts from."""

    def make_task(self, plan, client, steps, coverage, state):
        task = super().make_task(plan, client, steps, coverage, state)
        start = state["awe_models"][int(state["awe_start"][client])]
        return replace(task, payload={**task.payload, "start": start})


class FedAWEClient(ClientPart):
    """FedAWE's client: its local steps start from x_i (the task's ``start``)."""

    def start_point(self, task, state):
        return task.payload["start"]


class FedAWEAggregation(Aggregation):
    """FedAWE's server step (the module's recurrence) and the clients' x_i and tau_i."""

    def init_state(self, setting: RunSetting) -> dict:
        """tau_i = -1 and x_i = x^0 for every client (model key -1: the initial model)."""
        return {
            "awe_last": np.full(setting.num_clients, -1, dtype=np.int64),
            "awe_start": np.full(setting.num_clients, -1, dtype=np.int64),
            "awe_models": {-1: setting.params.detach().clone()},
            "awe_echo": [],
        }

    def aggregate(self, params, buffers, updates, state, context, layout):
        """x^(t+1) = mean_A x_i + eta_g clip(mean_A (t - tau_i) G_i); then x_i = x^(t+1),
        tau_i = t for i in A."""
        active = [u for u in updates if u.coverage.is_full() and u.steps > 0]
        if not active:
            state["awe_echo"] = []
            return params, buffers
        t, models = int(context.plan.round), state["awe_models"]
        gossip = torch.zeros_like(params)
        echoed = torch.zeros_like(params)
        echoes = []
        for u in active:
            echo = t - int(state["awe_last"][u.client])
            gossip.add_(models[int(state["awe_start"][u.client])].to(params.device), alpha=1.0 / len(active))
            echoed.add_(u.delta, alpha=echo / len(active))
            echoes.append(echo)
        clip = self.options.echo_clip
        norm = float(echoed.norm())
        if clip > 0 and norm > clip:
            echoed.mul_(clip / norm)
        new_params = gossip + self.options.echo_lr * echoed
        clients = [u.client for u in active]
        state["awe_last"][clients] = t
        state["awe_start"][clients] = t
        models[t] = new_params.detach().clone()
        referenced = {int(k) for k in state["awe_start"]}
        for key in [k for k in models if k not in referenced]:
            del models[key]  # no client starts from it any more
        state["awe_echo"] = echoes
        return new_params, layerwise_mean_buffers(buffers, active, layout.buffer_slices)


class FedAWEReporting(Reporting):
    """FedAWE's metrics: the round's mean echo factor and the models kept for x_i."""

    def round_metrics(self, state: dict) -> dict[str, float]:
        echoes = state["awe_echo"]
        return {"mean_echo": float(np.mean(echoes)) if echoes else float("nan"),
                "start_models": float(len(state["awe_models"]))}  # fmt: skip


@register
class FedAWE(Algorithm):
    """Available clients start from the model of the round after their last participation,
    the server averages those start points and adds the clipped mean of each innovation
    times the rounds since its client last took part (FedAWE Algorithm 1; the module's
    recurrence)."""

    name = "fedawe"
    summary = "FedAWE: returning clients echo the rounds they missed; the server averages where they stand"
    Options = FedAWEOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        "echo_lr": {"low": 0.1, "high": 2.0, "log": True},
        "echo_clip": {"low": 0.05, "high": 5.0, "log": True},
    }
    partial_work = "none"
    Planner = FedAWEPlanner
    Client = FedAWEClient
    Aggregation = FedAWEAggregation
    Reporting = FedAWEReporting
