"""Algorithms: plan / client tasks / client hooks / aggregate, registered by name."""

from fedhet.algorithms import (  # noqa: F401  (registration)
    adelfl,
    amsfl,
    asyncfl,
    ca2fl,
    depthfl,
    drop,
    fedasync,
    fedavg,
    fedbalancer,
    fedbuff,
    fedcompass,
    feddyn,
    fednova,
    fedprox,
    fiarse,
    fjord,
    heterofl,
    refl,
    salf,
    scaffold,
    server_opt,
    stale,
    timelyfl,
)
from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmContext,
    ClientAssignment,
    RoundContext,
    RoundPlan,
    RunSetting,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmContext",
    "ClientAssignment",
    "RoundContext",
    "RoundPlan",
    "RunSetting",
]
