"""The configuration reference is generated from the code: every key a configuration accepts
is in it with its type, default and meaning, an option added without saying what it means
is caught, and `fedhet list KIND NAME` prints the same entry."""

from __future__ import annotations

import dataclasses

from fedhet.cli import main
from fedhet.config import PLUGIN_SECTIONS, SECTIONS
from fedhet.reference import plugin_text, reference_markdown, undocumented_keys
from fedhet.registry import builtins, option_fields, resolve


def _accepted_keys() -> set[tuple[str, str]]:
    """(section, key) of every key a configuration file accepts: each section's own keys and
    every built-in plug-in's options its slots can name, and every algorithm's options."""
    keys = set()
    for name in PLUGIN_SECTIONS:
        section = SECTIONS[name]
        keys |= {(name, f.name) for f in dataclasses.fields(section)}
        for kind in section.SLOTS.values():
            keys |= {(name, key) for entry in builtins(kind).values() for key in option_fields(entry.cls)}
    algorithms = builtins("algorithm").values()
    keys |= {("algorithm", key) for entry in algorithms for key in option_fields(entry.cls)}
    return keys


def test_every_accepted_key_is_in_the_reference_with_its_meaning():
    """Each key appears as a row of its section's part of the reference, and no row says
    '(undocumented)'."""
    text = reference_markdown()
    names = (*PLUGIN_SECTIONS, "algorithm")
    parts = {name: text.split(f"## [{name}]", 1)[1].split("\n## [", 1)[0] for name in names}
    missing = [f"{s}.{k}" for s, k in sorted(_accepted_keys()) if f"| `{k}` |" not in parts[s]]
    assert not missing, missing
    assert "(undocumented)" not in text
    assert undocumented_keys() == []


def test_an_option_added_without_its_meaning_fails_the_reference(monkeypatch):
    """A plug-in option with no comment and no docstring clause is reported as undocumented
    (and shown so in the reference) until its meaning is written where it is declared."""
    fedavg = resolve("algorithm", "fedavg", "test").cls

    @dataclasses.dataclass
    class WithNewKnob(fedavg.Options):
        new_knob: int = 3

    monkeypatch.setattr(fedavg, "Options", WithNewKnob)
    assert "algorithm fedavg: new_knob" in undocumented_keys()
    assert "| `new_knob` | int | `3` | (undocumented) |" in reference_markdown()

    @dataclasses.dataclass
    class Documented(fedavg.Options):
        new_knob: int = 3  # how many knobs to turn

    monkeypatch.setattr(fedavg, "Options", Documented)
    assert "algorithm fedavg: new_knob" not in undocumented_keys()


def test_fedhet_list_prints_the_reference_entry(capsys):
    """``fedhet list algorithm fedprox`` shows each option's type, default and the meaning
    the reference gives."""
    assert main(["list", "algorithm", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert plugin_text(resolve("algorithm", "fedprox", "test")) in out
    assert "mu                     float      default 0.01" in out and "proximal weight" in out
