"""Mid-round dropout: a client may fail while it works, wrapping any system model
(``[system] dropout = "hazard"``).

Presence wrappers (participation, availability) decide who starts a round; a client that
starts can still fail before it delivers, as FLGo's "connectivity" model and real devices
do (an app killed, a network lost). Client u fails at a time F_u ~ Exp(lambda_u) after the
round (or its start, on the event driver) begins, with ``dropout_hazard`` lambda_u in
failures per simulated second of work, the same for every client or one per client
(``dropout_hazards``, or the ``hazard`` column of a device-profile file). A client whose
delivered work would finish at f_u (the wrapped model's finish time, its upload included)
delivers iff F_u > f_u; a failed client delivers nothing and counts as absent for the round
(the server learns of the failure at F_u, which a wait-for-all round waits for).

Marginals: P[u delivers and reaches layer l] = E[1{d_u <= l} exp(-lambda_u f_u)] and
P[u delivers] = E[exp(-lambda_u f_u)], the expectations over the wrapped model's outcomes.
Where the wrapped model draws nothing (:attr:`SystemModel.deterministic`: per-step cost and
measured times without jitter, ``full``) this is the closed form exp(-lambda_u f_u) times
the wrapped model's indicator, computed exactly from one draw.
Otherwise it is estimated from ``dropout_marginal_draws`` draws of the wrapped model on a
fixed stream (the failure is integrated out exactly in each draw, so the only Monte-Carlo
error is the wrapped model's); the run folder's ``dropout.json`` says which.
p_l = prod_u (1 - P[u delivers and reaches l]) for models whose clients are independent
(failures are independent given the outcomes), else the draws' mean of that product.

Failure loses the work: fedhet's rules that use partial work (SALF, FedProx) get nothing
from a failed client, as from one that never started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedhet import seeding
from fedhet.checks import number_list
from fedhet.errors import ConfigError
from fedhet.registry import NoOptions, register
from fedhet.system.base import SystemContext, SystemModel
from fedhet.system.participation import PresenceWrapper
from fedhet.system.types import Marginals, Outcomes, Workload


@register("dropout", "none")
class NoDropout:
    """No wrapper: a client that starts its work delivers it."""

    name = "none"
    Options = NoOptions

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        return ctx.wrapped


@dataclass
class HazardOptions:
    """``dropout_hazard``: failures per simulated second of work, every client;
    ``dropout_hazards``: one per client instead; ``dropout_marginal_draws``: draws of the
    wrapped model for marginals with no closed form. Precedence: ``dropout_hazards``, then
    the device profiles' ``hazard`` column (``capability_profile = "devices"``), then
    ``dropout_hazard``."""

    dropout_hazard: float = 0.01
    dropout_hazards: list = field(default_factory=list)
    dropout_marginal_draws: int = 2000

    def validate(self) -> None:
        if not 0 <= self.dropout_hazard < float("inf"):
            raise ConfigError(f"system.dropout_hazard = {self.dropout_hazard}: must be >= 0 (per second)")
        number_list("system.dropout_hazards", self.dropout_hazards, 0.0, 1e12)
        if not 1 <= self.dropout_marginal_draws <= 1_000_000:
            raise ConfigError(
                f"system.dropout_marginal_draws = {self.dropout_marginal_draws}: must be in 1..1000000"
            )

    def validate_in(self, config) -> None:
        clients = config.data.num_clients
        if self.dropout_hazards and len(self.dropout_hazards) != clients:
            raise ConfigError(
                f"system.dropout_hazards: {len(self.dropout_hazards)} values given for {clients} clients"
            )


@register("dropout", "hazard")
class HazardDropout(PresenceWrapper):
    """Client u fails after F_u ~ Exp(hazard_u) seconds of work; it delivers iff it would
    finish first (see the module's docstring for the marginals)."""

    Options = HazardOptions

    def __init__(self, base: SystemModel, hazards: np.ndarray, draws: int = 2000, seed: int = 0):
        super().__init__(base)
        hazards = np.asarray(hazards, dtype=float)
        if hazards.shape != (base.num_clients,):
            raise ConfigError(f"system.dropout_hazards: {hazards.size} given for {base.num_clients} clients")
        if np.any(hazards < 0) or not np.all(np.isfinite(hazards)):
            raise ConfigError("system.dropout_hazards: every hazard must be finite and >= 0")
        self.hazards = hazards
        self.draws = int(draws)
        self.seed = int(seed)
        self.participation_prob = np.ones(base.num_clients)  # not used: marginals are our own
        self.name = f"{base.name}+dropout"
        self._cache: dict = {}
        self.estimated = False  # whether a marginal so far came from Monte-Carlo draws

    @classmethod
    def build(cls, options: HazardOptions, ctx: SystemContext) -> SystemModel:
        base = ctx.wrapped
        hazards = (
            np.asarray(options.dropout_hazards, float)
            if options.dropout_hazards
            else device_hazards(base, options.dropout_hazard)
        )
        return cls(base, hazards, options.dropout_marginal_draws, ctx.seed)

    @property
    def always_present(self) -> bool:
        return not self.hazards.any() and self.base.always_present

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        out = self.base.sample(work, rng)
        if not self.hazards.any():
            return out
        with np.errstate(divide="ignore"):
            failure = rng.exponential(1.0, size=self.num_clients) / self.hazards  # inf where 0
        failed = out.participates & (failure < out.finish_time)
        finish = np.where(failed, failure, out.finish_time)
        return Outcomes(out.participates & ~failed, out.depth, out.full_time, finish, out.steps_done)

    # -- marginals ----------------------------------------------------------------------
    def _survival_draws(self, work: Workload):
        """(reach, steps, survive) over draws of the wrapped model: reach[m, u, l] = 1{d_u <= l},
        steps[m, u, k] = 1{steps_done_u >= k}, survive[m, u] = 1{present} exp(-lambda_u f_u).
        One draw when the wrapped model's outcomes are deterministic for this workload."""
        key = _workload_key(work)
        if key in self._cache:
            return self._cache[key]
        rng = seeding.stream(self.seed, "dropout-marginals")
        L, K = self.num_layers, work.max_steps
        layers, ks = np.arange(1, L + 1), np.arange(1, K + 1)
        reach, steps, survive = [], [], []
        for _ in range(1 if self.base.deterministic else self.draws):  # one draw: the exact law
            out = self.base.sample(work, rng)
            reach.append(out.depth[:, None] <= layers[None, :])
            steps.append(out.steps_done[:, None] >= ks[None, :])
            survive.append(out.participates * np.exp(-self.hazards * out.finish_time))
        draws = (np.array(reach), np.array(steps), np.array(survive))
        self.estimated |= len(survive) > 1
        self._cache = {key: draws}  # rounds repeat one workload; keep the last only
        return draws

    def marginals(self, work: Workload) -> Marginals:
        if not self.hazards.any():
            return self.base.marginals(work)
        reach, steps, survive = self._survival_draws(work)
        weight = survive[:, :, None]
        reach_prob = (reach * weight).mean(axis=0)
        return Marginals(
            reach_prob=reach_prob,
            no_reach_prob=self._no_reach(reach, survive, np.ones(self.num_clients), reach_prob),
            participation_prob=survive.mean(axis=0),
            step_prob=(steps * weight).mean(axis=0),
        )

    def no_reach_given_presence(self, work: Workload, presence: np.ndarray) -> np.ndarray:
        if not self.hazards.any():
            return self.base.no_reach_given_presence(work, presence)
        reach, _, survive = self._survival_draws(work)
        reach_prob = (reach * survive[:, :, None]).mean(axis=0)
        return self._no_reach(reach, survive, np.asarray(presence, float), reach_prob)

    def _no_reach(self, reach, survive, presence, reach_prob) -> np.ndarray:
        """p_l: the product form for independent clients, else the draws' mean product."""
        if self.base.independent_clients:
            return np.prod(1.0 - presence[:, None] * reach_prob, axis=0)
        joint = 1.0 - presence[None, :, None] * reach * survive[:, :, None]
        return np.prod(joint, axis=1).mean(axis=0)

    def reports(self) -> dict[str, dict]:
        out = dict(self.base.reports())
        out["dropout"] = {
            "hazards": self.hazards.tolist(),
            "marginals": f"estimated from {self.draws} draws" if self.estimated else "exact",
        }
        return out


def device_hazards(base: SystemModel, default: float) -> np.ndarray:
    """Per-client hazards: the wrapped model's device profiles' ``hazard`` column where it
    has one (:mod:`fedhet.system.devices`), else ``default`` for every client."""
    profile = getattr(base, "device_hazards", None)
    hazards = profile() if callable(profile) else None
    return np.full(base.num_clients, float(default)) if hazards is None else np.asarray(hazards, float)


def _workload_key(work: Workload) -> tuple:
    def b(array):
        return None if array is None else np.asarray(array).tobytes()

    return (
        work.deadline, b(work.batch_sizes), b(work.local_steps), b(work.depth), work.start_time,
        b(work.upload_bytes), b(work.extra_gradients),
    )  # fmt: skip
