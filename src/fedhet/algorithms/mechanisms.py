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


def inert(rule: Any) -> list[Mechanism]:
    """The mechanisms ``rule`` declares that do not act under its settings."""
    return [m for m in getattr(rule, "mechanisms", ()) if not m.acts(rule)]


def inert_lines(rule: Any, label: str) -> list[str]:
    """One warning line per inert mechanism of ``rule`` (named ``label``)."""
    lines = []
    for mechanism in inert(rule):
        knobs = ", ".join(f"algorithm.{k}" for k in mechanism.knobs)
        verb = "does" if len(mechanism.knobs) == 1 else "do"
        tail = f"; {knobs} {verb} nothing in this run" if knobs else ""
        lines.append(f"{label}: {mechanism.name} is inert here: it needs {mechanism.needs}{tail}")
    return lines


def inert_knobs(rule: Any) -> set[str]:
    """The dotted option keys (``algorithm.mu``) that only inert mechanisms read: a search
    over them tunes nothing."""
    return {f"algorithm.{k}" for m in inert(rule) for k in m.knobs}


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
