"""``fedhet bench SUITE --method mine:Rule --against FIELD``: a new method compared with a
published field without running the field again. The field is a bench's
``leaderboard.csv`` or its folder (its ``bench.json``, which keeps the runs' folders for the
curves). Each row of the suite's own methods is taken only when it was made by the same
study settings (suite, scenario, data, search space, trial budget, tunings, seeds: the
``settings`` fingerprint) and when the method behaves on this build as on the one that made
the field (its ``canary``, a short deterministic run: :mod:`fedhet.bench.canary`; a field
from before canaries needs the same code, the ``code`` fingerprint), so that a commit that
changes no method's behaviour keeps a published field usable; anything else is refused in
one line, before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedhet.bench.suite import Suite
from fedhet.errors import FedhetError

# what a results row of a bench.json holds that --against reads
ROW_KEYS = ("scenario", "method", "status", "tunings", "code", "settings")


def read_rows(path: str | Path) -> list[dict]:
    """The results rows of a field: a bench folder's ``bench.json`` (or its
    ``leaderboard.csv``), or a ``leaderboard.csv``."""
    from fedhet.bench.leaderboard import read_csv

    path = Path(path)
    if path.is_dir():
        if (path / "bench.json").is_file():
            try:
                rows = list(json.loads((path / "bench.json").read_text(encoding="utf-8"))["rows"])
            except (ValueError, KeyError, TypeError) as exc:
                raise FedhetError(f"--against {path}: bench.json is not a bench's results ({exc})") from None
            for number, row in enumerate(rows, start=1):
                missing = [k for k in ROW_KEYS if not isinstance(row, dict) or k not in row]
                if missing:
                    raise FedhetError(f"--against {path}: bench.json, row {number}: no {missing[0]!r}")
            return rows
        path = path / "leaderboard.csv"
    if not path.is_file():
        raise FedhetError(f"--against {path}: no such file (a leaderboard.csv or a bench folder)")
    return read_csv(path)


def field_rows(path: str | Path, suite: Suite) -> list[dict]:
    """The field's rows of the suite's own (not ``--method``) methods, each checked against
    what this bench would run: the same settings, and the same behaviour on this build (its
    canary, :mod:`fedhet.bench.canary`; for a field from before canaries, the same code).
    Refused in one line naming the first row of other settings, or every method that
    behaves otherwise and the build that made the field."""
    from fedhet.bench.study import settings_fingerprint

    if not any(m.plugin for m in suite.methods):
        raise FedhetError("--against: give the method to compare with --method NAME_OR_PATH")
    rows = {(r["scenario"], r["method"]): r for r in read_rows(path)}
    taken, changed = [], []
    for scenario in suite.scenarios:
        for method in suite.methods:
            if method.plugin:
                continue
            row = rows.get((scenario.name, method.label))
            where = f"--against {path}: scenario {scenario.name}, method {method.label}"
            if row is None:
                raise FedhetError(f"{where}: not in the field (it ran another suite: run the whole bench)")
            if row.get("settings") != settings_fingerprint(suite, scenario, method):
                raise FedhetError(
                    f"{where}: made with other settings (the suite, its data, search space, trial "
                    "budget, tunings or seeds differ from this bench's): run the whole bench"
                )
            if not row.get("canary") and not _same_code(row, method):
                raise FedhetError(
                    f"{where}: made by other code (the method's class or fedhet's sources changed "
                    "since the field ran, and the field has no canaries to compare behaviour): run the "
                    "whole bench"
                )
            if row.get("canary") and not _behaves_alike(row, suite, scenario, method):
                changed.append(f"{method.label} in {scenario.name}")
            taken.append(row)
    if changed:
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise FedhetError(
            f"--against {path}: on this build {', '.join(changed[:4])}{more} behave otherwise than on the "
            f"build that made the field ({field_build(taken)}): run the whole bench, or that build"
        )
    return taken


def _same_code(row: dict, method) -> bool:
    from fedhet.bench.study import code_fingerprint

    return row.get("status") not in ("ok", "failed") or row.get("code") == code_fingerprint(method)


def _behaves_alike(row: dict, suite: Suite, scenario, method) -> bool:
    """Whether the method's canary in the scenario on this build is the field's (a row
    where nothing ran, skipped or not applicable, has none to compare)."""
    from fedhet.bench.canary import canary_fingerprint

    if row.get("status") not in ("ok", "failed"):
        return True
    return row["canary"] == canary_fingerprint(suite, scenario, method)


def field_build(rows: list[dict]) -> str:
    """The fedhet builds that made a field's seed runs (``unknown`` where none is recorded)."""
    builds = {
        b for row in rows for tuning in row.get("tunings", []) for result in tuning.get("seeds", {}).values()
        for b in str(result.get("fedhet") or "").split(";") if b
    }  # fmt: skip
    return ", ".join(sorted(builds)) or "unknown"
