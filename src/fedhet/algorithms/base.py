"""The Algorithm protocol: three engine-agnostic pieces (DESIGN idea 2).

- ``plan(round, state, system)`` -> :class:`RoundPlan`: deadline (``None`` = wait for all),
  learning rate, per-client assignments (batch size, local steps, asked or not).
- ``local_update(trainer, ...)`` -> :class:`~fedhet.client.LocalResult` or ``None`` (the
  client's work, truncated to what its sampled outcome allows; ``None`` = nothing to send).
- ``aggregate(params, buffers, updates, state, context)`` -> new global (params, buffers).

Algorithms never import an engine; the embedded simulator and the Flower adapters call these
same methods.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from fedhet.client import LocalResult, LocalTrainer
from fedhet.config import TrainConfig, coerce_value
from fedhet.errors import ConfigError
from fedhet.models.layers import ModelLayout
from fedhet.system.outcomes import Marginals, Outcomes, SystemModel


@dataclass
class ClientAssignment:
    """The server's instructions to one client for one round."""

    batch_size: int
    local_steps: int
    asked: bool = True


@dataclass
class RoundPlan:
    """The server's decisions for one round."""

    round: int
    deadline: float | None
    lr: float
    assignments: list[ClientAssignment]

    @property
    def batch_sizes(self) -> np.ndarray:
        return np.array([a.batch_size for a in self.assignments])


@dataclass
class RoundContext:
    """What the server knows when it aggregates: the plan, outcomes and their marginals."""

    plan: RoundPlan
    outcomes: Outcomes
    marginals: Marginals
    num_clients: int
    num_layers: int


@dataclass
class RunSetting:
    """What an algorithm may look at once, before round 1, to set up its server state: the
    run's shape, the system model, the clients' data sizes, and a trainer with the initial
    model (for algorithms that probe gradients before planning, e.g. ADEL-FL's warm-up)."""

    num_clients: int
    num_params: int
    rounds: int
    time_budget: float  # simulated seconds; 0 = none
    system: SystemModel
    client_sizes: np.ndarray
    trainer: LocalTrainer
    params: torch.Tensor
    buffers: torch.Tensor
    rng: np.random.Generator


@dataclass
class NoOptions:
    """Algorithms without options."""


class Algorithm:
    """Base class; subclasses set ``name``, ``Options`` and override the pieces they change."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    uses_deadline: ClassVar[bool] = True

    def __init__(self, options: Any, train: TrainConfig):
        self.options = options
        self.train = train

    # -- planning ---------------------------------------------------------------------
    def init_state(self, setting: RunSetting) -> dict:
        """Server memory kept across rounds (checkpointed with the run)."""
        return {}

    def reports(self, state: dict) -> dict[str, dict]:
        """Documents to write into the run directory as ``<name>.json`` (e.g. a plan)."""
        return {}

    def warnings(self, state: dict) -> list[str]:
        """Things the user must be told when the run starts (e.g. a planner fallback)."""
        return []

    def plan(self, round_index: int, state: dict, system: SystemModel, deadline: float | None) -> RoundPlan:
        """Default plan: every client, the configured batch and steps, the configured deadline
        (or ``None`` for algorithms that wait for all)."""
        assignment = [
            ClientAssignment(self.train.batch_size, self.train.local_steps) for _ in range(system.num_clients)
        ]
        return RoundPlan(
            round=round_index,
            deadline=deadline if self.uses_deadline else None,
            lr=self.train.lr_at(round_index),
            assignments=assignment,
        )

    # -- client ---------------------------------------------------------------------
    def local_update(
        self,
        trainer: LocalTrainer,
        params: torch.Tensor,
        buffers: torch.Tensor,
        client: int,
        assignment: ClientAssignment,
        depth: int,
        lr: float,
        rng: np.random.Generator,
    ) -> LocalResult | None:
        """Default client work: local SGD on layers ``depth..L``."""
        return trainer.train(
            params, buffers, client, depth, assignment.local_steps, assignment.batch_size, lr, rng
        )

    # -- server ---------------------------------------------------------------------
    def aggregate(
        self,
        params: torch.Tensor,
        buffers: torch.Tensor,
        updates: list[LocalResult],
        state: dict,
        context: RoundContext,
        layout: ModelLayout,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator adding an algorithm to the registry under ``cls.name``."""
    ALGORITHMS[cls.name] = cls
    return cls


def build_options(name: str, values: dict) -> Any:
    """Validate ``[algorithm]`` keys for algorithm ``name`` into its ``Options`` dataclass."""
    try:
        cls = ALGORITHMS[name]
    except KeyError:
        raise ConfigError(
            f"algorithm.name = {name!r}: unknown (known: {', '.join(sorted(ALGORITHMS))})"
        ) from None
    fields = {f.name: f for f in dataclasses.fields(cls.Options)}
    for key in values:
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(f"algorithm.{key}: unknown option for {name} (known: {known})")
    typed = {key: coerce_value(f"algorithm.{key}", v, fields[key].type) for key, v in values.items()}
    options = cls.Options(**typed)
    check = getattr(options, "validate", None)
    if check:
        check()
    return options
