"""Outcome samplers: per round and client, participation, depth, local steps done and finish
time; and their marginals P[client u reaches layer l], p_l = P[no client reaches layer l] and
P[client u finishes k local steps].

Depth convention: layers 1..L input to output; a client with depth d
computed layers d..L of back-propagation; d = L + 1 means it computed nothing. "Reaches
layer l" means d <= l.

A model prices a round's whole :class:`Workload`: the deadline (``None`` = wait for
everyone: each client does all its work and the round lasts until the slowest finishes) and,
per client, the batch size, the number of local steps K and the planned coverage (first layer
d0 of its back-propagation, 1 = every layer). Models with a time law (exponential,
per-step) charge K steps K times one step. Depth-only models (full, uniform-depth,
straggler-ratio) have none: their depth law (SALF AS4, Sec. IV) is the outcome of whatever
work is asked, and the clock is implied from it (:func:`implied_full_time`).

A client that runs out of time can deliver its work in two ways, and every model says how
far it got in both:

- ``depth``: all K steps over the layers it reached, d..L (SALF's partial back-propagation);
- ``steps_done``: the number of whole steps over its planned layers d0..L (FedProx, FedNova).

Finishing everything (depth = d0 and steps_done = K) is the same event in both readings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedhet import seeding
from fedhet.registry import NoOptions
from fedhet.system.copula import Latents
from fedhet.system.types import Marginals, Outcomes, Workload


@dataclass
class SystemContext:
    """What a system model (or a wrapper) is built from: the run's shape, the configured
    per-round deadline, the run's seed (setup draws use named streams of it), a function
    that times the model on this host (the ``measured`` model), each client's data size and,
    for wrappers, ``base``: the model they wrap."""

    num_clients: int
    num_layers: int
    deadline: float = 1.0
    seed: int = 0
    measure: Callable[[], dict] | None = None
    base: SystemModel | None = None
    client_sizes: np.ndarray | None = None  # each client's training examples (client selection)
    latents: Latents | None = None  # a correlated population's latent scores (system.device_correlation)

    @property
    def speed(self) -> np.ndarray | None:
        """The clients' latent speed scores of a correlated population, else None."""
        return None if self.latents is None else self.latents.speed

    def stream(self, name: str) -> np.random.Generator:
        """A named random stream of the run's seed, for a model's setup draws."""
        return seeding.stream(self.seed, name)

    @property
    def wrapped(self) -> SystemModel:
        """The model a wrapper wraps (``base``; a wrapper is built only around one)."""
        if self.base is None:
            raise ValueError("a participation or availability wrapper is built around a system model")
        return self.base


class TimeLaw:
    """What a system model declares about time before anything is sampled. ``kind`` names
    the law; algorithms that plan against time (ADEL-FL, AMSFL) ask for the kind they need
    (:meth:`SystemModel.time_law`) instead of testing the model's class."""

    kind: str = ""


@dataclass(frozen=True)
class LayerTimeLaw(TimeLaw):
    """ADEL-FL A4: per-layer backward times ~ Exp(tau S_u / P_u)."""

    capabilities: np.ndarray
    time_per_sample_layer: float
    kind: str = "exponential-layers"

    def mean_layer_time(self, batch_sizes: np.ndarray) -> np.ndarray:
        """tau S_u / P_u, each client's mean per-layer backward time."""
        return self.time_per_sample_layer * np.asarray(batch_sizes, float) / self.capabilities


@dataclass(frozen=True)
class StepTimeLaw(TimeLaw):
    """AMSFL Sec. 3.4: c_i seconds per local step and b_i of communication."""

    step_time: Callable[[np.ndarray], np.ndarray]
    comm_times: Callable[[], np.ndarray]
    kind: str = "per-step"


class SystemModel:
    """Base class: ``sample`` draws outcomes, ``marginals`` gives their probabilities.

    A plug-in system model sets ``name`` and ``Options`` and implements ``build(options,
    ctx)`` (a :class:`SystemContext`), ``sample`` and ``marginals``. What it can answer
    beyond that is declared: :meth:`time_law`, :attr:`always_present`,
    :attr:`independent_clients`, :attr:`wall_clock`; wrappers pass them through."""

    name = "base"
    Options: type = NoOptions
    wall_clock = False  # True: clients cut their own work against a real deadline

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        """The model for a run (default: clients and layers only)."""
        return cls(ctx.num_clients, ctx.num_layers)

    def time_law(self) -> TimeLaw | None:
        """The law of time the model samples from, when it has one (None: depth-only)."""
        return None

    def full_times(self, work, rng) -> np.ndarray:
        """Each client's time for all of ``work`` (its ``full_time``), drawn with ``rng`` for
        a rule that plans from times (TimelyFL) and changing no state: a wrapper (presence,
        dropout, selection) answers with its wrapped model's, so a plan's draws neither
        count as rounds nor ask anyone."""
        return np.asarray(self.sample(work, rng).full_time, dtype=float)

    @property
    def always_present(self) -> bool:
        """Whether every client takes part in every round (no participation wrapper)."""
        return True

    @property
    def deterministic(self) -> bool:
        """Whether the outcomes of a workload are fixed (the model draws nothing): then one
        sample is their law (the dropout wrapper's exact marginals)."""
        return False

    @property
    def times_pieces(self) -> bool:
        """Whether :meth:`sample` says when each piece of the work is delivered
        (:attr:`Outcomes.layer_times`, :attr:`Outcomes.step_times`): what a failed client
        finished before failing (``system.dropout_keeps = "finished"``)."""
        return False

    @property
    def independent_clients(self) -> bool:
        """Whether clients' outcomes are drawn independently of each other (p_l has the
        product form of :meth:`no_reach_given_presence`)."""
        return True

    def __init__(self, num_clients: int, num_layers: int):
        self.num_clients = num_clients
        self.num_layers = num_layers

    def observe(self, updates) -> None:
        """Learn from a round's delivered updates (models that estimate their marginals)."""

    def state_dict(self) -> dict:
        """What :meth:`observe` learned, for checkpoints."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def reports(self) -> dict[str, dict]:
        """Documents for the run folder (e.g. measured layer times)."""
        return {}

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        raise NotImplementedError

    def marginals(self, work: Workload) -> Marginals:
        raise NotImplementedError

    def no_reach_given_presence(self, work: Workload, presence: np.ndarray) -> np.ndarray:
        """p_l = P[no client reaches layer l] when client u is present with probability
        ``presence[u]`` independently: prod_u (1 - presence_u P[d_u <= l]) for models whose
        clients are independent (ADEL-FL Lemma 1's product form)."""
        reach = self.marginals(work).reach_prob
        return np.prod(1.0 - np.asarray(presence, float)[:, None] * reach, axis=0)

    def _everyone(self) -> np.ndarray:
        return np.ones(self.num_clients, dtype=bool)

    def _full_marginals(self, work: Workload) -> Marginals:
        L, U = self.num_layers, self.num_clients
        reach = _planned_reach(work, L)
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(U), _steps_mask(work))


def _planned_reach(work: Workload, num_layers: int) -> np.ndarray:
    """1 where layer l is at or above the planned first layer d0, else 0 (U x L)."""
    return (np.arange(1, num_layers + 1)[None, :] >= work.depth[:, None]).astype(float)


def _steps_mask(work: Workload) -> np.ndarray:
    """P[steps_done >= k] when every client does all its steps: 1 for k <= K_u (U x max K)."""
    return (np.arange(1, work.max_steps + 1)[None, :] <= work.local_steps[:, None]).astype(float)


def piece_times(unit_time: np.ndarray, work: Workload, num_layers: int, offset=0.0) -> tuple:
    """(layer_times, step_times) of :class:`Outcomes` for a client that works at a constant
    speed: one layer of one step's back-propagation takes ``unit_time[u]`` and ``offset[u]``
    (its communication) is added to every piece. K partial steps reach layer l after
    K (L+1-l) units; k whole steps over the planned layers d0..L after k (L+1-d0)."""
    L, unit = num_layers, np.asarray(unit_time, float)[:, None]
    offset = np.broadcast_to(np.asarray(offset, float), unit[:, 0].shape)[:, None]
    layers = np.arange(1, L + 1)[None, :]
    units = work.local_steps[:, None] * (L + 1 - layers)
    layer_times = np.where(layers >= work.depth[:, None], offset + unit * units, np.inf)
    k = np.arange(1, work.max_steps + 1)[None, :]
    step_units = k * (L + 1 - work.depth)[:, None]
    step_times = np.where(k <= work.local_steps[:, None], offset + unit * step_units, np.inf)
    return layer_times, step_times


def implied_full_time(units_done: np.ndarray, units_total: np.ndarray, deadline: float) -> np.ndarray:
    """Time a client needs for all ``units_total`` layer-steps (one layer of one step's
    back-propagation each) when it finished ``units_done`` of them by ``deadline``.

    Depth-only models (uniform-depth, straggler-ratio) have no time law; we read a depth as a
    constant speed of (k + 1/2) / deadline layer-steps for k done (the midpoint of the speeds
    that give exactly k), so all the work takes units_total * deadline / (k + 1/2).
    """
    return units_total * deadline / (units_done + 0.5)


def steps_from_depth(depth: np.ndarray, work: Workload, num_layers: int) -> np.ndarray:
    """Whole steps over the planned layers d0..L that the compute of K partial steps over
    d..L pays for: floor(K (L+1-d) / (L+1-d0)), K when d = d0."""
    per_step = num_layers + 1 - work.depth
    return np.minimum(work.local_steps * (num_layers + 1 - depth) // per_step, work.local_steps)
