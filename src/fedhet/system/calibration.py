"""Deadlines calibrated to a target back-propagation depth (ADEL-FL Sec. 4)."""

from __future__ import annotations

import numpy as np

from fedhet.errors import ConfigError
from fedhet.system.base import LayerTimeLaw, SystemModel
from fedhet.system.types import Workload


def expected_depth_fraction(system: SystemModel, deadline: float, batch_sizes: np.ndarray) -> float:
    """Average over clients of the expected share of the L layers back-propagated by the
    deadline: mean_u sum_l P[u reaches l] / L."""
    reach = system.marginals(Workload(deadline, np.asarray(batch_sizes))).reach_prob
    return float(reach.sum(axis=1).mean() / system.num_layers)


def deadline_for_depth_fraction(system: SystemModel, batch_sizes: np.ndarray, fraction: float) -> float:
    """The per-round deadline at which clients back-propagate ``fraction`` of the layers on
    average (how ADEL-FL Sec. 4 sets T_max / R: 50% for MNIST, 85% for CIFAR-10)."""
    from scipy.optimize import brentq

    law = system.time_law()
    if not isinstance(law, LayerTimeLaw):
        raise ConfigError(f"system.model = {system.name!r}: depth calibration needs the exponential model")
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"depth fraction {fraction}: must be in (0, 1)")
    slowest = float(law.mean_layer_time(np.asarray(batch_sizes)).max())
    high = slowest * system.num_layers
    while expected_depth_fraction(system, high, batch_sizes) < fraction:
        high *= 2.0
    return float(brentq(lambda t: expected_depth_fraction(system, t, batch_sizes) - fraction, 1e-12, high))
