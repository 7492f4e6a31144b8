"""Client work: the local trainer composed of a coverage view, a work budget, the
algorithm's gradient transform, a local optimizer and update postprocessors."""

from fedhet.client.budget import SimulatedBudget, WallClockBudget, timed_first_step
from fedhet.client.coverage import CoverageView
from fedhet.client.evaluate import evaluate
from fedhet.client.gradients import gradients
from fedhet.client.optimizers import SGD, Adam, LocalOptimizer
from fedhet.client.postprocess import Postprocessor
from fedhet.client.rule import ClientRule
from fedhet.client.state import ClientData, ClientState, ClientStates
from fedhet.client.trainer import LocalTrainer

__all__ = [
    "SGD",
    "Adam",
    "ClientData",
    "ClientRule",
    "ClientState",
    "ClientStates",
    "CoverageView",
    "LocalOptimizer",
    "LocalTrainer",
    "Postprocessor",
    "SimulatedBudget",
    "WallClockBudget",
    "evaluate",
    "gradients",
    "timed_first_step",
]
