"""Server-side calls into a rule's hooks, guarded: an exception, or a value of the wrong
type or size, becomes one line naming the plug-in, the hook and the round

    algorithm 'mymethod:FedAvgM'.aggregate (round 3): returned 2778 values, the model has 2773

instead of a traceback somewhere downstream. The run loop stops the run there: the summary
says ``stopped_by = "plugin_error"`` with that line, the traceback goes to the run folder's
``plugin-error.txt``, the checkpoint of the last finished round stays, and ``--resume``
continues once the plug-in is fixed. (Client-side hooks have their own guard:
:mod:`fedhet.engine.client_errors`.)
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from fedhet.device import server_side
from fedhet.errors import FedhetError
from fedhet.results import PLUGIN_ERROR_FILE

T = TypeVar("T")
TRACEBACK_FILE = PLUGIN_ERROR_FILE


class PluginError(FedhetError):
    """A plug-in's hook failed: ``label`` (``algorithm 'name'``), ``hook``, ``round_number``
    (1-based; 0 before round 1) and what went wrong; ``details`` keeps the traceback."""

    def __init__(self, label: str, hook: str, round_number: int, what: str, details: str = ""):
        when = f"round {round_number}" if round_number else "before round 1"
        super().__init__(f"{label}.{hook} ({when}): {what}")
        self.label, self.hook, self.round_number, self.details = label, hook, round_number, details


class PluginStopped(FedhetError):
    """The run stopped on a :class:`PluginError` (its line, and how to go on); ``details``
    keeps the plug-in's traceback (``fedhet --debug`` prints it)."""

    def __init__(self, message: str, details: str = "", line: str = ""):
        super().__init__(message)
        self.details = details
        self.line = line or message  # the plug-in's failure alone (without how to go on)


def plugin_label(kind: str, name: str) -> str:
    """``algorithm 'salf'``: how a message names a plug-in."""
    return f"{kind} {name!r}"


def guarded(label: str, hook: str, round_number: int, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``, with an exception raised by the plug-in's code as a :class:`PluginError`
    (a :class:`FedhetError` passes as it is: it already is one line)."""
    try:
        with server_side():  # tensors it creates go to the run's device (fedhet.device)
            return call(*args)
    except FedhetError:
        raise
    except Exception as exc:  # noqa: BLE001  (a plug-in's bug, named)
        text = (str(exc).strip().splitlines() or [""])[0][:200]
        what = f"raised {type(exc).__name__}" + (f": {text}" if text else "")
        raise PluginError(label, hook, round_number, what, traceback.format_exc()) from None


def describe(value: Any) -> str:
    """A short description of a returned value for a message."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def checked_model(
    label: str, hook: str, round_number: int, result: Any, params: torch.Tensor, buffers: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``result`` as the new ``(params, buffers)``: two floating tensors of the model's sizes,
    or a :class:`PluginError` that says what came back."""
    if not (
        isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result)
    ):
        raise PluginError(
            label, hook, round_number, f"returned {describe(result)}; expected (params, buffers)"
        )
    new_params, new_buffers = result
    for got, want, what in ((new_params, params, "values"), (new_buffers, buffers, "buffer values")):
        if got.numel() != want.numel() or got.dim() != 1:
            raise PluginError(
                label, hook, round_number, f"returned {got.numel()} {what}, the model has {want.numel()}"
            )
        if not got.is_floating_point():
            raise PluginError(label, hook, round_number, f"returned {what} of dtype {got.dtype}")
    return new_params, new_buffers


class Hooks:
    """The guarded calls of one round into the hooks of plug-in ``name`` (of ``kind``: the
    algorithm, or the system model)."""

    def __init__(self, name: str, round_number: int, kind: str = "algorithm"):
        self.label, self.round_number = plugin_label(kind, name), round_number

    def call(self, hook: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` (the hook ``hook``), guarded (:func:`guarded`)."""
        return guarded(self.label, hook, self.round_number, function, *args)

    def model(self, hook: str, result: Any, params: torch.Tensor, buffers: torch.Tensor):
        """The hook's ``result`` checked as a new model (:func:`checked_model`)."""
        return checked_model(self.label, hook, self.round_number, result, params, buffers)

    def plan(self, plan: Any, num_clients: int) -> Any:
        """A plan checked: a :class:`~fedhet.algorithms.base.RoundPlan` with one assignment
        per client."""
        from fedhet.algorithms.base import RoundPlan

        if not isinstance(plan, RoundPlan):
            raise PluginError(
                self.label, "plan", self.round_number, f"returned {describe(plan)}; expected a RoundPlan"
            )
        if len(plan.assignments) != num_clients:
            raise PluginError(
                self.label, "plan", self.round_number,
                f"planned {len(plan.assignments)} clients, the run has {num_clients}",
            )  # fmt: skip
        return plan

    def outcomes(self, found: Any, num_clients: int) -> Any:
        """A system model's ``sample``: :class:`~fedhet.system.types.Outcomes` over every client."""
        from fedhet.system.types import Outcomes

        if not isinstance(found, Outcomes):
            what = f"returned {describe(found)}; expected Outcomes"
            raise PluginError(self.label, "sample", self.round_number, what)
        for field in ("participates", "depth", "full_time", "finish_time", "steps_done"):
            size = len(getattr(found, field))
            if size != num_clients:
                what = f"returned {field} for {size} clients, the run has {num_clients}"
                raise PluginError(self.label, "sample", self.round_number, what)
        return found

    def marginals(self, found: Any) -> Any:
        """A system model's ``marginals``: :class:`~fedhet.system.types.Marginals`."""
        from fedhet.system.types import Marginals

        if not isinstance(found, Marginals):
            what = f"returned {describe(found)}; expected Marginals"
            raise PluginError(self.label, "marginals", self.round_number, what)
        return found

    def clients(self, hook: str, found: Any, num_clients: int) -> list[int]:
        """A set of clients checked (``busy_clients``): integers from 0 to ``num_clients`` - 1."""
        items = list(found) if isinstance(found, set | frozenset | list | tuple) else None
        index = (int, np.integer)
        if items is None or not all(
            isinstance(c, index) and not isinstance(c, bool) and 0 <= c < num_clients for c in items
        ):
            what = f"returned {describe(found)}; expected a set of client indices 0..{num_clients - 1}"
            raise PluginError(self.label, hook, self.round_number, what)
        return [int(c) for c in items]

    def metrics(self, found: Any) -> dict:
        """``round_metrics``' answer checked: a dict of numbers (or None) by column name."""
        if not isinstance(found, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, int | float) and not isinstance(v, bool))
            for k, v in found.items()
        ):
            raise PluginError(
                self.label, "round_metrics", self.round_number,
                f"returned {describe(found)}; expected a dict of numbers by column name",
            )  # fmt: skip
        return found
