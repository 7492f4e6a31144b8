"""Per-client computational capability P_u (ADEL-FL Sec. 2: P_u samples per unit time).

Profiles: ``constant``, ``uniform`` (lo, hi), ``lognormal`` (mu, sigma), ``list`` (explicit
values). Capabilities are normalised to mean 1 unless ``normalise`` is false, so the
system's time scale lives in one place (``time_per_sample_layer``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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
