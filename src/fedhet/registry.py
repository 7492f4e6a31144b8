"""One registry for every plug-in kind.

A plug-in is a class with an ``Options`` dataclass (its configuration keys, with defaults
and an optional ``validate()``) and a classmethod ``build(options, ctx)`` that returns the
working object. Every kind is looked up the same way, by the name a configuration gives:

- a built-in name (``"salf"``, ``"per-step"``, ``"adam"``, ...), registered in fedhet's own
  modules with :func:`register`;
- ``"package.module:ClassName"``, imported on demand (a researcher's own rule, without
  installing anything);
- an entry point of an installed package, in the group of the kind (``fedhet.algorithms``,
  ``fedhet.system_models``, ... see :data:`KINDS`), under the name it declares.

``fedhet list`` shows every plug-in of every kind and where it comes from.

This module imports nothing of fedhet's: built-in modules are imported by name when a kind
is first asked for, so the registry sits below everything that registers into it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pkgutil
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from fedhet.errors import ConfigError

# kind -> entry-point group of installed plug-ins
KINDS: dict[str, str] = {
    "algorithm": "fedhet.algorithms",
    "system_model": "fedhet.system_models",
    "participation": "fedhet.participation",
    "availability": "fedhet.availability",
    "dropout": "fedhet.dropout",
    "selection": "fedhet.selection",
    "server_optimizer": "fedhet.server_optimizers",
    "dataset": "fedhet.datasets",
    "partitioner": "fedhet.partitioners",
    "model": "fedhet.models",
    "engine": "fedhet.engines",
    "pool": "fedhet.pools",
    "local_optimizer": "fedhet.local_optimizers",
    "postprocessor": "fedhet.postprocessors",
    "callback": "fedhet.callbacks",
}

# kind -> the fedhet packages whose modules register its built-ins (folders of the
# architecture): every module of such a package is imported (:func:`import_submodules`), so
# a new module there registers its plug-ins without being listed anywhere
BUILTIN_PACKAGES: dict[str, tuple[str, ...]] = {
    "algorithm": ("fedhet.algorithms",),
    "server_optimizer": ("fedhet.algorithms",),
    "system_model": ("fedhet.system",),
    "participation": ("fedhet.system",),
    "availability": ("fedhet.system",),
    "dropout": ("fedhet.system",),
    "selection": ("fedhet.system",),
    "dataset": ("fedhet.data",),
    "partitioner": ("fedhet.data",),
    "model": ("fedhet.models",),
    "engine": ("fedhet.engine",),
    "pool": ("fedhet.engine",),
    "local_optimizer": ("fedhet.client",),
    "postprocessor": ("fedhet.client",),
    "callback": ("fedhet.engine", "fedhet.tracking"),
}


def import_submodules(name: str) -> None:
    """Import the module ``name`` and, for a package, every module in it: what registers
    the built-ins they define."""
    module = importlib.import_module(name)
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        importlib.import_module(f"{name}.{info.name}")


# kind -> (module, function) checking a plug-in class against its kind's contract, in one
# line naming the class; for built-ins (at registration) and plug-ins (when resolved)
CLASS_CHECKS: dict[str, tuple[str, str]] = {
    "algorithm": ("fedhet.algorithms.base", "check_algorithm_class"),
}

# what a configuration calls each kind, for messages
KIND_LABELS = {
    "algorithm": "algorithm",
    "system_model": "system model",
    "participation": "participation",
    "availability": "availability",
    "dropout": "dropout",
    "selection": "selection",
    "server_optimizer": "server optimizer",
    "dataset": "dataset",
    "partitioner": "partition",
    "model": "model",
    "engine": "engine",
    "pool": "client pool",
    "local_optimizer": "local optimizer",
    "postprocessor": "postprocessor",
    "callback": "run callback",
}


@dataclass
class NoOptions:
    """The ``Options`` of a plug-in that has none."""


@dataclass(frozen=True)
class Entry:
    """One plug-in: its kind, the name it is asked by, its class and where it comes from
    (``"fedhet"``, ``"entry point of <distribution>"`` or ``"module <path>"``)."""

    kind: str
    name: str
    cls: Any  # the plug-in class: its attributes are its kind's contract (Options, build, ...)
    origin: str

    @property
    def summary(self) -> str:
        """One line: the class's ``summary``, else its docstring's first sentence, whole, as
        plain text (no reStructuredText markup)."""
        declared = getattr(self.cls, "summary", "")
        return plain_text(declared) if declared else first_sentence(self.cls.__doc__ or "")


# "Sec. IV", "eq. (9)", "et al. 2020": a full stop that ends no sentence
_ABBREVIATIONS = re.compile(
    r"(?:\b(?:Sec|Secs|eq|Eq|eqs|al|Fig|Alg|e\.g|i\.e|i\.i\.d|vs|cf|No|resp)|\b[A-Z])\.$"
)


def plain_text(text: str) -> str:
    """``text`` on one line without reStructuredText markup (````x````, ``:class:`~a.B```)."""
    text = " ".join(text.split())
    text = re.sub(r":[a-z]+:`(~?)([^`<]+?)(?:\s*<[^>]*>)?`", _role_text, text)
    return text.replace("``", "")


def _role_text(match: re.Match) -> str:
    """A role's text: ``:class:`~a.B``` is ``B``, ``:class:`a.B``` is ``a.B``."""
    return match.group(2).split(".")[-1] if match.group(1) else match.group(2)


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, whole, as plain text."""
    paragraph = plain_text(doc.strip().split("\n\n")[0])
    for match in re.finditer(r"[.!?](?=\s+[A-Za-z(\"])", paragraph):
        if not _ABBREVIATIONS.search(paragraph[: match.end()]):
            return paragraph[: match.end()]
    return paragraph


_BUILTINS: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
_LOADED: set[str] = set()


def register(kind: str, name: str | None = None):
    """Class decorator: a built-in plug-in of ``kind`` under ``name`` (default ``cls.name``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown plug-in kind {kind!r} (known: {', '.join(KINDS)})")

    def add(cls: Any) -> Any:
        key = name or cls.name
        check_plugin(kind, key, cls)
        _BUILTINS[kind][key] = Entry(kind, key, cls, "fedhet")
        return cls

    return add


# what makes a class a plug-in of any kind (checked by :func:`check_plugin`): the name it is
# registered under, its options and how it is built; a wrapper plug-in answers these itself
PLUGIN_CONTRACT = ("name", "Options", "build")


def check_plugin(kind: str, name: str, cls: object) -> None:
    """A plug-in is a class with an ``Options`` dataclass and a ``build`` callable."""
    label = KIND_LABELS[kind]
    if not isinstance(cls, type):
        raise ConfigError(f"{label} {name!r}: {cls!r} is not a class")
    if not dataclasses.is_dataclass(getattr(cls, "Options", None)):
        raise ConfigError(f"{label} {name!r}: {cls.__qualname__} has no Options dataclass")
    if not callable(getattr(cls, "build", None)):
        raise ConfigError(f"{label} {name!r}: {cls.__qualname__} has no build(options, ctx)")
    if kind in CLASS_CHECKS:  # the kind's own contract: declared capabilities against hooks
        module, function = CLASS_CHECKS[kind]
        getattr(importlib.import_module(module), function)(cls, name)


def _load_builtins(kind: str) -> None:
    if kind in _LOADED:
        return
    _LOADED.add(kind)
    for package in BUILTIN_PACKAGES[kind]:
        import_submodules(package)


def builtins(kind: str) -> dict[str, Entry]:
    """The built-in plug-ins of ``kind`` by name."""
    _load_builtins(kind)
    return dict(_BUILTINS[kind])


def _entry_points(kind: str) -> list:
    try:
        return list(metadata.entry_points(group=KINDS[kind]))
    except Exception:  # a broken installed distribution must not stop fedhet
        return []


def installed(kind: str) -> dict[str, Entry]:
    """Plug-ins of ``kind`` that installed packages declare as entry points (loaded now)."""
    out = {}
    for point in _entry_points(kind):
        cls = _load_entry_point(kind, point)
        dist = getattr(getattr(point, "dist", None), "name", None) or point.value
        out[point.name] = Entry(kind, point.name, cls, f"entry point of {dist}")
    return out


def _load_entry_point(kind: str, point) -> type:
    try:
        cls = point.load()
    except Exception as exc:
        raise ConfigError(
            f"{KIND_LABELS[kind]} {point.name!r}: its entry point {point.value!r} does not load "
            f"({type(exc).__name__}: {exc})"
        ) from None
    check_plugin(kind, point.name, cls)
    return cls


def _import_path(kind: str, path: str, key: str) -> Entry:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{key} = {path!r}: expected 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            hint = (
                f"; is the folder holding {module_name.split('.')[0]!r} on PYTHONPATH (e.g. "
                f"PYTHONPATH=src fedhet ...), and is the path 'package.module:ClassName'?"
            )
        raise ConfigError(f"{key} = {path!r}: cannot import {module_name!r} ({exc}){hint}") from None
    except Exception as exc:
        raise ConfigError(
            f"{key} = {path!r}: importing {module_name!r} failed ({type(exc).__name__}: {exc})"
        ) from None
    cls: Any = module
    for part in attribute.split("."):
        found = getattr(cls, part, None)
        if found is None:
            close = _close_to(part, [n for n in dir(cls) if not n.startswith("_")])
            raise ConfigError(f"{key} = {path!r}: {module_name!r} has no {attribute!r}{close}")
        cls = found
    check_plugin(kind, path, cls)
    return Entry(kind, path, cls, f"module {module_name}")


def resolve(kind: str, name: str, key: str) -> Entry:
    """The plug-in of ``kind`` called ``name`` (``key``: the configuration key, for errors)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key} = {name!r}: expected a name")
    if ":" in name:
        return _import_path(kind, name, key)
    known = builtins(kind)
    if name in known:
        _warn_shadowed(kind, name)
        return known[name]
    for point in _entry_points(kind):
        if point.name == name:
            cls = _load_entry_point(kind, point)
            dist = getattr(getattr(point, "dist", None), "name", None) or point.value
            return Entry(kind, name, cls, f"entry point of {dist}")
    names = sorted(set(known) | {p.name for p in _entry_points(kind)})
    raise ConfigError(f"{key} = {name!r}: unknown{_close_to(name, names)} (known: {', '.join(names)})")


def _close_to(name: str, candidates: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or nothing."""
    import difflib

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


_SHADOW_WARNED: set[tuple[str, str]] = set()


def _warn_shadowed(kind: str, name: str) -> None:
    """One warning when an installed package declares a plug-in under a built-in's name (the
    built-in is the one used)."""
    if (kind, name) in _SHADOW_WARNED:
        return
    _SHADOW_WARNED.add((kind, name))
    for point in _entry_points(kind):
        if point.name == name:
            dist = getattr(getattr(point, "dist", None), "name", None) or point.value
            logging.getLogger("fedhet").warning(
                "%s %r: the entry point of %s has a built-in's name and is not used; give it another name "
                "(or name it by module path, %s)", KIND_LABELS[kind], name, dist, point.value,
            )  # fmt: skip


def names(kind: str) -> list[str]:
    """Every name ``kind`` answers to (built-ins and installed entry points)."""
    return sorted(set(builtins(kind)) | {p.name for p in _entry_points(kind)})


def entries(kind: str) -> list[Entry]:
    """Every plug-in of ``kind``: built-ins first, then installed ones, by name."""
    found = builtins(kind)
    extra = {n: e for n, e in installed(kind).items() if n not in found}
    return [found[n] for n in sorted(found)] + [extra[n] for n in sorted(extra)]


def option_fields(cls: Any) -> dict[str, dataclasses.Field]:
    """The configuration keys of a plug-in class: the fields of its ``Options``."""
    return {f.name: f for f in dataclasses.fields(cls.Options)}
