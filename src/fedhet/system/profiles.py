"""Per-client computational capability P_u (ADEL-FL Sec. 2: P_u samples per unit time).

Profiles: ``constant``, ``uniform`` (lo, hi), ``lognormal`` (mu, sigma), ``list`` (explicit
values). Capabilities are normalised to mean 1 unless ``normalise`` is false, so the
system's time scale lives in one place (``time_per_sample_layer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedhet.checks import number_list, one_of
from fedhet.errors import ConfigError

CAPABILITY_PROFILES = ("constant", "uniform", "lognormal", "list")


def capabilities(
    profile: str,
    num_clients: int,
    rng: np.random.Generator,
    low: float = 0.5,
    high: float = 1.5,
    mu: float = 0.0,
    sigma: float = 0.5,
    values: Sequence[float] = (),
    normalise: bool = True,
) -> np.ndarray:
    """Draw capabilities P_u > 0 for ``num_clients`` clients from ``profile``."""
    if profile == "constant":
        caps = np.ones(num_clients)
    elif profile == "uniform":
        if not 0 < low <= high:
            raise ConfigError(f"system.capability_low/high = {low}/{high}: need 0 < low <= high")
        caps = rng.uniform(low, high, size=num_clients)
    elif profile == "lognormal":
        if sigma < 0:
            raise ConfigError(f"system.capability_sigma = {sigma}: must be >= 0")
        caps = rng.lognormal(mu, sigma, size=num_clients)
    elif profile == "list":
        caps = np.asarray(values, dtype=float)
        if caps.shape != (num_clients,):
            raise ConfigError(f"system.capabilities: {caps.size} values given for {num_clients} clients")
        if np.any(caps <= 0):
            raise ConfigError("system.capabilities: every capability must be > 0")
    else:
        raise ConfigError(
            f"system.capability_profile = {profile!r}: unknown (known: {', '.join(CAPABILITY_PROFILES)})"
        )
    return caps / caps.mean() if normalise else caps


@dataclass
class CapabilityOptions:
    """The capability profile keys shared by the models with a time law (exponential,
    per-step, measured): ``capability_profile`` and its parameters."""

    capability_profile: str = "constant"
    capability_low: float = 0.5
    capability_high: float = 1.5
    capability_mu: float = 0.0
    capability_sigma: float = 0.5
    capabilities: list = field(default_factory=list)

    def validate(self) -> None:
        one_of("system.capability_profile", self.capability_profile, CAPABILITY_PROFILES)
        if not 0 < self.capability_low <= self.capability_high:
            raise ConfigError(
                f"system.capability_low/high = {self.capability_low}/{self.capability_high}: "
                "need 0 < low <= high"
            )
        if self.capability_sigma < 0:
            raise ConfigError(f"system.capability_sigma = {self.capability_sigma}: must be >= 0")
        if abs(self.capability_mu) > 50 or self.capability_sigma > 10:
            raise ConfigError(
                f"system.capability_mu/sigma = {self.capability_mu}/{self.capability_sigma}: "
                "need |mu| <= 50 and sigma <= 10 (capabilities exp(mu + sigma z) must stay finite)"
            )
        number_list("system.capabilities", self.capabilities, 0.0, 1e12, low_open=True)

    def validate_in(self, config) -> None:
        clients = config.data.num_clients
        if self.capability_profile == "list" and len(self.capabilities) != clients:
            raise ConfigError(
                f"system.capabilities: {len(self.capabilities)} values given for {clients} clients "
                "(capability_profile = 'list')"
            )

    def draw(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """The clients' capabilities P_u under this profile."""
        return capabilities(
            self.capability_profile,
            num_clients,
            rng,
            low=self.capability_low,
            high=self.capability_high,
            mu=self.capability_mu,
            sigma=self.capability_sigma,
            values=self.capabilities,
        )
