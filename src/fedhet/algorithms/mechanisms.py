"""Mechanisms a rule declares, and the settings under which each acts.

A rule is more than its aggregation: FedProx adds a proximal term to the local loss,
FedCompass assigns each client a number of local steps, FedBalancer selects samples and moves
the deadline. Under some settings such a mechanism does nothing (FedCompass's step range is
1..1 when ``train.local_steps = 1``), and a run there says nothing about it. A rule declares
each mechanism with the test of the settings under which it acts and the options only it
reads::

    mechanisms = (
        Mechanism("the proximal term mu/2 ||w - w_t||^2",
                  needs="train.local_steps >= 2 (the term is zero at the first local step)",
                  acts=lambda rule: rule.train.local_steps >= 2, knobs=("mu",)),
    )

A run whose settings make one inert says so in one warning line, kept with its caveats in
``summary.json`` (``inert_mechanisms`` names them), and ``fedhet bench`` does not tune its
knobs there (:func:`inert_knobs`). Checked when the rule is registered: every knob is one of
its options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mechanism:
    """One mechanism of a rule: what it is (``name``), the settings it ``needs`` (said to
    the user), the test ``acts(rule)`` of them on the built rule (its ``options`` and
    ``train``), and the options (``knobs``) that only it reads."""

    name: str
    needs: str
    acts: Callable[[Any], bool]
    knobs: tuple[str, ...] = ()
    # it acts on clients' times as the system model draws them: a model with no law of time
    # (straggler-ratio, uniform-depth, full: times are the deadline's) leaves it nothing
    needs_time_law: bool = False


NO_TIME_LAW = "clients' times from a system model with a law of time (per-step, exponential, measured)"


def _inert_by_time(mechanism: Mechanism, timed: bool | None) -> bool:
    return mechanism.needs_time_law and timed is False


def inert(rule: Any, timed: bool | None = None) -> list[Mechanism]:
    """The mechanisms ``rule`` declares that do not act under its settings; ``timed``:
    whether the run's system model has a law of time (None: not known)."""
    return [m for m in getattr(rule, "mechanisms", ()) if _inert_by_time(m, timed) or not m.acts(rule)]


def inert_lines(rule: Any, label: str, timed: bool | None = None) -> list[str]:
    """One warning line per inert mechanism of ``rule`` (named ``label``)."""
    lines = []
    for mechanism in inert(rule, timed):
        knobs = ", ".join(f"algorithm.{k}" for k in mechanism.knobs)
        verb = "does" if len(mechanism.knobs) == 1 else "do"
        tail = f"; {knobs} {verb} nothing in this run" if knobs else ""
        needs = NO_TIME_LAW if _inert_by_time(mechanism, timed) else mechanism.needs
        lines.append(f"{label}: {mechanism.name} is inert here: it needs {needs}{tail}")
    return lines


def inert_knobs(rule: Any, timed: bool | None = None) -> set[str]:
    """The dotted option keys (``algorithm.mu``) that only inert mechanisms read: a search
    over them tunes nothing."""
    return {f"algorithm.{k}" for m in inert(rule, timed) for k in m.knobs}


def has_time_law(system_model_class: type) -> bool:
    """Whether a system model class draws clients' times from a law of its own (it defines
    ``time_law``; the depth-only models do not)."""
    from fedhet.system.base import SystemModel

    return getattr(system_model_class, "time_law", None) is not SystemModel.time_law


def check_mechanisms(cls: type, option_names: set[str], where: str) -> None:
    """Refuse, in one line, a declaration whose knob is not one of the rule's options or
    whose entry is not a :class:`Mechanism`."""
    from fedhet.errors import ConfigError

    for mechanism in getattr(cls, "mechanisms", ()):
        if not isinstance(mechanism, Mechanism):
            raise ConfigError(f"{where}: mechanisms holds {mechanism!r}, not a Mechanism")
        unknown = [k for k in mechanism.knobs if k not in option_names]
        if unknown:
            raise ConfigError(
                f"{where}: mechanism {mechanism.name!r}: knob {unknown[0]!r} is not one of its options"
            )
