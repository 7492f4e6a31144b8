"""The configuration reference, generated from the code: every section's own keys and every
built-in plug-in's options, each with its type, its default and what it means.

What a key means is read where the key is declared: the comment on its line (or the comment
lines just above it) in the dataclass that declares it, walking the class's bases, else the
clause of its plug-in's docstrings that names it in double backquotes (````key````). A key
with neither is *undocumented*: :func:`undocumented_keys` lists them and a test keeps the
list empty. ``fedhet list KIND NAME`` prints one plug-in's entry (:func:`plugin_text`); the
docs' build writes the whole reference (``docs/hooks/reference.py``,
:func:`reference_markdown`)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

CLAUSE_END = re.compile(r"; |, (?=``)|\.\s+(?=[A-Z`])")  # not "eq. (3)"; ", ``next_key``"
FIELD_LINE = re.compile(r"^\s*(\w+)\s*:\s*[^=#]+(?:=[^#]*)?(?:#\s*(.*))?$")


@dataclass(frozen=True)
class KeyEntry:
    """One configuration key: its name, type, default (as TOML-ish text) and meaning."""

    key: str
    type: str
    default: str
    doc: str


@cache
def _comments_of(cls: type) -> dict[str, str]:
    """field name -> the comment on its line, or the comment lines just above it, in the
    source of ``cls`` itself (not its bases)."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = FIELD_LINE.match(line)
        if match and not stripped.startswith(("def ", "return", "@")):
            text = match.group(2) or " ".join(above)
            if text and match.group(1) not in found:
                found[match.group(1)] = text.strip()
        above = []
    return found


def _docstring_clause(docs: list[str], key: str) -> str:
    """What ``docs`` say of ````key````: from its definition (````key````: or ````key```` ()
    to the end of that clause (``;`` or the sentence's end), else the clause that names it."""
    for defining in (True, False):
        for doc in docs:
            text = " ".join((doc or "").split())
            marks = (f"``{key}``:", f"``{key}`` (") if defining else (f"``{key}``",)
            at = min((i for i in (text.find(m) for m in marks) if i >= 0), default=-1)
            if at < 0:
                continue
            before = [m.end() for m in CLAUSE_END.finditer(text, 0, at + 2) if m.end() <= at]
            start = at if defining else (before[-1] if before else 0)
            end = CLAUSE_END.search(text, at)
            return text[start : end.start() if end else len(text)].strip().rstrip(".")
    return ""


def field_doc(cls: type, name: str, docs: list[str]) -> str:
    """What field ``name`` of dataclass ``cls`` means: its declaring comment (the first class
    of ``cls``'s method resolution order that comments it), else its docstring clause."""
    for klass in cls.__mro__:
        text = _comments_of(klass).get(name)
        if text:
            return text
    return _docstring_clause(docs, name)


def _default_text(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    return repr(value)


def _type_text(field: dataclasses.Field) -> str:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    return str(kind).replace("Any", "any")


def key_entries(cls: type, docs: list[str], skip: tuple[str, ...] = ()) -> list[KeyEntry]:
    """The keys of dataclass ``cls`` (an ``Options`` or a section), ``docs`` the docstrings
    that may name them."""
    return [
        KeyEntry(f.name, _type_text(f), _default_text(f), field_doc(cls, f.name, docs))
        for f in dataclasses.fields(cls)
        if f.name not in skip and not f.name.startswith("_")
    ]


def plugin_entries(entry: Any) -> list[KeyEntry]:
    """A registry entry's options (its ``Options`` fields)."""
    options: Any = getattr(entry.cls, "Options", None)
    if not isinstance(options, type) or not dataclasses.is_dataclass(options):
        return []
    docs = [klass.__doc__ or "" for klass in (*options.__mro__, *entry.cls.__mro__)]
    return key_entries(options, docs)


def section_entries(section: type) -> list[KeyEntry]:
    """A section's own keys (``[run] rounds``, the slots that name plug-ins, ...)."""
    return key_entries(section, [section.__doc__ or ""])


def plugin_text(entry: Any) -> str:
    """``fedhet list KIND NAME``'s table of options: key, type, default, meaning."""
    rows = plugin_entries(entry)
    if not rows:
        return "options: none"
    lines = ["options:"]
    for row in rows:
        lines.append(f"  {row.key:<22} {row.type:<10} default {row.default}")
        lines += [f"      {line}" for line in _wrap(row.doc or "(undocumented)", 80)]
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def _table(rows: list[KeyEntry]) -> list[str]:
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for row in rows:
        doc = row.doc.replace("|", "\\|").replace("``", "`") or "(undocumented)"
        out.append(f"| `{row.key}` | {row.type} | `{row.default}` | {doc} |")
    return out


def reference_markdown() -> str:
    """The whole configuration reference: per section, its own keys, then for each key that
    names a plug-in, every built-in choice and its options."""
    from fedhet.config import PLUGIN_SECTIONS, SECTIONS
    from fedhet.registry import KIND_LABELS, builtins

    out = [
        "# Configuration reference",
        "",
        "Generated from the code (by `fedhet list --reference` and the documentation's build):",
        "every key a configuration file accepts, section by section. A section's own keys come",
        "first; a key that names a",
        "plug-in (`[system] model`, `[run] pool`, ...) is followed by each built-in choice and",
        "the keys it adds to the same table. `fedhet list KIND NAME` prints one plug-in's entry.",
        "",
    ]
    for name in PLUGIN_SECTIONS:
        section: Any = SECTIONS[name]
        out += [f"## [{name}]", "", inspect.cleandoc(section.__doc__ or ""), ""]
        out += _table(section_entries(section)) + [""]
        for slot, kind in section.SLOTS.items():
            for plugin, entry in sorted(builtins(kind).items()):
                rows = plugin_entries(entry)
                if rows:
                    out += [f'### [{name}] {slot} = "{plugin}" ({KIND_LABELS[kind]})', ""]
                    out += [entry.summary, ""] + _table(rows) + [""]
    out += ["## [algorithm]", "", "`name`: the algorithm; its options in the same table.", ""]
    for plugin, entry in sorted(builtins("algorithm").items()):
        out += [f'### [algorithm] name = "{plugin}"', "", entry.summary, ""]
        rows = plugin_entries(entry)
        out += (_table(rows) if rows else ["No options."]) + [""]
    return "\n".join(out)


def undocumented_keys() -> list[str]:
    """``section.key (owner)`` for every accepted key whose meaning the code does not state."""
    from fedhet.config import PLUGIN_SECTIONS, SECTIONS
    from fedhet.registry import builtins

    missing = []
    for name in PLUGIN_SECTIONS:
        section: Any = SECTIONS[name]
        missing += [f"{name}.{r.key}" for r in section_entries(section) if not r.doc]
        for kind in {*section.SLOTS.values(), *(("algorithm",) if name == "run" else ())}:
            for plugin, entry in sorted(builtins(kind).items()):
                missing += [f"{kind} {plugin}: {r.key}" for r in plugin_entries(entry) if not r.doc]
    return sorted(set(missing))
