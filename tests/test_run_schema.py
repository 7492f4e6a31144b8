"""One run-folder schema: a grid's cells.csv and table, the HTML report's runs table and
every objective's direction follow the run's task (a regression's RMSE, lower is better),
and a classification grid's cells.csv keeps the columns it always had."""

from __future__ import annotations

import csv
import io

from conftest import fedhet_in_process

from fedhet import run_schema
from fedhet.data.task import Classification, Regression, Task

GRID = """
[experiment]
name = "{name}"

[run]
seed = 1
rounds = 2
threads = 1

[data]
dataset = "{dataset}"
num_clients = 4

[model]
name = "mlp"
hidden = [8]

[system]
model = "straggler-ratio"
straggler_ratio = 0.5
deadline = 1.0

[grid]
"algorithm.name" = ["fedavg", "salf"]
"""


def _grid(tmp_path, dataset: str) -> tuple[list[dict], str]:
    path = tmp_path / f"{dataset}.toml"
    path.write_text(GRID.format(name=dataset, dataset=dataset))
    code, output = fedhet_in_process(["reproduce", str(path), "--out", str(tmp_path / dataset), "--quiet"])
    assert code == 0, output
    rows = list(csv.DictReader(io.StringIO((tmp_path / dataset / "cells.csv").read_text())))
    return rows, (tmp_path / dataset / "table.md").read_text()


def test_a_regression_grids_cells_and_table_carry_its_rmse(tmp_path):
    rows, table = _grid(tmp_path, "diabetes")
    tail = ["final_test_rmse", "best_test_rmse", "final_test_loss", "rounds", "sim_time", "stopped_by",
            "caveats", "fedhet"]  # fmt: skip
    assert list(rows[0])[-8:] == tail
    assert "accuracy" not in ",".join(rows[0])
    for row in rows:  # the table's values are each cell's final RMSE (its default value: the task's score)
        assert f"{float(row['final_test_rmse']):.3f}" in table


def test_a_classification_grid_keeps_its_columns(tmp_path):
    rows, _ = _grid(tmp_path, "digits")
    tail = ["seed", "final_test_accuracy", "best_test_accuracy", "final_test_loss", "rounds", "sim_time",
            "stopped_by", "caveats", "fedhet"]  # fmt: skip
    assert list(rows[0])[-9:] == tail


class F1Task(Classification):
    """A plug-in task whose extra metric, f1, grows as a model improves."""

    def metric_names(self) -> tuple[str, ...]:
        return (*super().metric_names(), "f1")

    def higher_is_better_for(self, metric: str) -> bool | None:
        return True if metric == "f1" else super().higher_is_better_for(metric)


def test_every_numbers_direction_comes_from_the_schema_and_the_task():
    assert run_schema.higher_is_better("final_test_accuracy") is True
    assert run_schema.higher_is_better("best_test_rmse", Regression()) is False
    assert run_schema.higher_is_better("final_test_loss", Classification()) is False
    assert run_schema.higher_is_better("final_test_f1", F1Task()) is True
    assert run_schema.higher_is_better("final_test_f1", Task()) is False  # unknown: lower
    for plain in ("sim_time", "rounds", "energy", "mean_round_time", "time_to:0.8"):
        assert run_schema.higher_is_better(plain) is False
    names = [n.name for n in run_schema.task_numbers(Regression())]
    assert names == ["final_test_loss", "best_test_loss", "final_test_rmse", "best_test_rmse"]


def test_the_html_reports_runs_table_shows_each_runs_score(tmp_path):
    from fedhet.results import RunDirectory
    from fedhet.studies.report import _runs_table

    summaries = {tmp_path / "r": {"name": "r", "score": {"metric": "rmse", "higher_is_better": False},
                                  "final_test_rmse": 0.5, "best_test_rmse": 0.4}}  # fmt: skip
    html = _runs_table([RunDirectory(tmp_path / "r")], summaries)
    assert "final_test_rmse" in html and "0.5" in html and "accuracy" not in html


def test_a_band_over_two_seeds_stays_within_the_metrics_range():
    """Two seeds far apart give a t-interval wider than the metric: the report's band is
    clipped to it (an accuracy in [0, 1], an RMSE not below 0)."""
    import numpy as np

    from fedhet.studies.report import seed_band

    mean, lower, upper = seed_band(np.array([[0.2, 0.9], [0.5, 0.51]]), "accuracy")
    assert lower[0] == 0.0 and upper[0] == 1.0 and 0.0 < lower[1] < mean[1] < upper[1] < 1.0
    _, lower, _ = seed_band(np.array([[0.1, 3.0]]), "rmse")
    assert lower[0] == 0.0


def test_a_plug_ins_one_line_summary_is_its_first_sentence_in_plain_text():
    """``fedhet list``'s lines: a docstring's first sentence, whole (abbreviations such as
    "Sec." and "i.i.d." end none), without reStructuredText markup."""
    from fedhet.registry import first_sentence

    doc = """AMSFL Sec. 3.4: client ``i`` needs c_i seconds, i.i.d. over rounds; see
    :class:`~fedhet.system.base.SystemModel`. A second sentence.

    A second paragraph."""
    assert first_sentence(doc) == (
        "AMSFL Sec. 3.4: client i needs c_i seconds, i.i.d. over rounds; see SystemModel."
    )
