"""Checks of configuration values, shared by the configuration and by every plug-in's
``Options.validate()``: each failure is one :class:`~fedhet.errors.ConfigError` line naming
the key and the value."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

from fedhet.errors import ConfigError

MAX_MAGNITUDE = 1e30  # beyond it numbers overflow single-precision tensors


def resumable(default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field of an ``Options`` that may change when a run resumes from its
    checkpoint: where or how fast the run computes, never what it computes (a pool, threads,
    a longer run). Every other option must equal the checkpoint's."""
    return dataclasses.field(default=default, metadata={"resumable": True}, **kwargs)


def is_resumable(field: dataclasses.Field) -> bool:
    """Whether an option may change on resume (:func:`resumable`)."""
    return bool(field.metadata.get("resumable"))


def finite(key: str, value: float) -> float:
    """``value`` as a float; NaN, infinities and magnitudes above 1e30 are refused (no key
    takes them: they overflow the single-precision tensors the numbers meet)."""
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value}: must be a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise ConfigError(f"{key} = {value}: must be within ±{MAX_MAGNITUDE:g}")
    return value


def number_list(key: str, values: list, low: float, high: float, low_open: bool = False) -> list[float]:
    """Check a list of numbers, each finite and in [low, high] (or (low, high])."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: {value!r} is not a number")
        in_range(key, finite(key, value), low, high, low_open=low_open)
    return values


def at_most(key: str, value: int, high: int) -> None:
    if value > high:
        raise ConfigError(f"{key} = {value}: must be <= {high}")


def at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} = {value}: must be >= {low}")


def in_range(key, value, low, high, low_open=False, high_open=False) -> None:
    bad = value < low or value > high or (low_open and value == low) or (high_open and value == high)
    if bad:
        lb, hb = "(" if low_open else "[", ")" if high_open else "]"
        raise ConfigError(f"{key} = {value}: must be in {lb}{low}, {high}{hb}")


def one_of(key: str, value: str, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key} = {value!r}: unknown (known: {', '.join(choices)})")


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field's type; ints are accepted where floats are expected."""
    if isinstance(annotation, str):
        annotation = {"str": str, "int": int, "float": float, "bool": bool, "list": list}.get(
            annotation, annotation
        )
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return coerce_value(key, value, args[0])
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}: expected true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} = {value!r}: expected an integer")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} = {value!r}: expected a number")
        return finite(key, value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r}: expected a string")
        return value
    if annotation is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} = {value!r}: expected a list")
        return value
    return value


def path_option(default: str = "") -> Any:
    """A field that names a file or folder: written relative in a configuration file, it is
    read against that file's folder (:func:`fedhet.config.resolve_paths`)."""
    return dataclasses.field(default=default, metadata={"path": True})


def is_path_option(field: dataclasses.Field) -> bool:
    """Whether ``field`` was declared with :func:`path_option`."""
    return bool(field.metadata.get("path"))


def option_types(options_cls: Any) -> dict[str, Any]:
    """The field types of an ``Options`` dataclass, with string annotations resolved where
    they can be (plain names otherwise). Resolved once per class: a suite's check parses
    tens of thousands of sections, and resolving the annotations was most of its time."""
    return dict(_option_types(options_cls))


@functools.lru_cache(maxsize=4096)
def _option_types(options_cls: Any) -> dict[str, Any]:
    import dataclasses

    try:
        hints = typing.get_type_hints(options_cls)
    except Exception:  # an annotation naming something not importable here
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(options_cls)}


def typed_options(options_cls: Any, values: dict, prefix: str, owner: str) -> Any:
    """``values`` (keys as written) checked against ``options_cls``'s fields and types, the
    instance built and its ``validate()`` run. ``prefix`` is the keys' section
    (``"algorithm"``), ``owner`` what they configure, for the unknown-key message."""
    fields = option_types(options_cls)
    for key in values:
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(f"{prefix}.{key}: unknown option for {owner} (known: {known})")
    typed = {key: coerce_value(f"{prefix}.{key}", v, fields[key]) for key, v in values.items()}
    options = options_cls(**typed)
    check = getattr(options, "validate", None)
    if check:
        check()
    return options


def counted(count: int, noun: str) -> str:
    """``"1 round"``, ``"3 rounds"``: a count and its noun, plural when not one."""
    return f"{count} {noun}" + ("" if count == 1 else "s")
