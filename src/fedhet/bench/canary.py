"""A method's behaviour in a scenario, as a short hash: its canary.

A field's rows (``fedhet bench --against``) stay reusable by any build on which the field's
methods behave as they did when it ran. The code fingerprint cannot say that: an edit to a
page, a test or an unrelated module changes fedhet's sources and refused every later build.
A canary is a short deterministic run of the scenario with the method (its fixed options,
the searched keys at their configuration defaults; seed 1, a few rounds on a small share of
the data, the in-process pool, one thread), and its fingerprint is a hash of what that run
wrote: every metrics row, each number to :data:`DIGITS` significant digits (a change of
order in a float sum does not count, a change of behaviour does), and how it stopped. The
bench records each (scenario, method)'s canary with its row; ``--against`` runs the same
canaries on the build in use and takes the rows whose canary matches.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import logging
import tempfile
from pathlib import Path

from fedhet.bench.suite import Method, Scenario, Suite

ROUNDS = 10  # rounds (server steps) a canary runs
DATA_FRACTION = 0.05  # the share of the training and test examples it keeps (at most)
DIGITS = 6  # significant digits of each number it hashes


def canary_config(suite: Suite, scenario: Scenario, method: Method) -> dict:
    """The canary run's raw configuration: the seed run's, made short and deterministic."""
    raw = suite.config(scenario, method, {}, "canary", seed=1)
    run = raw.setdefault("run", {})
    run.update(rounds=ROUNDS, eval_every=ROUNDS, eval_interval=0.0, pool="in-process", threads=1,
               device="cpu")  # fmt: skip
    data = raw.setdefault("data", {})
    data["fraction"] = min(float(data.get("fraction", 1.0)), DATA_FRACTION)
    return raw


def _rounded(text: str) -> str:
    try:
        return f"{float(text):.{DIGITS}g}"
    except ValueError:
        return text


def behaviour(folder: Path, stopped: str) -> str:
    """The hash of a finished canary run in ``folder`` (its metrics rows, rounded) and of
    how it stopped."""
    with open(folder / "metrics.csv", newline="") as handle:
        rows = [[_rounded(cell) for cell in row] for row in csv.reader(handle)]
    text = json.dumps({"metrics": rows, "stopped": stopped}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def _canary(document: str) -> str:
    from fedhet.config import from_dict
    from fedhet.engine.launch import run
    from fedhet.errors import FedhetError

    log = logging.getLogger("fedhet")
    level = log.level
    log.setLevel(logging.ERROR)  # its caveats are the seed runs' to say
    try:
        with tempfile.TemporaryDirectory(prefix="fedhet-canary-") as folder:
            try:
                result = run(from_dict(json.loads(document)), Path(folder) / "run", overwrite=True)
            except FedhetError as exc:  # a method that cannot run there behaves that way
                return hashlib.sha256(f"failed: {exc}".encode()).hexdigest()[:16]
            return behaviour(Path(result.path), str(result.summary.get("stopped_by")))
    finally:
        log.setLevel(level)


def canary_fingerprint(suite: Suite, scenario: Scenario, method: Method) -> str:
    """The hash of the method's canary run in ``scenario`` on this build (computed once per
    process and configuration)."""
    return _canary(json.dumps(canary_config(suite, scenario, method), sort_keys=True, default=str))
