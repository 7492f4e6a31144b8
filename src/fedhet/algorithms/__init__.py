"""Rules, registered by name, each a few parts: planner (or event scheduler), client part,
aggregation, reporting (:mod:`fedhet.algorithms.parts`)."""

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmContext,
    AsyncAlgorithm,
    ClientAssignment,
    RoundContext,
    RoundPlan,
    RunSetting,
)
from fedhet.algorithms.parts import (
    Aggregation,
    ClientPart,
    EventAggregation,
    EventScheduler,
    Planner,
    Reporting,
)
from fedhet.registry import import_submodules

__all__ = [
    "ALGORITHMS",
    "Aggregation",
    "Algorithm",
    "AsyncAlgorithm",
    "ClientPart",
    "EventAggregation",
    "EventScheduler",
    "Planner",
    "Reporting",
    "AlgorithmContext",
    "ClientAssignment",
    "RoundContext",
    "RoundPlan",
    "RunSetting",
]

# every rule's module registers it: a new module here needs no line of its own
import_submodules(__name__)
