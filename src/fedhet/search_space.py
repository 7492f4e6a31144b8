"""Searched hyperparameters: one key with its range or choices, as a search space file
(``fedhet tune``), a suite (``fedhet bench``) or an algorithm's own declaration
(:attr:`fedhet.algorithms.Algorithm.hyperparameters`) writes it::

    "train.lr" = { low = 0.001, high = 0.5, log = true }
    "train.local_steps" = { low = 1, high = 5, int = true }
    "train.batch_size" = { choices = [8, 16, 32] }

This module imports nothing of fedhet's but its errors, so algorithms may use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedhet.errors import ConfigError

SPEC_KEYS = ("low", "high", "log", "int", "choices")


@dataclass
class Param:
    """One searched key: a float or int range (``log`` for a log scale) or a list of choices."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: list | None = None

    def suggest(self, trial):
        """The trial's value of this key (Optuna's ``suggest_*``)."""
        if self.choices is not None:
            return trial.suggest_categorical(self.key, self.choices)
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.log)

    def ends(self) -> list:
        """The values a configuration must accept: both ends of the range, or every choice."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def describe(self) -> str:
        """The range as one short text (``0.005..0.5 log``, ``{8, 16, 32}``)."""
        if self.choices is not None:
            return "{" + ", ".join(map(str, self.choices)) + "}"
        scale = (" log" if self.log else "") + (" int" if self.integer else "")
        return f"{self.low:g}..{self.high:g}{scale}"


def parse_param(key: str, spec: Any, where: str) -> Param:
    """A searched key from its table; refused in one line naming ``where`` and the key when
    the table is not ``{low, high[, log][, int]}`` with numbers low < high, or
    ``{choices = [...]}``."""
    if "." not in key:
        raise ConfigError(f"{where}: {key!r}: a searched key looks like section.key (e.g. train.lr)")
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}.{key}: expected a table, {{ low = .., high = .. }} or {{ choices = [..] }}"
        )
    unknown = set(spec) - set(SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{key}: unknown option {sorted(unknown)[0]!r} ({', '.join(SPEC_KEYS)})")
    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or set(spec) - {"choices"}:
            raise ConfigError(f"{where}.{key}: choices must be a non-empty list, alone")
        return Param(key, choices=choices)
    low: Any = spec.get("low")
    high: Any = spec.get("high")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high))
    if not numbers or not math.isfinite(low) or not math.isfinite(high) or not low < high:
        raise ConfigError(f"{where}.{key}: needs numbers low < high (got {low!r}, {high!r})")
    use_log, integer = spec.get("log", False), spec.get("int", False)
    if not isinstance(use_log, bool) or not isinstance(integer, bool):
        raise ConfigError(f"{where}.{key}: log and int are true or false")
    if use_log and low <= 0:
        raise ConfigError(f"{where}.{key}: a log scale needs low > 0")
    if integer and not (isinstance(low, int) and isinstance(high, int)):
        raise ConfigError(f"{where}.{key}: int = true needs whole numbers (got low {low!r}, high {high!r})")
    return Param(key, low, high, use_log, integer)


def declared_params(cls: Any, where: str) -> list[Param]:
    """An algorithm class's declared hyperparameters (``hyperparameters``: option name ->
    range) as searched keys ``algorithm.<option>``."""
    declared = getattr(cls, "hyperparameters", {}) or {}
    if not isinstance(declared, dict):
        raise ConfigError(f"{where}: hyperparameters must be a dict of option name -> range table")
    where = f"{where}: hyperparameters"
    return [parse_param(f"algorithm.{name}", spec, where) for name, spec in declared.items()]
