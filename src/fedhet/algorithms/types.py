"""What crosses a rule's parts: the server's plan for a round (:class:`RoundPlan`, one
:class:`ClientAssignment` per client), what the server knows once the round is drawn
(:class:`RoundContext`), and what a rule may look at once before round 1
(:class:`RunSetting`)."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.messages import ClientUpdate
from fedhet.models.layers import ModelLayout
from fedhet.system.base import SystemModel
from fedhet.system.types import Marginals, Outcomes, Workload

# the algorithm's part of a client's state, as its client hooks see it (a
# fedhet.client.state.Namespace: keys stored under "algorithm/")
OwnState = MutableMapping[str, Any]

PARTIAL_WORK = ("none", "layers", "steps")

# the default range of a server learning rate eta_s, for the rules that have one
SERVER_LR_RANGE = {"low": 0.25, "high": 2.0, "log": True}


@dataclass(frozen=True)
class ClientAssignment:
    """The server's instructions to one client for one round: batch size, local steps, the
    planned first layer of its back-propagation (1 = all layers), whether it is asked, and
    the gradient evaluations it makes beyond its steps (AMSFL's GDA), which the clock prices
    as that many more steps."""

    batch_size: int
    local_steps: int
    asked: bool = True
    depth: int = 1
    extra_gradients: int = 0


@dataclass
class RoundPlan:
    """The server's decisions for one round."""

    round: int
    deadline: float | None
    lr: float
    assignments: list[ClientAssignment]
    record: dict = field(default_factory=dict)  # what the rule decided and why, for its report

    @property
    def batch_sizes(self) -> np.ndarray:
        return np.array([a.batch_size for a in self.assignments])

    def workload(self) -> Workload:
        """What the system model prices: the deadline, every client's batch, steps, depth
        and extra gradient evaluations."""
        extra = np.array([a.extra_gradients for a in self.assignments])
        return Workload(
            self.deadline,
            self.batch_sizes,
            np.array([a.local_steps for a in self.assignments]),
            np.array([a.depth for a in self.assignments]),
            extra_gradients=extra if extra.any() else None,
        )


@dataclass
class RoundContext:
    """What the server knows in a round: the plan, the sampled outcomes and their marginals."""

    plan: RoundPlan
    outcomes: Outcomes
    marginals: Marginals
    num_clients: int
    num_layers: int
    client_sizes: np.ndarray | None = None  # every client's number of training examples


@dataclass
class RunSetting:
    """What an algorithm may look at once, before round 1, to set up its server state: the
    run's shape, the system model, the clients' data sizes, the initial model, and the replies
    to its probe tasks (e.g. ADEL-FL's gradient statistics)."""

    num_clients: int
    num_params: int
    rounds: int
    time_budget: float  # simulated seconds; 0 = none
    system: SystemModel
    client_sizes: np.ndarray
    layout: ModelLayout
    params: torch.Tensor
    buffers: torch.Tensor
    probes: list[ClientUpdate] = field(default_factory=list)
    work_dir: Path | None = None  # the run's folder, for server state kept in files
    layer_multiply_adds: tuple = ()  # per layer, multiply-adds per example (models/cost.py)


@dataclass
class AlgorithmContext:
    """What an algorithm is built with besides its options: the run's ``[train]`` section."""

    train: Any
