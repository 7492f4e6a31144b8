"""Correlated device populations (``system.device_correlation``): data size, speed and
availability have the Gaussian copula's rank correlations, the speeds and probabilities are
those of the independent draw handed to other owners, the energy account sees the same
device assignment as the system model, and 0 leaves every draw as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_config
from scipy.stats import spearmanr

from fedhet.errors import ConfigError
from fedhet.world import build_world

POPULATION = {
    "data.num_clients": 300,
    "data.partition": "quantity-skew",
    "data.size_distribution": "lognormal",
    "data.size_sigma": 1.0,
    "system.model": "per-step",
    "system.capability_profile": "lognormal",
    "system.participation": "uniform",
    "system.participation_low": 0.2,
    "system.participation_high": 0.9,
}


def population(correlation: float, **more):
    world = build_world(make_config({**POPULATION, "system.device_correlation": correlation, **more}))
    wrapper = world.system
    return world, world.client_sizes, wrapper.base.capabilities, wrapper.participation_prob


@pytest.mark.parametrize("rho", [0.8, -0.4])
def test_size_speed_and_availability_have_the_copulas_rank_correlations(rho):
    _, sizes, caps, probs = population(rho)
    expected = 6 / math.pi * math.asin(rho / 2)  # Spearman's rho of a Gaussian copula
    for a, b in ((sizes, caps), (sizes, probs), (caps, probs)):
        assert spearmanr(a, b).statistic == pytest.approx(expected, abs=0.1)


def test_the_speeds_and_probabilities_are_the_independent_draws_handed_to_other_owners():
    _, sizes0, caps0, probs0 = population(0.0)
    _, sizes, caps, probs = population(0.8)
    assert np.array_equal(sizes, sizes0)
    assert np.array_equal(np.sort(caps), np.sort(caps0))  # the same speeds, ranked
    assert not np.array_equal(caps, caps0)
    assert probs.min() >= 0.2 and probs.max() <= 0.9  # still uniform on [low, high]
    assert abs(spearmanr(sizes0, caps0).statistic) < 0.15  # 0: independent, as before


def test_the_energy_account_sees_the_devices_the_model_assigned(tmp_path):
    devices = tmp_path / "devices.csv"
    rows = [f"d{i},{0.001 * (i + 1)},1000000,1000000,{1.0 + i}" for i in range(8)]
    devices.write_text("device,compute,upload,download,compute_watts\n" + "\n".join(rows) + "\n")
    world, sizes, caps, _ = population(
        0.9, **{"system.capability_profile": "devices", "system.device_profiles": str(devices)}
    )
    compute_of = {f"d{i}": 0.001 * (i + 1) for i in range(8)}
    names = world.server_power.devices
    assert np.allclose([1 / compute_of[n] for n in names], caps)  # one assignment, both sides
    assert np.allclose(world.server_power.train, [1.0 + int(n[1:]) for n in names])
    assert spearmanr(sizes, caps).statistic > 0.6


def test_a_correlation_without_a_ranked_availability_is_refused():
    with pytest.raises(ConfigError, match=r"system.device_correlation = 0.5: .*two-group"):
        make_config({**POPULATION, "system.participation": "two-group", "system.device_correlation": 0.5})
    with pytest.raises(ConfigError, match=r"system.device_correlation = 1.5: must be in"):
        make_config({**POPULATION, "system.device_correlation": 1.5})


def test_a_correlation_with_nothing_to_tie_or_undoing_a_given_assignment_is_refused(tmp_path):
    """Client speeds all equal (or not drawn) and one availability for all: nothing to tie.
    Devices given in order, or one capability per client: ranking would undo them."""
    base = {**POPULATION, "system.device_correlation": 0.5}
    flat = {**base, "system.participation": "always", "system.capability_profile": "constant"}
    with pytest.raises(ConfigError, match=r"device_correlation = 0.5: ties nothing here: capability_profile"):
        make_config(flat)
    no_speeds = {**base, "system.model": "straggler-ratio", "system.participation": "always"}
    for key in [k for k in no_speeds if k.startswith("system.capabilit")]:
        no_speeds.pop(key)
    with pytest.raises(ConfigError, match=r"ties nothing here: system.model = 'straggler-ratio' draws no"):
        make_config(no_speeds)
    listed = {
        **base,
        "system.capability_profile": "list",
        "system.capabilities": [1.0 + i for i in range(12)],
    }
    with pytest.raises(ConfigError, match=r"would undo capability_profile = 'list'"):
        make_config({**listed, "data.num_clients": 12})
    devices = tmp_path / "d.csv"
    devices.write_text("device,compute,upload,download\na,0.001,1e6,1e6\nb,0.002,1e6,1e6\n")
    in_order = {**base, "system.capability_profile": "devices", "system.device_profiles": str(devices),
                "system.device_assignment": "in-order"}  # fmt: skip
    with pytest.raises(ConfigError, match=r"would undo device_assignment = 'in-order'"):
        make_config(in_order)
    make_config({**in_order, "system.device_assignment": "random"})  # drawn devices: ranked
