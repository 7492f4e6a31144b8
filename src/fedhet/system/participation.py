"""Bernoulli client participation (FedStale Assumption 4), combinable with any straggler model.

Each round client i is present with probability p_i, independently of other clients and
rounds. A present client then meets the wrapped system model as usual (it may still be slow
and deliver only part of its work), so "absent" and "present and slow" are distinct outcomes.

Profiles of p_i: ``always`` (no wrapper), ``two-group`` (half the clients always present, the
other half with ``p_min``, FedStale Sec. 5.1), ``uniform`` (p_i ~ U(low, high)), ``list``.

``cohort`` (:class:`CohortSampling`) is FedAvg's usual client sampling instead: exactly K
clients drawn uniformly without replacement each round (p_i = K/N, not independent).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhet.checks import in_range, number_list, one_of
from fedhet.errors import ConfigError
from fedhet.registry import PLUGIN_CONTRACT, register
from fedhet.system.base import NoOptions, SystemContext, SystemModel
from fedhet.system.numerics import random_subset_product
from fedhet.system.types import Marginals, Outcomes

PARTICIPATION_PROFILES = ("always", "two-group", "uniform", "list", "cohort")
PARTICIPATION_GROUPS = ("random", "second-half")


def participation_probabilities(
    profile: str,
    num_clients: int,
    rng: np.random.Generator,
    p_min: float = 0.1,
    low: float = 0.1,
    high: float = 1.0,
    values: Sequence[float] = (),
    group: str = "random",
) -> np.ndarray:
    """Per-client participation probabilities p_i for ``profile``.

    ``two-group``: ``num_clients // 2`` clients participate always (p = 1) and the others with
    ``p_min``; ``group = "random"`` draws which clients are rare, ``"second-half"`` makes
    clients ``N//2 .. N-1`` rare (the FedStale authors' code, whose rare clients are also the
    label-swapped second group).
    """
    if profile == "always":
        return np.ones(num_clients)
    if profile == "two-group":
        if not 0.0 < p_min <= 1.0:
            raise ConfigError(f"system.participation_min = {p_min}: must be in (0, 1]")
        if group not in PARTICIPATION_GROUPS:
            raise ConfigError(
                f"system.participation_group = {group!r}: unknown (known: {', '.join(PARTICIPATION_GROUPS)})"
            )
        probs = np.ones(num_clients)
        if group == "second-half":
            rare = np.arange(num_clients // 2, num_clients)
        else:
            rare = rng.choice(num_clients, num_clients - num_clients // 2, replace=False)
        probs[rare] = p_min
        return probs
    if profile == "uniform":
        if not 0.0 < low <= high <= 1.0:
            raise ConfigError(f"system.participation_low/high = {low}/{high}: need 0 < low <= high <= 1")
        return rng.uniform(low, high, size=num_clients)
    if profile == "list":
        probs = np.asarray(values, dtype=float)
        if probs.shape != (num_clients,):
            raise ConfigError(
                f"system.participation_probs: {probs.size} values given for {num_clients} clients"
            )
        if np.any(probs <= 0) or np.any(probs > 1):
            raise ConfigError("system.participation_probs: every probability must be in (0, 1]")
        return probs
    raise ConfigError(
        f"system.participation = {profile!r}: unknown (known: {', '.join(PARTICIPATION_PROFILES)})"
    )


@register("participation", "always")
@register("availability", "always")
class Always:
    """No wrapper: every client is present in every round."""

    name = "always"
    Options = NoOptions

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        return ctx.wrapped


class PresenceWrapper(SystemModel):
    """Shared by the wrappers that decide who is present (Bernoulli participation,
    availability traces): a present client's depth and time come from the wrapped model.

    Marginals: P[u present and reaches l] = p_u P[d_u <= l]; p_l = P[no present client reaches
    l] from the wrapped model's :meth:`no_reach_given_presence`; participation_prob = p_u.
    Subclasses set ``participation_prob`` (p_u) and implement :meth:`present`.
    """

    participation_prob: np.ndarray

    def __init__(self, base: SystemModel):
        super().__init__(base.num_clients, base.num_layers)
        self.base = base

    def present(self, work, rng) -> np.ndarray:
        raise NotImplementedError

    def sample(self, work, rng) -> Outcomes:
        present = self.present(work, rng)
        out = self.base.sample(work, rng)
        return dataclasses.replace(out, participates=out.participates & present)

    def marginals(self, work) -> Marginals:
        inner = self.base.marginals(work)
        p = self.participation_prob
        return Marginals(
            reach_prob=inner.reach_prob * p[:, None],
            no_reach_prob=self.base.no_reach_given_presence(work, p),
            participation_prob=inner.participation_prob * p,
            step_prob=None if inner.step_prob is None else inner.step_prob * p[:, None],
        )

    def no_reach_given_presence(self, work, presence):
        return self.base.no_reach_given_presence(work, presence * self.participation_prob)

    @property
    def always_present(self) -> bool:
        return False

    @property
    def deterministic(self) -> bool:
        return False  # presence is drawn

    @property
    def times_pieces(self) -> bool:
        return self.base.times_pieces

    def observe(self, updates) -> None:
        self.base.observe(updates)

    def wrapper_state_dict(self) -> dict:
        """The wrapper's own state (what it learned or drew beyond the wrapped model's);
        checkpointed beside the wrapped model's. None by default."""
        return {}

    def load_wrapper_state_dict(self, state: dict) -> None:
        """Restore what :meth:`wrapper_state_dict` returned."""

    def state_dict(self) -> dict:
        own, inner = self.wrapper_state_dict(), self.base.state_dict()
        return {WRAPPED: inner, WRAPPER: own} if own else inner

    def load_state_dict(self, state: dict) -> None:
        if WRAPPED in state:
            self.base.load_state_dict(state[WRAPPED])
            self.load_wrapper_state_dict(state.get(WRAPPER, {}))
        else:
            self.base.load_state_dict(state)

    def reports(self) -> dict[str, dict]:
        return self.base.reports()


WRAPPED, WRAPPER = "__wrapped__", "__wrapper__"
# A presence wrapper answers what it defines itself (sample, marginals, presence, its
# state, ...) and what makes it a plug-in (PLUGIN_CONTRACT); every other public attribute of
# SystemModel (a declared capability: time_law, wall_clock, independent_clients, step_time,
# ... and any added later) is the wrapped model's, forwarded below.


def _forward(name: str, value):
    if isinstance(value, property) or not callable(value):
        return property(lambda self: getattr(self.base, name), doc=f"The wrapped model's ``{name}``.")

    def method(self, *args, **kwargs):
        return getattr(self.base, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"The wrapped model's ``{name}``."
    return method


for _name, _value in vars(SystemModel).items():
    if not _name.startswith("_") and _name not in PLUGIN_CONTRACT and _name not in vars(PresenceWrapper):
        setattr(PresenceWrapper, _name, _forward(_name, _value))


class BernoulliParticipation(PresenceWrapper):
    """Wraps a system model: client i is present with probability p_i each round (FedStale
    Assumption 4), independently of everything else."""

    def __init__(self, base: SystemModel, participation_prob: np.ndarray):
        super().__init__(base)
        probs = np.asarray(participation_prob, dtype=float)
        if probs.shape != (base.num_clients,):
            raise ConfigError(
                f"participation probabilities: {probs.size} given for {base.num_clients} clients"
            )
        self.participation_prob = probs
        self.name = f"{base.name}+bernoulli"

    @staticmethod
    def probabilities(options: Any, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Each client's participation probability p_i, drawn once at setup (subclasses)."""
        raise NotImplementedError

    def present(self, work, rng) -> np.ndarray:
        return rng.random(self.num_clients) < self.participation_prob  # FedStale Assumption 4

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        probs = cls.probabilities(options, ctx.num_clients, ctx.stream("participation-setup"))
        if ctx.latents is not None:
            probs = cls.correlated(options, probs, ctx.latents.availability)
        return cls(ctx.wrapped, probs)

    @staticmethod
    def correlated(options: Any, probs: np.ndarray, latent: np.ndarray) -> np.ndarray:
        """The probabilities of a correlated population (:mod:`fedhet.system.copula`): as
        drawn, for the profiles that the copula does not rank (uniform does)."""
        return probs


@dataclass
class TwoGroupOptions:
    """Half the clients always present, the others with ``participation_min``; which half is
    rare: ``participation_group`` = "random" or "second-half"."""

    participation_min: float = 0.1
    participation_group: str = "random"

    def validate(self) -> None:
        in_range("system.participation_min", self.participation_min, 0.0, 1.0, low_open=True)
        one_of("system.participation_group", self.participation_group, PARTICIPATION_GROUPS)


@register("participation")
class TwoGroupParticipation(BernoulliParticipation):
    """FedStale Sec. 5.1: two groups, p = 1 and p = ``participation_min``."""

    name = "two-group"
    Options = TwoGroupOptions

    @staticmethod
    def probabilities(options: TwoGroupOptions, num_clients: int, rng) -> np.ndarray:
        return participation_probabilities(
            "two-group", num_clients, rng, p_min=options.participation_min, group=options.participation_group
        )


@dataclass
class UniformParticipationOptions:
    """p_i ~ U(``participation_low``, ``participation_high``)."""

    participation_low: float = 0.1
    participation_high: float = 1.0

    def validate(self) -> None:
        in_range("system.participation_low", self.participation_low, 0.0, 1.0, low_open=True)
        in_range("system.participation_high", self.participation_high, 0.0, 1.0, low_open=True)
        if self.participation_low > self.participation_high:
            raise ConfigError(
                f"system.participation_low/high = {self.participation_low}/{self.participation_high}: "
                "need low <= high"
            )


@register("participation", "uniform")
class UniformParticipation(BernoulliParticipation):
    """p_i drawn uniformly in [low, high] once per run."""

    name = "uniform"
    Options = UniformParticipationOptions

    @staticmethod
    def probabilities(options, num_clients: int, rng) -> np.ndarray:
        return participation_probabilities(
            "uniform", num_clients, rng, low=options.participation_low, high=options.participation_high
        )

    @staticmethod
    def correlated(options: Any, probs: np.ndarray, latent: np.ndarray) -> np.ndarray:
        """low + (high - low) Phi(z^avail_u): uniform on [low, high], ranked by the latent."""
        from scipy.stats import norm

        low, high = options.participation_low, options.participation_high
        return low + (high - low) * norm.cdf(latent)


@dataclass
class ListParticipationOptions:
    """``participation_probs``: p_i of every client, in (0, 1]."""

    participation_probs: list = field(default_factory=list)

    def validate(self) -> None:
        number_list("system.participation_probs", self.participation_probs, 0.0, 1.0, low_open=True)

    def validate_in(self, config) -> None:
        clients = config.data.num_clients
        if len(self.participation_probs) != clients:
            raise ConfigError(
                f"system.participation_probs: {len(self.participation_probs)} values given for "
                f"{clients} clients (participation = 'list')"
            )


@register("participation", "list")
class ListParticipation(BernoulliParticipation):
    """p_i given one per client."""

    name = "list"
    Options = ListParticipationOptions

    @staticmethod
    def probabilities(options, num_clients: int, rng) -> np.ndarray:
        return participation_probabilities("list", num_clients, rng, values=options.participation_probs)


@dataclass
class CohortOptions:
    """``cohort_size`` K: clients drawn per round, uniformly without replacement."""

    cohort_size: int = 10

    def validate_in(self, config) -> None:
        clients = config.data.num_clients
        if not 1 <= self.cohort_size <= clients:
            raise ConfigError(
                f"system.cohort_size = {self.cohort_size}: must be in 1..{clients} (data.num_clients)"
            )


@register("participation", "cohort")
class CohortSampling(PresenceWrapper):
    """Wraps a system model: each round exactly ``cohort_size`` clients, drawn uniformly
    without replacement, are present (FedAvg's client sampling, McMahan et al. 2017); the
    marginal participation probability is K/N.

    Presence is not independent across clients, so p_l = P[no present client reaches l] is
    the mean over the C(N, K) equally likely cohorts of prod_{u in cohort} (1 - P[d_u <= l]),
    an elementary symmetric sum (:func:`random_subset_product`), not the product form."""

    def __init__(self, base: SystemModel, cohort_size: int):
        super().__init__(base)
        if not 1 <= cohort_size <= base.num_clients:
            raise ConfigError(
                f"system.cohort_size = {cohort_size}: must be in 1..{base.num_clients} (the clients)"
            )
        if not base.independent_clients:
            raise ConfigError(
                f"system.participation = 'cohort' with {base.name}: its clients' outcomes are drawn "
                "jointly (a straggler set per round), so the cohort's p_l has no exact form here; "
                "use fixed_stragglers = true or Bernoulli participation"
            )
        self.cohort_size = int(cohort_size)
        self.participation_prob = np.full(base.num_clients, cohort_size / base.num_clients)
        self.name = f"{base.name}+cohort"

    Options = CohortOptions

    @classmethod
    def build(cls, options: CohortOptions, ctx: SystemContext) -> SystemModel:
        return cls(ctx.wrapped, options.cohort_size)

    @property
    def independent_clients(self) -> bool:
        return False  # exactly K present couples the clients

    def present(self, work, rng) -> np.ndarray:
        present = np.zeros(self.num_clients, dtype=bool)
        present[rng.choice(self.num_clients, self.cohort_size, replace=False)] = True
        return present

    def marginals(self, work) -> Marginals:
        inner = self.base.marginals(work)
        out = super().marginals(work)
        out.no_reach_prob = self.no_reach_given_presence(work, np.ones(self.num_clients), inner.reach_prob)
        return out

    def no_reach_given_presence(self, work, presence, reach=None):
        """P[no client reaches layer l] when, on top of the cohort draw, client u is present
        with probability ``presence[u]`` independently."""
        if reach is None:
            reach = self.base.marginals(work).reach_prob
        return cohort_no_reach(reach, presence, self.cohort_size)


def cohort_no_reach(reach: np.ndarray, presence: np.ndarray, cohort_size: int) -> np.ndarray:
    """p_l = P[no client of a uniform cohort of ``cohort_size`` reaches layer l], client u
    reaching it with probability ``reach[u, l]`` and present with ``presence[u]``: the mean
    over the C(N, K) cohorts of prod (1 - presence_u reach_ul) (:func:`random_subset_product`)."""
    q = np.asarray(presence, float)
    num_clients, num_layers = reach.shape
    if np.all(reach == 1.0) and np.all(q == 1.0):
        return np.zeros(num_layers)  # every cohort member reaches every layer
    ones = np.ones(num_clients)
    return np.array(
        [random_subset_product(1.0 - q * reach[:, layer], ones, cohort_size) for layer in range(num_layers)]
    )
