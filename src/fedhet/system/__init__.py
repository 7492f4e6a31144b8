"""System models: who finishes what by when, on the virtual clock (DESIGN ideas 1 and 3)."""

from fedhet.system.outcomes import (
    SYSTEM_MODELS,
    ExponentialLayers,
    Marginals,
    NoStragglers,
    Outcomes,
    PerStepCost,
    StragglerRatio,
    SystemModel,
    UniformDepth,
    Workload,
)
from fedhet.system.participation import (
    PARTICIPATION_GROUPS,
    PARTICIPATION_PROFILES,
    BernoulliParticipation,
    CohortSampling,
    participation_probabilities,
)
from fedhet.system.profiles import CAPABILITY_PROFILES, capabilities

__all__ = [
    "BernoulliParticipation",
    "CohortSampling",
    "CAPABILITY_PROFILES",
    "NoStragglers",
    "PARTICIPATION_GROUPS",
    "PARTICIPATION_PROFILES",
    "participation_probabilities",
    "SYSTEM_MODELS",
    "ExponentialLayers",
    "Marginals",
    "Outcomes",
    "PerStepCost",
    "Workload",
    "StragglerRatio",
    "SystemModel",
    "UniformDepth",
    "capabilities",
]
