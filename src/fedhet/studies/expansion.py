"""Grid expansion: the cells of an experiment (the Cartesian product of its ``[grid]`` axes,
crossed with its ``[[cases]]``) and of a configuration's ``[compare]``, each a validated
configuration with a name."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.config import (
    AlgorithmConfig,
    Config,
    apply_overrides,
    check_name,
    from_dict,
    require_algorithm,
)
from fedhet.errors import ConfigError


@dataclass
class Cell:
    """One run of a grid: its name, overrides and validated configuration."""

    name: str
    overrides: dict[str, Any]
    config: Config


LONG_LIST = 40  # characters of a list's label beyond which it is shortened


def short_value(value: Any) -> str:
    """A value as a table or a folder name shows it: a list too long to read (e.g. one value
    per client) as ``VxN`` when its N values are all V, else ``list-`` and a digest of them."""
    text = str(value)
    if isinstance(value, list) and len(text.replace(" ", "")) > LONG_LIST:
        if all(v == value[0] for v in value):
            return f"{short_value(value[0])}x{len(value)}"
        return "list-" + hashlib.sha1(text.replace(" ", "").encode()).hexdigest()[:8]
    return text


def _label(value: Any) -> str:
    """A grid value as part of a cell's folder name (a plug-in's ``module:Class`` path as its
    class name; a long list by :func:`short_value`)."""
    if isinstance(value, str) and ":" in value and "/" not in value:
        value = value.rsplit(":", 1)[-1]
    return short_value(value).replace("/", "_").replace(" ", "")


def _flatten(chosen: dict[str, Any]) -> dict[str, Any]:
    """Expand grid values that are tables: ``algorithm = {name = "salf", normalize = "all"}``
    becomes ``algorithm.name = "salf"``, ``algorithm.normalize = "all"``."""
    out: dict[str, Any] = {}
    for key, value in chosen.items():
        if isinstance(value, dict):
            if "." in key:
                raise ConfigError(f"grid.{key}: a table of values needs a section name as key")
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _override_text(key: str, value: Any) -> str:
    import tomli_w

    return f"{key}={tomli_w.dumps({'v': value})[4:].strip()}"


def _cell(base: dict, chosen: dict[str, Any], cell_name: str, where: str | Path, origin: str = "") -> Cell:
    """The validated configuration of one cell: ``base`` with ``chosen`` overrides. Errors
    name the cell (and ``origin``, e.g. its case) and the key, as the experiment file has it."""
    label = f"{where}: cell {cell_name}" + (f" ({origin})" if origin else "")
    raw = base
    for key, value in _flatten(chosen).items():
        try:
            raw = apply_overrides(raw, [_override_text(key, value)])
        except ConfigError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise ConfigError(f"{label}: {key} = {value!r}: {reason}") from None
    try:
        check_name("run.name", cell_name)
    except ConfigError:
        raise ConfigError(
            f"{label}: the cell's name, made of its grid and case values, is not a usable folder name "
            "(too long, or characters such as / : that a folder name cannot hold)"
        ) from None
    raw = apply_overrides(raw, [_override_text("run.name", cell_name)])
    try:
        require_algorithm(raw, "configuration")
        config = from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    return Cell(cell_name, chosen, config)


def compare_cells(raw: dict, where: str | Path = "config") -> list[Cell]:
    """The runs of a configuration's ``[compare] algorithms = [...]``: one cell per algorithm,
    named after it, on the same setting. An ``[algorithm]`` table holds options of its named
    algorithm only; the others run with their defaults."""
    names = raw.get("compare", {}).get("algorithms", [])
    base = {k: v for k, v in raw.items() if k not in ("compare", "algorithm")}
    given = raw.get("algorithm", {})
    cells = []
    for name in names:
        options = {k: v for k, v in given.items() if k != "name"} if given.get("name") == name else {}
        label = name.rsplit(":", 1)[-1] if isinstance(name, str) else name  # a module path's class
        cells.append(_cell(base, {"algorithm": {"name": name, **options}}, label, where))
    return cells


def _lookup(cell: Cell, key: str) -> Any:
    section, _, field = key.partition(".")
    part = getattr(cell.config, section)
    if isinstance(part, AlgorithmConfig):
        part = part.to_dict()
    if not field and isinstance(part, dict):  # a whole [algorithm] table: name(options)
        options = ",".join(f"{k}={v}" for k, v in part.items() if k != "name")
        return f"{part.get('name')}({options})" if options else part.get("name")
    if isinstance(part, dict) or hasattr(type(part), "SLOTS"):  # a table, or a plug-in section
        return part.get(field)
    return getattr(part, field)
