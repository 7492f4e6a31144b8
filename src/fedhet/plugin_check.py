"""``fedhet check PLUGIN_OR_CONFIG``: try a plug-in (or a configuration's plug-ins) on a tiny
run before a long one, and say which part fails and why.

Given ``package.module:ClassName`` (an algorithm) it is tried on a small default setting
(scikit-learn's digits, an MLP, half the clients stragglers); given a configuration file, on
that configuration cut to a few rounds (``--rounds N``; by default 5, so that evaluations
follow the first checkpoint for several rounds). Three checks, each one line, ``ok`` or why
not:

1. **class**: the plug-in resolves and passes the registry's checks (its base class, its
   declared capabilities against its hooks, its hooks' signatures, its options);
2. **rounds**: a run of N rounds calls every hook the configuration uses (plan, tasks,
   the client hooks, aggregation, round metrics, evaluation); a failure names the hook and
   the round;
3. **resume**: the same rounds, interrupted after the first and resumed, end with the same
   metrics (the server state through ``state_dict`` / ``load_state_dict``, client state,
   system state all checkpointed).
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Callable
from pathlib import Path

from fedhet.errors import ConfigError, FedhetError

ROUNDS = 5  # the default: a bug that shows from round 4 or 5 is found too
MAX_CHECK_ROUNDS = 10_000
TINY = {
    "run": {"name": "check", "seed": 1, "rounds": ROUNDS, "eval_every": 1, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.5},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 8, "local_steps": 2},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}


def check(target: str, report: Callable[[str], None] = print, rounds: int = ROUNDS) -> bool:
    """Run the checks on ``target`` (a ``module:Class`` algorithm or a configuration file;
    a configuration's ``[compare]``: each of its algorithms) over ``rounds`` rounds (at least
    2: the resume check interrupts after the first); ``report`` gets one line per check.
    Whether all passed."""
    from fedhet.config import apply_overrides, read_toml

    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 2 <= rounds <= MAX_CHECK_ROUNDS:
        raise ConfigError(f"--rounds {rounds!r}: expected a whole number of rounds in 2..{MAX_CHECK_ROUNDS}")
    if Path(target).suffix == ".toml" or Path(target).is_file():
        raw = read_toml(target)
    else:
        raw = {**TINY, "algorithm": {"name": target}}
    cadence = ["run.eval_every=1", "run.eval_interval=0"]
    raw = apply_overrides(raw, [f"run.rounds={rounds}", *cadence, "run.time_budget=0"])
    if not raw.get("compare", {}).get("algorithms"):
        return _check_one(raw, report)
    from fedhet.studies.expansion import compare_cells

    try:
        cells = compare_cells(raw, target)
    except FedhetError as exc:
        report(f"class: {exc}")
        return False
    passed = []
    for cell in cells:  # each compared algorithm on its own, its lines prefixed with its name
        passed.append(_check_one(cell.config.to_dict(), _prefixed(report, cell.name)))
    return all(passed)


def _prefixed(report: Callable[[str], None], name: str) -> Callable[[str], None]:
    """``report`` with each line prefixed by ``name``."""
    return lambda line: report(f"{name}: {line}")


def _check_one(raw: dict, report: Callable[[str], None]) -> bool:
    from fedhet.config import from_dict

    results = []
    try:
        config = from_dict(raw)
    except FedhetError as exc:
        report(f"class: {exc}")
        return False
    report(f"class: ok ({config.algorithm_name}, system {config.system.model}, data {config.data.dataset})")
    with tempfile.TemporaryDirectory(prefix="fedhet-check-") as scratch:
        results.append(_try("rounds", lambda: _rounds(config, Path(scratch)), report))
        if results[-1]:
            results.append(_try("resume", lambda: _resume(config, Path(scratch)), report))
    return all(results)


def _try(name: str, step: Callable[[], str], report: Callable[[str], None]) -> bool:
    try:
        note = step()
    except FedhetError as exc:
        report(f"{name}: {str(exc).split('; the checkpoint')[0]}")
        return False
    except Exception as exc:  # noqa: BLE001  (reported, one line)
        report(f"{name}: {type(exc).__name__}: {exc}")
        return False
    report(f"{name}: ok ({note})")
    return True


def _rounds(config, scratch: Path) -> str:
    from fedhet.data.task import Score
    from fedhet.engine.launch import run

    result = run(config, scratch / "whole")
    metric = Score.from_summary(result.summary).metric  # the task's score (a regression's rmse)
    value = result.summary.get(f"final_test_{metric}")
    shown = "none" if value is None else f"{value:.3f}"
    return f"{len(result.metrics)} rounds, final test {metric} {shown}"


def _resume(config, scratch: Path) -> str:
    from fedhet.engine.loop import RunLoop

    RunLoop(config, scratch / "cut").run(stop_after=1)
    RunLoop(config, scratch / "cut").run(resume=True)
    whole, cut = _rows(scratch / "whole"), _rows(scratch / "cut")
    if whole != cut:
        differs = next(i for i, (a, b) in enumerate(zip(whole, cut, strict=False), start=1) if a != b)
        raise FedhetError(
            f"interrupted after round 1 and resumed, the run differs from round {differs} on: the rule "
            "keeps state its state_dict / load_state_dict (or client state) does not restore"
        )
    return "interrupted after round 1 and resumed: the same metrics"


def _rows(folder: Path) -> list[dict]:
    with open(folder / "metrics.csv", encoding="utf-8") as fh:
        return [{k: v for k, v in row.items() if "wall" not in k} for row in csv.DictReader(fh)]
