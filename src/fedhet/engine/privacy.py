"""Client-level privacy accounting of the ``clip-noise`` postprocessor, with ``dp-accounting``.

``clip-noise`` clips each client's update to L2 norm C and adds N(0, (z C)^2) to every
element before it leaves the client (McMahan et al., "Learning Differentially Private
Recurrent Language Models", arXiv 1710.06963, the per-client clipping and Gaussian noise of
DP-FedAvg, here applied on the client). Each update a client sends is then a Gaussian
mechanism with noise multiplier z on that client's data. Every server step that receives
``n`` noised updates out of ``N`` clients is one release, and the run composes them. How
much a release costs depends on how clients came to be in it, three readings:

- ``no-amplification``: no credit for sampling; every release is Gaussian(z) for the clients
  in it (sound whatever decides who takes part);
- ``poisson``: each client included independently at the realised rate q = n / N (the
  amplification DP-FedAvg's analysis uses; add-or-remove-one neighbours);
- ``without-replacement``: n of the N drawn uniformly (replace-one neighbours).

The two amplification readings assume the server's sampling is uniform and secret. Under
deadlines and availability (stragglers dropped by speed, presence tied to the device) it
is neither, so only ``no-amplification`` is a guarantee here; the others are printed for
comparison with papers that assume them. Each client's own epsilon composes only the
releases it took part in (its realised participations, Gaussian(z) each).

Epsilons come from Renyi DP (``dp_accounting.rdp``, integer orders 2-64; each distinct
release's RDP computed once and summed, as composition adds RDP) and, at the run's end, from
privacy loss distributions (``dp_accounting.pld``; ``without-replacement`` has none there).
The account's state (the releases' sizes and each client's participations) is run state,
so a resumed run goes on counting.
"""

from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np

from fedhet.engine.clock import Budget

READINGS = ("no-amplification", "poisson", "without-replacement")
ORDERS = tuple(float(order) for order in range(2, 65))


def _library():
    try:
        from dp_accounting import dp_event, pld, privacy_accountant, rdp
    except ImportError:
        from fedhet.errors import FedhetError

        raise FedhetError(
            "clip-noise's privacy accounting needs dp-accounting: pip install 'fedhet[privacy]'"
        ) from None
    return dp_event, privacy_accountant, rdp, pld


def release_event(reading: str, noise_multiplier: float, size: int, population: int):
    """The dp-accounting event of one release of ``size`` noised updates of ``population``
    clients under ``reading``, and the neighbouring relation it is accounted under."""
    dp_event, accountant, _, _ = _library()
    gaussian = dp_event.GaussianDpEvent(noise_multiplier)
    relation = accountant.NeighboringRelation
    if reading == "poisson":
        return dp_event.PoissonSampledDpEvent(size / population, gaussian), relation.ADD_OR_REMOVE_ONE
    if reading == "without-replacement":
        return dp_event.SampledWithoutReplacementDpEvent(population, size, gaussian), relation.REPLACE_ONE
    return gaussian, relation.ADD_OR_REMOVE_ONE


@functools.lru_cache(maxsize=512)
def release_rdp(reading: str, noise_multiplier: float, size: int, population: int) -> tuple[float, ...]:
    """One release's Renyi DP at :data:`ORDERS` (computed once per distinct release)."""
    _, _, rdp, _ = _library()
    event, relation = release_event(reading, noise_multiplier, size, population)
    return tuple(rdp.RdpAccountant(list(ORDERS), relation).compose(event).rdp)


def rdp_epsilon(
    releases: Counter, reading: str, noise_multiplier: float, population: int, delta: float
) -> float:
    """Epsilon at ``delta`` of the releases (size -> how many) composed under ``reading``."""
    if not releases:
        return 0.0
    _, _, rdp, _ = _library()
    total = np.zeros(len(ORDERS))
    for size, count in releases.items():
        total += count * np.asarray(release_rdp(reading, noise_multiplier, int(size), population))
    epsilon, _ = rdp.compute_epsilon(list(ORDERS), total.tolist(), delta)
    return float(epsilon)


def pld_epsilon(
    releases: Counter, reading: str, noise_multiplier: float, population: int, delta: float
) -> float | None:
    """The same from privacy loss distributions (None where dp-accounting's PLD
    accountant does not take the reading's event)."""
    if not releases:
        return 0.0
    _, _, _, pld = _library()
    events = [(release_event(reading, noise_multiplier, int(s), population), c) for s, c in releases.items()]
    accountant = pld.PLDAccountant(events[0][0][1])
    if not all(accountant.supports(event) for (event, _), _ in events):
        return None
    for (event, _), count in events:
        accountant.compose(event, count)
    return float(accountant.get_epsilon(delta))


class PrivacyAccount(Budget):
    """The run's releases and each client's participations (in ``state``, the run state's
    per-client account), their epsilons, and ``run.epsilon_budget`` under ``reading``."""

    def __init__(self, state: dict, noise_multiplier: float, delta: float, population: int,
                 reading: str, budget: float = 0.0) -> None:  # fmt: skip
        state.setdefault("releases", [])  # per server step with noised updates: how many
        state.setdefault("participations", [0] * population)
        self.state, self.budget = state, budget
        self.counts = Counter(int(n) for n in state["releases"])  # size -> releases, kept as they come
        self.noise_multiplier, self.delta, self.population, self.reading = (
            noise_multiplier,
            delta,
            population,
            reading,
        )

    @property
    def used(self) -> float:
        return self.epsilon()

    def epsilon(self, reading: str | None = None, more: int = 0) -> float:
        """Epsilon at ``delta`` so far under ``reading`` (the account's by default), with
        ``more`` a further release of that many updates."""
        releases = self.counts
        if more:
            releases = Counter(self.counts)
            releases[more] += 1
        return rdp_epsilon(
            releases, reading or self.reading, self.noise_multiplier, self.population, self.delta
        )

    def row(self) -> dict[str, float]:
        """A metrics row's epsilons so far: ``epsilon`` (the account's reading, what the
        budget counts) and each reading's by Renyi DP."""
        readings = {f"epsilon_{r.replace('-', '_')}": self.epsilon(r) for r in READINGS}
        return {"epsilon": readings[f"epsilon_{self.reading.replace('-', '_')}"], **readings}

    def record(self, clients: list[int]) -> None:
        """A server step received noised updates from ``clients``."""
        if not clients:
            return
        self.state["releases"].append(len(clients))
        self.counts[len(clients)] += 1
        for client in clients:
            self.state["participations"][client] = int(self.state["participations"][client]) + 1

    def fits_another(self) -> bool:
        """Whether a release like the last one still ends within the budget (exact under
        ``no-amplification``, where every release costs the same)."""
        last = int(self.state["releases"][-1]) if self.state["releases"] else self.population
        epsilon = self.epsilon(more=last)
        ok = not self.budget or epsilon <= self.budget
        if not ok:
            self.refused = epsilon
        return ok

    def client_epsilons(self) -> list[float]:
        """Each client's epsilon from its own participations (Gaussian(z) each, composed)."""
        return [
            rdp_epsilon(
                Counter({1: int(k)}), "no-amplification", self.noise_multiplier, self.population, self.delta
            )
            for k in self.state["participations"]
        ]

    def summary(self) -> dict:
        """summary.json's privacy numbers: every reading by RDP and PLD, the clients'."""
        releases = self.counts
        args = (self.noise_multiplier, self.population, self.delta)
        out: dict = {"privacy_reading": self.reading, "epsilon": self.epsilon(), "delta": self.delta,
                     "noise_multiplier": self.noise_multiplier,
                     "releases": sum(releases.values())}  # fmt: skip
        for reading in READINGS:
            key = reading.replace("-", "_")
            out[f"epsilon_rdp_{key}"] = rdp_epsilon(releases, reading, *args)
            out[f"epsilon_pld_{key}"] = pld_epsilon(releases, reading, *args)
        clients = self.client_epsilons()
        out.update(
            epsilon_client_max=max(clients, default=0.0), epsilon_client_median=float(np.median(clients))
        )
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def privacy_account(config, world, state) -> PrivacyAccount | None:
    """The run's account when its trainer noises updates (a ``clip-noise`` postprocessor
    with z > 0), else None; ``run.epsilon_budget`` without one, or below what one release
    costs, is refused in one line."""
    from fedhet.errors import ConfigError

    budget = config.run.epsilon_budget
    noising = [
        p for p in world.worker.postprocessors if p.name == "clip-noise" and p.options.noise_multiplier > 0
    ]
    if not noising:
        if budget:
            raise ConfigError(
                f"run.epsilon_budget = {budget:g}: the run adds no noise to account (give train.postprocess "
                "a clip-noise step with noise_multiplier > 0)"
            )
        return None
    options = noising[-1].options
    account = PrivacyAccount(state.energy, options.noise_multiplier, options.delta, world.num_clients,
                             options.accounting, budget)  # fmt: skip
    first = rdp_epsilon(
        Counter({1: 1}), "no-amplification", options.noise_multiplier, world.num_clients, options.delta
    )
    if budget and not state.energy["releases"] and first > budget:
        raise ConfigError(
            f"run.epsilon_budget = {budget:g}: less than one round's release costs (epsilon {first:.4g} at "
            f"delta {options.delta:g}, noise_multiplier {options.noise_multiplier:g}); no round would run"
        )
    return account
