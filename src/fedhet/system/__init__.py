"""System models: who finishes what by when, on the virtual clock (DESIGN ideas 1 and 3)."""

from fedhet.system.outcomes import (
    SYSTEM_MODELS,
    ExponentialLayers,
    Marginals,
    Outcomes,
    StragglerRatio,
    SystemModel,
    UniformDepth,
)
from fedhet.system.profiles import CAPABILITY_PROFILES, capabilities

__all__ = [
    "CAPABILITY_PROFILES",
    "SYSTEM_MODELS",
    "ExponentialLayers",
    "Marginals",
    "Outcomes",
    "StragglerRatio",
    "SystemModel",
    "UniformDepth",
    "capabilities",
]
