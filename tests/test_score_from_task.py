"""The direction of an objective comes from the run's task: a plug-in task whose score grows
(a macro F1) is maximised by ``fedhet tune`` and ``fedhet bench``, not minimised as a metric
the built-in list does not know; a suite's ``direction`` key is honoured (it was accepted and
ignored) and a bad one refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import tomli_w
import torch
from conftest import SMOKE_SUITE

from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.data.sources import load_digits
from fedhet.data.task import Classification
from fedhet.errors import ConfigError
from fedhet.run_schema import objective_direction


class MacroF1(Classification):
    """Classification judged by its macro F1 (higher is better)."""

    name = "classification-f1"
    score = "f1"

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        sums = super().batch_sums(output, target)
        predicted, classes = output.argmax(1), output.shape[1]
        for c in range(classes):
            sums[f"tp{c}"] = int(((predicted == c) & (target == c)).sum())
            sums[f"fp{c}"] = int(((predicted == c) & (target != c)).sum())
            sums[f"fn{c}"] = int(((predicted != c) & (target == c)).sum())
        return sums

    def metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        classes = sum(1 for key in sums if key.startswith("tp"))
        f1 = [2 * sums[f"tp{c}"] / max(1, 2 * sums[f"tp{c}"] + sums[f"fp{c}"] + sums[f"fn{c}"])
              for c in range(classes)]  # fmt: skip
        return {"loss": sums["loss"] / count, "f1": sum(f1) / max(1, classes)}

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "f1")


class DigitsF1(DatasetSource):
    """scikit-learn's digits, judged by macro F1."""

    name = "digits-f1"

    @classmethod
    def build(cls, options, ctx=None) -> Dataset:
        return dataclasses.replace(load_digits(), task=MacroF1())


def test_the_task_says_which_way_its_metrics_go():
    task = MacroF1()
    assert objective_direction("final_test_f1", task) == "maximize"
    assert objective_direction("best_test_f1", task) == "maximize"
    assert objective_direction("final_test_loss", task) == "minimize"
    assert objective_direction("final_test_f1") == "minimize"  # without the task: the built-in list
    assert objective_direction("sim_time", task) == "minimize"


CONFIG = {
    "run": {"name": "f1", "seed": 1, "rounds": 2, "threads": 1},
    "data": {"dataset": "test_score_from_task:DigitsF1", "num_clients": 4, "validation_fraction": 0.2},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "algorithm": {"name": "fedavg"},
}


def test_tune_maximises_a_plugin_tasks_f1(tmp_path, monkeypatch):
    from fedhet.studies.tune import _check_before_trials, load_space

    space_path = tmp_path / "space.toml"
    space_path.write_text(tomli_w.dumps({"objective": {"value": "final_test_f1"},
                                         "params": {"train.lr": {"low": 0.01, "high": 0.3}}}))  # fmt: skip
    space = load_space(space_path)
    _check_before_trials(space, [(None, CONFIG)], 1, None, tmp_path / "c.toml", False)
    assert space.direction == "maximize"
    (tmp_path / "told.toml").write_text(space_path.read_text().replace(
        'value = "final_test_f1"', 'value = "final_test_f1"\ndirection = "minimize"'))  # fmt: skip
    told = load_space(tmp_path / "told.toml")
    _check_before_trials(told, [(None, CONFIG)], 1, None, tmp_path / "c.toml", False)
    assert told.direction == "minimize"  # what the file says stands


def _suite(tmp_path, *lines: str) -> str:
    text = SMOKE_SUITE.read_text()
    text = text.replace('objective = "final_test_accuracy"', "\n".join(lines))
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return str(path)


def test_a_bench_maximises_a_plugin_tasks_f1_and_honours_a_suites_direction(tmp_path):
    from fedhet.bench.runner import Bench
    from fedhet.bench.suite import load_suite

    f1 = Path(_suite(tmp_path, 'objective = "final_test_f1"'))
    f1.write_text(f1.read_text().replace('dataset = "digits"', 'dataset = "test_score_from_task:DigitsF1"'))
    suite = load_suite(f1)
    Bench(suite, tmp_path / "bench")._check_engines()  # the checks before anything runs
    assert suite.direction == "maximize" and not (tmp_path / "bench").exists()
    minimise = load_suite(_suite(tmp_path, 'objective = "final_test_accuracy"', 'direction = "minimize"'))
    assert minimise.direction == "minimize"  # was accepted and ignored (maximize)
    with pytest.raises(ConfigError, match="suite.direction = 'down': maximize or minimize") as err:
        load_suite(_suite(tmp_path, 'objective = "final_test_accuracy"', 'direction = "down"'))
    assert "\n" not in str(err.value)


def test_a_regression_with_client_evaluation_writes_each_clients_rmse(tmp_path):
    """client_metrics.csv has the task's columns: a regression's loss and rmse (it had an
    empty accuracy column and no rmse), and the summary each client's final RMSE."""
    import csv

    from conftest import config_from

    from fedhet.engine.launch import run

    config = config_from({**CONFIG, "data": {"dataset": "diabetes", "num_clients": 4}},
                         run={"rounds": 4, "eval_every": 2, "client_eval": True})  # fmt: skip
    summary = run(config, tmp_path / "r").summary
    with open(tmp_path / "r" / "client_metrics.csv") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == ["round", "client", "examples", "loss", "rmse"]
    assert len(rows) == 2 * 4 and all(float(r["rmse"]) > 0 for r in rows)
    last = {r["client"]: float(r["rmse"]) for r in rows if r["round"] == "4"}
    assert summary["final_client_rmse"] == pytest.approx(last)


def test_a_grid_reports_a_regressions_rmse_and_refuses_a_metric_its_task_lacks(tmp_path):
    """``report.value = "final_test_rmse"`` (refused before: not in the closed list) gives a
    table of RMSEs; a metric the cells' task does not report is one line naming it."""
    from fedhet.studies.grid import load_experiment, report_table, run_experiment

    document = {k: dict(v) for k, v in CONFIG.items()}
    document["experiment"] = {"name": "rmse", "jobs": 1}
    document["grid"] = {"algorithm.name": ["fedavg", "salf"]}
    document["report"] = {"value": "final_test_rmse"}
    document["data"] = {"dataset": "diabetes", "num_clients": 4}
    document["system"] = {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0}
    path = tmp_path / "grid.toml"
    path.write_text(tomli_w.dumps(document))
    experiment = load_experiment(path)
    summaries = run_experiment(experiment, tmp_path / "out")
    table = report_table(experiment, summaries)
    for summary in summaries.values():
        assert f"| {summary['final_test_rmse']:.3f} " in f"{table} "  # each cell's RMSE, not a blank
    document["report"]["value"] = "final_test_accuracy_top5"
    path.write_text(tomli_w.dumps(document))
    with pytest.raises(
        ConfigError, match="report.value, cell .*: objective 'final_test_accuracy_top5'"
    ) as err:
        load_experiment(path)
    assert "\n" not in str(err.value) and "reporting loss, rmse" in str(err.value)


def test_fedhet_version_prints_the_commit_a_summary_records(capsys):
    """``fedhet --version`` says the build a run's summary records (version and commit in a
    checkout), not the bare package version."""
    from fedhet.build import fedhet_build
    from fedhet.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"fedhet {fedhet_build()}\n"
    import shutil

    if shutil.which("git") and (Path(__file__).resolve().parents[1] / ".git").exists():
        assert "+g" in fedhet_build()  # the commit, in a checkout
