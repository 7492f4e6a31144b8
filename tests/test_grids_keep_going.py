"""Grids that keep going: a plug-in given by module path is a grid axis value (its folder is
its class name); a failing cell is recorded as failed with its reason while the other cells
run, the table marks it and the exit status says so, and running again retries it; a
[compare] in an experiment file is one more axis; an experiment file given to `fedhet run`
points at `reproduce`; `--set algorithm.name` switches algorithms (the old one's options go,
with a warning) and `--unset` removes a key."""

from __future__ import annotations

import json
import logging

import tomli_w

from fedhet.algorithms.fedavg import FedAvg
from fedhet.cli import main
from fedhet.config import apply_overrides, from_dict

BASE = {
    "run": {"name": "g", "seed": 1, "rounds": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "full"},
    "algorithm": {"name": "fedavg"},
    "experiment": {"name": "g", "jobs": 1},
}
FAIL = {"on": True}


class MyAverage(FedAvg):
    """A researcher's own rule, given by module path."""


class SometimesBroken(FedAvg):
    def aggregate(self, params, buffers, updates, state, context, layout):
        if FAIL["on"]:
            raise ArithmeticError("not today")
        return super().aggregate(params, buffers, updates, state, context, layout)


def _write(tmp_path, document: dict, name: str = "exp.toml") -> str:
    path = tmp_path / name
    path.write_text(tomli_w.dumps(document))
    return str(path)


def test_a_module_path_is_a_grid_axis_value(tmp_path, capsys):
    document = {**BASE, "grid": {"algorithm.name": ["fedavg", "test_grids_keep_going:MyAverage"]}}
    out = tmp_path / "out"
    assert main(["reproduce", _write(tmp_path, document), "--out", str(out), "--quiet"]) == 0
    assert (out / "fedavg" / "summary.json").is_file() and (out / "MyAverage" / "summary.json").is_file()
    table = (out / "table.md").read_text()
    assert "test_grids_keep_going:MyAverage" in table and "failed" not in table


def test_a_failing_cell_is_recorded_the_others_run_and_a_rerun_retries_it(tmp_path, capsys):
    FAIL["on"] = True
    document = {**BASE, "grid": {"algorithm.name": ["fedavg", "test_grids_keep_going:SometimesBroken"],
                                 "run.seed": [1, 2]}}  # fmt: skip
    path, out = _write(tmp_path, document), tmp_path / "out"
    try:
        assert main(["reproduce", path, "--out", str(out), "--quiet"]) == 1
        captured = capsys.readouterr()
        assert "2 of 4 cells failed" in captured.err and "ArithmeticError: not today" in captured.err
        summaries = json.loads((out / "summaries.json").read_text())
        assert sum(1 for s in summaries.values() if s.get("failed")) == 2
        assert sum(1 for s in summaries.values() if s.get("finished")) == 2
        assert "| failed |" in (out / "table.md").read_text()  # the broken column, both seeds
        FAIL["on"] = False  # fixed: the failed cells run again, the finished ones are kept
        assert main(["reproduce", path, "--out", str(out), "--quiet"]) == 0
        summaries = json.loads((out / "summaries.json").read_text())
        assert all(s.get("finished") for s in summaries.values())
        assert "failed" not in (out / "table.md").read_text()
    finally:
        FAIL["on"] = True


def test_a_compare_in_an_experiment_file_is_one_more_axis(tmp_path):
    from fedhet.studies.grid import load_experiment

    document = {**BASE, "algorithm": {"name": "fedprox", "mu": 0.5},
                "compare": {"algorithms": ["fedavg", "fedprox"]}, "grid": {"run.seed": [1, 2]}}  # fmt: skip
    experiment = load_experiment(_write(tmp_path, document))
    assert [c.name for c in experiment.cells] == ["1-fedavg", "1-fedprox-0.5", "2-fedavg", "2-fedprox-0.5"]
    mus = {c.name: c.config.algorithm.to_dict().get("mu") for c in experiment.cells}
    assert mus["1-fedprox-0.5"] == 0.5 and mus["1-fedavg"] is None


def test_an_experiment_file_given_to_run_points_at_reproduce(tmp_path, capsys):
    document = {**BASE, "grid": {"run.seed": [1, 2]}}
    assert main(["run", _write(tmp_path, document), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "fedhet reproduce" in err and "\n" not in err


def test_set_switches_the_algorithm_and_unset_removes_a_key(caplog):
    raw = {k: v for k, v in BASE.items() if k != "experiment"}
    raw["algorithm"] = {"name": "fedprox", "mu": 0.1}
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        switched = from_dict(apply_overrides(raw, ["algorithm.name=salf"]))
    assert switched.algorithm_name == "salf"
    assert "algorithm.name: 'fedprox' -> 'salf': the options of 'fedprox' (mu) are dropped" in caplog.text
    unset = apply_overrides(raw, ["-algorithm.mu", "-train.lr"])
    assert "mu" not in unset["algorithm"] and "lr" not in unset["train"] and raw["algorithm"]["mu"] == 0.1
    assert from_dict(unset).train.lr == from_dict({**raw, "train": {"batch_size": 8}}).train.lr


def test_unset_on_the_command_line(tmp_path, capsys):
    raw = {k: v for k, v in BASE.items() if k != "experiment"}
    raw["algorithm"] = {"name": "fedprox", "mu": 0.1}
    path = _write(tmp_path, raw, "c.toml")
    assert main(["run", path, "--out", str(tmp_path / "r"), "--quiet", "--unset", "algorithm.mu"]) == 0
    assert "mu = 0.1" not in (tmp_path / "r" / "config.toml").read_text()
    assert main(["run", path, "--out", str(tmp_path / "r2"), "--unset", "algorithm.nu"]) == 2
    assert "--unset algorithm.nu: the configuration has no such key" in capsys.readouterr().err


def test_a_grid_table_exports_to_csv_and_latex(tmp_path, capsys):
    document = {**BASE, "grid": {"algorithm.name": ["fedavg", "salf"], "run.seed": [1, 2]},
                "report": {"columns": ["algorithm.name"]}}  # fmt: skip
    path, out = _write(tmp_path, document), tmp_path / "out"
    assert main(["reproduce", path, "--out", str(out), "--quiet", "--format", "csv"]) == 0
    import csv

    rows = list(csv.reader(l for l in (out / "table.csv").read_text().splitlines() if not l.startswith("#")))
    assert rows[0] == ["run", "fedavg", "salf"] and " ± " in rows[1][1]
    assert (out / "table.md").is_file()
    assert main(["reproduce", path, "--out", str(out), "--quiet", "--format", "latex"]) == 0
    tex = (out / "table.tex").read_text()
    assert tex.startswith(r"\begin{tabular}{lrr}") and r"$\pm$" in tex and r"\end{tabular}" in tex


def test_the_report_of_a_grid_renders_its_table_and_bands_over_seeds(tmp_path):
    document = {**BASE, "grid": {"algorithm.name": ["fedavg", "salf"], "run.seed": [1, 2, 3]},
                "report": {"columns": ["algorithm.name"]}}  # fmt: skip
    path, out = _write(tmp_path, document), tmp_path / "out"
    assert main(["reproduce", path, "--out", str(out), "--quiet"]) == 0
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "<th>fedavg</th>" in page and "<th>salf</th>" in page and "<pre>| run" not in page
    assert "mean and 95% confidence band over seeds" in page
    from fedhet.results import RunDirectory
    from fedhet.studies.report import _seed_groups

    groups = _seed_groups([RunDirectory(p) for p in sorted(out.iterdir()) if (p / "config.toml").exists()])
    assert sorted(len(g) for g in groups.values()) == [3, 3]
