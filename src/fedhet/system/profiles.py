"""Per-client computational capability P_u (ADEL-FL Sec. 2: P_u samples per unit time).

Profiles: ``constant``, ``uniform`` (lo, hi), ``lognormal`` (mu, sigma), ``list`` (explicit
values), normalised to mean 1 unless ``normalise`` is false, so the system's time scale lives
in one place (``time_per_sample_layer``); and ``devices``: each client's device from a
device-profile file (:mod:`fedhet.system.devices`), P_u = 1 / its seconds per example, not
normalised (the file's seconds are the clock's, times the model's time scale), with its
upload and download bandwidth and hazard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedhet.checks import number_list, one_of, path_option
from fedhet.errors import ConfigError
from fedhet.system.copula import by_rank
from fedhet.system.devices import DEVICE_ASSIGNMENTS, DeviceProfiles, read_device_profiles

CAPABILITY_PROFILES = ("constant", "uniform", "lognormal", "list", "devices")


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
    elif profile == "devices":
        raise ConfigError(
            "system.capability_profile = 'devices': the devices come from system.device_profiles"
        )
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
    capability_low: float = 0.5  # "uniform": P_u ~ U(low, high), normalised to mean 1
    capability_high: float = 1.5  # "uniform": the upper end
    capability_mu: float = 0.0  # "lognormal": P_u = exp(mu + sigma z), normalised to mean 1
    capability_sigma: float = 0.5  # "lognormal": the spread sigma
    capabilities: list = field(default_factory=list)  # "list": one capability P_u per client
    device_profiles: str = path_option()  # a device-profile file (capability_profile = "devices")
    device_assignment: str = "random"  # "devices": which client gets which device: random | in-order

    def validate(self) -> None:
        one_of("system.capability_profile", self.capability_profile, CAPABILITY_PROFILES)
        one_of("system.device_assignment", self.device_assignment, DEVICE_ASSIGNMENTS)
        if self.capability_profile == "devices" and not self.device_profiles:
            raise ConfigError(
                "system.capability_profile = 'devices' needs system.device_profiles (a device-profile file)"
            )
        if self.device_profiles and self.capability_profile != "devices":
            raise ConfigError(
                f"system.device_profiles = {self.device_profiles!r}: set capability_profile = 'devices' "
                f"to use it (it is {self.capability_profile!r})"
            )
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

    def devices(
        self, num_clients: int, rng: np.random.Generator, speed: np.ndarray | None = None
    ) -> DeviceProfiles | None:
        """Each client's device (``capability_profile = "devices"``), else None. ``rng`` is
        the same setup stream :meth:`draw` gets, so both see one assignment; ``speed``: the
        clients' latent speed scores of a correlated population (:mod:`fedhet.system.copula`):
        the drawn devices go to the clients by rank, the fastest to the largest score."""
        if self.capability_profile != "devices":
            return None
        profiles = read_device_profiles(self.device_profiles)
        assigned = profiles.assign(num_clients, self.device_assignment, rng)
        return assigned if speed is None else assigned.take(by_rank(-assigned.compute, speed))

    def draw(self, num_clients: int, rng: np.random.Generator, speed: np.ndarray | None = None) -> np.ndarray:
        """The clients' capabilities P_u under this profile (devices: 1 / seconds per
        example); with ``speed`` scores, handed out by rank as :meth:`devices` does."""
        devices = self.devices(num_clients, rng, speed)
        if devices is not None:
            return 1.0 / devices.compute
        caps = self._independent(num_clients, rng)
        return caps if speed is None else caps[by_rank(caps, speed)]

    def _independent(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
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
