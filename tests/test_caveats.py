"""Comparisons that say nothing are flagged: a rule that is provably another under the
settings (FedProx with one local step is drop-stragglers, and the metrics show it), and a
run in which most clients can never deliver (FedStale's rule keeps only finished work: under
fixed stragglers they never report) get one warning line each, kept in the summary and
marked in a grid's table; a normal comparison gets none."""

from __future__ import annotations

import csv
import logging

import tomli_w

from fedhet.cli import main
from fedhet.config import from_dict
from fedhet.engine.launch import run

BASE = {
    "run": {"name": "cav", "seed": 2, "rounds": 4, "threads": 1, "eval_every": 2},
    "data": {"dataset": "digits", "num_clients": 10, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8, "local_steps": 1},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}


def _run(tmp_path, name: str, **changes):
    document = {section: dict(values) for section, values in BASE.items()}
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        document.setdefault(section, {})[key] = value
    document["algorithm"] = {"name": name, **document.get("algorithm", {})}
    return run(from_dict(document), tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}")


def _rows(result) -> list[dict]:
    with open(result.path / "metrics.csv") as fh:
        return [{k: v for k, v in row.items() if "wall" not in k} for row in csv.DictReader(fh)]


def test_fedprox_with_one_local_step_is_flagged_and_is_drop_stragglers(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        prox = _run(tmp_path, "fedprox")
    assert "fedprox with train.local_steps = 1 is drop-stragglers" in caplog.text
    assert prox.summary["caveats"][0].startswith("fedprox with train.local_steps = 1")
    drop = _run(tmp_path, "drop")
    assert "caveats" not in drop.summary
    assert _rows(prox) == _rows(drop)  # the caveat is true: the same run
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        several = _run(tmp_path, "fedprox", **{"train.local_steps": 3})
    assert "caveats" not in several.summary and "drop-stragglers" not in caplog.text


def test_fixed_stragglers_under_a_rule_that_keeps_only_finished_work_are_flagged(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        stale = _run(tmp_path, "fedstale", **{"system.straggler_ratio": 0.8, "system.fixed_stragglers": True})
    assert "8 of 10 clients can never deliver an update" in caplog.text
    assert "can never deliver" in stale.summary["caveats"][0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        salf = _run(tmp_path, "salf", **{"system.straggler_ratio": 0.8, "system.fixed_stragglers": True})
        random = _run(tmp_path, "fedstale", **{"system.straggler_ratio": 0.8})  # stragglers drawn each round
    assert "caveats" not in salf.summary and "caveats" not in random.summary  # partial work counts;
    assert "never deliver" not in caplog.text  # or every client delivers some rounds


def test_a_grid_marks_its_caveated_cells(tmp_path):
    document = {**BASE, "algorithm": {"name": "drop"}, "experiment": {"name": "cav", "jobs": 1},
                "grid": {"algorithm.name": ["drop", "fedprox", "salf"]}}  # fmt: skip
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(document))
    assert main(["reproduce", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    table = (tmp_path / "out" / "table.md").read_text()
    header, _, values = table.splitlines()[:3]
    marked = [("⚠" in cell) for cell in values.split("|")[2:-1]]
    assert header.split("|")[2:-1] and marked == [False, True, False]
    assert "⚠: a run with a caveat" in table
