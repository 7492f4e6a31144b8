"""Depth-only system models (SALF AS4 and Sec. IV): they sample how far back-propagation got,
not times; the clock is implied from the depth (:func:`~fedhet.system.base.implied_full_time`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.checks import at_least, in_range
from fedhet.errors import ConfigError
from fedhet.registry import register
from fedhet.system.base import (
    SystemContext,
    SystemModel,
    _planned_reach,
    implied_full_time,
    piece_times,
    steps_from_depth,
)
from fedhet.system.numerics import random_subset_product
from fedhet.system.types import Marginals, Outcomes, Workload


class DepthOnlyModel(SystemModel):
    """Shared clock logic of models that sample depths directly: the sampled depth is how far
    a client's K steps of back-propagation got by the deadline; whole steps done and the
    implied time follow from it (:func:`steps_from_depth`, :func:`implied_full_time`)."""

    nominal_deadline = 1.0

    @property
    def times_pieces(self) -> bool:
        return True

    def _sample_depth(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _depth_reach(self) -> np.ndarray:
        """P[d_u <= l] of the sampled depth (U x L), before the planned d0 is applied."""
        raise NotImplementedError

    def sample(self, work, rng):
        L = self.num_layers
        depth = np.maximum(self._sample_depth(rng), work.depth)
        clock = work.deadline if work.deadline is not None else self.nominal_deadline
        steps = work.local_steps
        total = steps * (L + 1 - work.depth)
        full = implied_full_time(steps * (L + 1 - depth), total, clock)
        # the implied constant speed: (units done + 1/2) per `clock` seconds
        pieces = piece_times(clock / (steps * (L + 1 - depth) + 0.5), work, L)
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, steps.copy(), *pieces)
        done = steps_from_depth(depth, work, L)
        return Outcomes(self._everyone(), depth, full, np.minimum(full, work.deadline), done, *pieces)

    def marginals(self, work):
        if work.deadline is None:
            return self._full_marginals(work)
        L, U = self.num_layers, self.num_clients
        reach = self._depth_reach() * _planned_reach(work, L)
        return Marginals(reach, self._no_reach(reach), np.ones(U), self._step_prob(reach, work))

    def _no_reach(self, reach: np.ndarray) -> np.ndarray:
        return np.prod(1.0 - reach, axis=0)

    def _step_prob(self, reach: np.ndarray, work: Workload) -> np.ndarray:
        """steps_done >= k  <=>  d <= L + 1 - ceil(k (L+1-d0) / K), read off ``reach``."""
        L = self.num_layers
        k = np.arange(1, work.max_steps + 1)[None, :]
        K = work.local_steps[:, None]
        per_step = (L + 1 - work.depth)[:, None]
        layer = L + 1 - np.ceil(k * per_step / K).astype(int)  # 1..L for k <= K
        rows = np.arange(self.num_clients)[:, None]
        prob = reach[rows, np.clip(layer, 1, L) - 1]
        return np.where(k <= K, prob, 0.0)


class DeadlineDepthModel(DepthOnlyModel):
    """A depth-only model whose rounds last the configured deadline when nothing shorter."""

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        # the concrete models (subclasses) take the deadline
        return cls(ctx.num_clients, ctx.num_layers, deadline=ctx.deadline)  # type: ignore[call-arg]


@register("system_model")
class NoStragglers(DeadlineDepthModel):
    """Every client does all its work; each round lasts ``deadline`` (default 1 s).

    The system of the FedStale experiments, where heterogeneity is in participation only
    (wrap it in Bernoulli participation).
    """

    name = "full"

    def __init__(self, num_clients: int, num_layers: int, deadline: float = 1.0):
        super().__init__(num_clients, num_layers)
        self.nominal_deadline = deadline

    @property
    def deterministic(self) -> bool:
        return True

    def sample(self, work, rng):
        clock = work.deadline if work.deadline is not None else self.nominal_deadline
        done = np.full(self.num_clients, float(clock))
        units = work.local_steps * (self.num_layers + 1 - work.depth)  # spread over the round
        pieces = piece_times(clock / units, work, self.num_layers)
        return Outcomes(self._everyone(), work.depth.copy(), done, done, work.local_steps.copy(), *pieces)

    def marginals(self, work):
        return self._full_marginals(work)


@register("system_model")
class UniformDepth(DeadlineDepthModel):
    """SALF AS4: d_u ~ Uniform{1..L+1}, i.i.d. over clients and rounds.

    P[reach l] = l / (L+1); p_l = (1 - l/(L+1))^U (SALF eq. (10)).
    """

    name = "uniform-depth"

    def __init__(self, num_clients: int, num_layers: int, deadline: float = 1.0):
        super().__init__(num_clients, num_layers)
        self.nominal_deadline = deadline

    def _sample_depth(self, rng):
        return rng.integers(1, self.num_layers + 2, size=self.num_clients)

    def _depth_reach(self):
        L, U = self.num_layers, self.num_clients
        return np.tile(np.arange(1, L + 1) / (L + 1), (U, 1))  # SALF Lemma 1, eq. (10)


@dataclass
class StragglerRatioOptions:
    """``straggler_ratio``: the share of stragglers; ``fixed_stragglers``: draw the set once;
    ``straggler_min_depth``: a straggler's depth is uniform on min_depth..L+1."""

    straggler_ratio: float = 0.5
    fixed_stragglers: bool = False
    straggler_min_depth: int = 2

    def validate(self) -> None:
        in_range("system.straggler_ratio", self.straggler_ratio, 0.0, 1.0)
        at_least("system.straggler_min_depth", self.straggler_min_depth, 1)


@register("system_model")
class StragglerRatio(DepthOnlyModel):
    """SALF Sec. IV: round(ratio * U) stragglers; others compute every layer.

    The straggler set is drawn uniformly each round, or once for the run with
    ``fixed_stragglers`` (as the authors' code does). A straggler's depth is uniform on
    ``{min_depth..L+1}`` (default 2: it did not finish). p_l is 0 whenever some client is not
    a straggler, else prod over stragglers of P[d > l].
    """

    name = "straggler-ratio"
    Options = StragglerRatioOptions

    @classmethod
    def build(cls, options: StragglerRatioOptions, ctx: SystemContext) -> SystemModel:
        return cls(
            ctx.num_clients,
            ctx.num_layers,
            options.straggler_ratio,
            fixed_stragglers=options.fixed_stragglers,
            min_depth=options.straggler_min_depth,
            deadline=ctx.deadline,
            rng=ctx.stream("system-setup"),
        )

    def __init__(
        self,
        num_clients: int,
        num_layers: int,
        straggler_ratio: float,
        fixed_stragglers: bool = False,
        min_depth: int = 2,
        deadline: float = 1.0,
        rng: np.random.Generator | None = None,
    ):
        super().__init__(num_clients, num_layers)
        if not 0.0 <= straggler_ratio <= 1.0:
            raise ConfigError(f"system.straggler_ratio = {straggler_ratio}: must be in [0, 1]")
        if not 1 <= min_depth <= num_layers + 1:
            raise ConfigError(
                f"system.straggler_min_depth = {min_depth}: must be in 1..{num_layers + 1} (L + 1)"
            )
        self.num_stragglers = int(round(straggler_ratio * num_clients))
        self.min_depth = min_depth
        self.nominal_deadline = deadline
        self.fixed: np.ndarray | None = None
        if fixed_stragglers:
            rng = rng if rng is not None else np.random.default_rng(0)
            self.fixed = np.zeros(num_clients, dtype=bool)
            self.fixed[rng.choice(num_clients, self.num_stragglers, replace=False)] = True

    def _sample_depth(self, rng):
        U, L = self.num_clients, self.num_layers
        if self.fixed is not None:
            is_straggler = self.fixed
        else:
            is_straggler = np.zeros(U, dtype=bool)
            is_straggler[rng.choice(U, self.num_stragglers, replace=False)] = True
        straggler_depth = rng.integers(self.min_depth, L + 2, size=U)
        return np.where(is_straggler, straggler_depth, 1)

    def _straggler_reach(self) -> np.ndarray:
        L, lo = self.num_layers, self.min_depth
        layers = np.arange(1, L + 1)
        return np.clip(layers - lo + 1, 0, None) / (L + 2 - lo)

    def _depth_reach(self):
        U = self.num_clients
        if self.fixed is not None:
            share = self.fixed.astype(float)[:, None]
        else:
            share = np.full((U, 1), self.num_stragglers / U)
        return (1.0 - share) + share * self._straggler_reach()[None, :]

    def _no_reach(self, reach):
        if self.fixed is None and self.num_stragglers < self.num_clients:
            # a non-straggler reaches every planned layer (exact when all plan the same d0)
            return np.where((reach > 0).any(axis=0), 0.0, 1.0)
        if self.fixed is None:
            return (1.0 - self._straggler_reach()) ** self.num_clients
        return np.prod(1.0 - reach, axis=0)

    @property
    def independent_clients(self) -> bool:
        return self.fixed is not None  # a set drawn each round couples the clients

    def no_reach_given_presence(self, work, presence):
        """With a fixed straggler set clients are independent (product form). With a set
        drawn each round, average over the C(U, k) equally likely sets: the sum over sets S of
        prod_{u in S} (1 - q_u s_l) prod_{u not in S} (1 - q_u) is an elementary symmetric
        sum, computed by dynamic programming over clients."""
        if work.deadline is None or self.fixed is not None:
            return super().no_reach_given_presence(work, presence)
        q = np.asarray(presence, float)
        k, s_reach = self.num_stragglers, self._straggler_reach()
        out = np.empty(self.num_layers)
        for layer, s in enumerate(s_reach):
            out[layer] = random_subset_product(1.0 - q * s, 1.0 - q, k)
        return out
