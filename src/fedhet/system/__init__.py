"""System models: who finishes what by when, on the virtual clock.

One file per model or wrapper; each registers itself as a plug-in (:mod:`fedhet.registry`,
kinds ``system_model``, ``dropout``, ``participation`` and ``availability``) and declares what it can
answer (:meth:`SystemModel.time_law`, :attr:`SystemModel.always_present`, ...)."""

from fedhet.system import dropout, measured, traces, wallclock  # noqa: F401  (registration)
from fedhet.system.base import (
    LayerTimeLaw,
    NoOptions,
    StepTimeLaw,
    SystemContext,
    SystemModel,
    TimeLaw,
    implied_full_time,
    steps_from_depth,
)
from fedhet.system.calibration import deadline_for_depth_fraction, expected_depth_fraction
from fedhet.system.depth import DepthOnlyModel, NoStragglers, StragglerRatio, UniformDepth
from fedhet.system.numerics import poisson_binomial_pmf, random_subset_product
from fedhet.system.participation import (
    PARTICIPATION_GROUPS,
    BernoulliParticipation,
    CohortSampling,
    PresenceWrapper,
    participation_probabilities,
)
from fedhet.system.profiles import CAPABILITY_PROFILES, CapabilityOptions, capabilities
from fedhet.system.timed import ExponentialLayers, PerStepCost
from fedhet.system.types import Marginals, Outcomes, Workload

__all__ = [
    "BernoulliParticipation",
    "CAPABILITY_PROFILES",
    "CapabilityOptions",
    "CohortSampling",
    "DepthOnlyModel",
    "ExponentialLayers",
    "LayerTimeLaw",
    "Marginals",
    "NoOptions",
    "NoStragglers",
    "Outcomes",
    "PARTICIPATION_GROUPS",
    "PerStepCost",
    "PresenceWrapper",
    "StepTimeLaw",
    "StragglerRatio",
    "SystemContext",
    "SystemModel",
    "TimeLaw",
    "UniformDepth",
    "Workload",
    "capabilities",
    "deadline_for_depth_fraction",
    "expected_depth_fraction",
    "implied_full_time",
    "participation_probabilities",
    "poisson_binomial_pmf",
    "random_subset_product",
    "steps_from_depth",
]
