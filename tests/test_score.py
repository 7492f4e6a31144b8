"""The task's score, end to end: a regression run's metrics.csv has the task's columns only
(no accuracy), its best round and best values follow the lowest RMSE, ``run.targets`` are
RMSEs to get below, the console table shows RMSE, and ``fedhet tune`` optimises
``final_test_rmse`` downwards (pruning on test_rmse)."""

from __future__ import annotations

import json

import pytest

from fedhet.config import from_dict
from fedhet.data.task import Score, default_task
from fedhet.engine.launch import run
from fedhet.errors import ConfigError

DIABETES = {
    "run": {"name": "diabetes", "seed": 1, "rounds": 12, "eval_every": 2, "threads": 1},
    "data": {"dataset": "diabetes", "num_clients": 10},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.05, "batch_size": 16, "local_steps": 2},
    "algorithm": {"name": "fedavg"},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}


def _regression(tmp_path, **run_keys):
    document = {k: dict(v) for k, v in DIABETES.items()}
    document["run"].update(run_keys)
    result = run(from_dict(document), tmp_path / "r")
    return result, json.loads((tmp_path / "r" / "summary.json").read_text())


def test_a_regression_reports_its_own_columns_and_its_best_by_the_lowest_rmse(tmp_path):
    result, summary = _regression(tmp_path)
    header = (tmp_path / "r" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "test_accuracy" not in header and {"test_loss", "test_rmse"} <= set(header)
    assert summary["score"] == {"metric": "rmse", "higher_is_better": False}
    evaluated = [r for r in result.metrics if r.get("test_rmse") is not None]
    lowest = min(evaluated, key=lambda r: r["test_rmse"])
    assert summary["best_test_rmse"] == lowest["test_rmse"] and summary["best_round"] == lowest["round"]
    assert summary["best_test_loss"] == min(r["test_loss"] for r in evaluated)


def test_targets_of_a_regression_are_rmses_to_get_below(tmp_path):
    first = _regression(tmp_path / "a")[0]
    rmses = [r["test_rmse"] for r in first.metrics if r.get("test_rmse") is not None]
    reachable, never = max(rmses) + 1.0, min(rmses) / 2
    _result, summary = _regression(tmp_path / "b", targets=[reachable, never])
    assert summary["targets"][f"{reachable:g}"]["round"] == 2  # the first evaluation is below it
    assert summary["targets"][f"{never:g}"] is None


def test_the_classification_default_lives_in_one_place():
    task = default_task()
    assert task.name == "classification" and Score.of(task) == Score("accuracy", True)
    assert Score.from_summary({"final_test_accuracy": None, "final_test_rmse": 3.0}).column == "test_rmse"


def test_tune_optimises_the_rmse_downwards(tmp_path):
    from fedhet.studies.tune import load_space, tune

    space_file = tmp_path / "space.toml"
    space_file.write_text(
        '[objective]\nvalue = "final_test_rmse"\n[sampler]\nseed = 0\n[pruner]\nname = "none"\n'
        '[params]\n"train.lr" = { low = 0.001, high = 0.1, log = true }\n'
    )
    assert load_space(space_file).direction == "minimize"
    config_file = tmp_path / "diabetes.toml"
    import tomli_w

    from fedhet.studies.tune import read_trials

    document = {k: dict(v) for k, v in DIABETES.items()}
    document["run"].update(rounds=4, eval_every=2)
    document["data"]["validation_fraction"] = 0.2
    config_file.write_text(tomli_w.dumps(document))
    [best] = tune(str(config_file), str(space_file), trials=3, out=tmp_path / "tune")
    storage = f"sqlite:///{(tmp_path / 'tune' / 'study.db').resolve()}"
    values = [t["value"] for t in read_trials(storage, best["study"]) if t["value"] is not None]
    assert len(values) == 3 and best["value"] == min(values) and best["value"] > 1.0  # an RMSE


def test_an_objective_the_task_has_not_is_refused_in_one_line(tmp_path):
    from fedhet.studies.tune import load_space

    space_file = tmp_path / "space.toml"
    space_file.write_text(
        '[objective]\nvalue = "final_rmse"\n[params]\n"train.lr" = { low = 0.01, high = 0.1 }\n'
    )
    with pytest.raises(ConfigError, match=r"objective.value = 'final_rmse': final_test_<metric>"):
        load_space(space_file)


REGRESSION_SUITE = """
[suite]
name = "diabetes"
methods = ["fedavg", "drop", "salf"]
trials = 2
seeds = 2
objective = "final_test_rmse"
target = 80.0
random_trials = 2
pruner = "none"

[params]
"train.lr" = { low = 0.01, high = 0.1, log = true }

[run]
seed = 1
rounds = 100000
time_budget = 3.0
eval_every = 5

[data]
dataset = "diabetes"
num_clients = 10

[model]
name = "mlp"
hidden = [16]

[train]
batch_size = 16
local_steps = 1

[system]
model = "straggler-ratio"
deadline = 0.2

[scenarios.random-50]
"system.straggler_ratio" = 0.5

[scenarios.persistent-90]
"system.straggler_ratio" = 0.9
"system.fixed_stragglers" = true
"""


@pytest.mark.extended
def test_a_regression_bench_ranks_the_lowest_rmse_first(tmp_path):
    import csv

    from conftest import fedhet_in_process

    suite = tmp_path / "diabetes.toml"
    suite.write_text(REGRESSION_SUITE)
    out = tmp_path / "bench"
    status, stderr = fedhet_in_process(["bench", str(suite), "--out", str(out), "--quiet"])
    assert status == 0, stderr[-3000:]
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert {"mean_rmse", "rmse_by_seed"} <= set(rows[0]) and "mean_accuracy" not in rows[0]
    for scenario in ("random-50", "persistent-90"):
        ranked = [r for r in rows if r["scenario"] == scenario and r["rank"]]
        assert len(ranked) == 3
        by_rank = sorted(ranked, key=lambda r: int(r["rank"]))
        means = [float(r["mean_rmse"]) for r in by_rank]
        assert means == sorted(means) and means[0] > 1.0  # lowest RMSE first, in the target's units
        assert all(0.0 <= float(r["ci_low"]) <= float(r["mean_rmse"]) <= float(r["ci_high"]) for r in ranked)
    page = (out / "leaderboard.md").read_text()
    assert "test rmse [95% CI] (units)" in page


def test_fjords_self_distillation_follows_the_task():
    """FjORD's distillation term is the task's: a classification's soft cross-entropy (as
    before), a regression's squared error to the teacher's predictions, not a softmax of a
    single output (identically zero)."""
    import torch

    from fedhet.data.task import Classification, Regression

    student, teacher = torch.tensor([[0.2], [1.5]]), torch.tensor([[1.0], [0.5]])
    assert float(Regression().distillation(student, teacher)) == pytest.approx((0.8**2 + 1.0**2) / 2)
    logits = torch.tensor([[0.2, 1.0], [1.5, -0.3]])
    expected = torch.nn.functional.cross_entropy(logits, logits.flip(1).softmax(dim=1))
    assert torch.equal(Classification().distillation(logits, logits.flip(1)), expected)
    # a one-output model: the old softmax term was identically zero, the task's is not
    assert float(torch.nn.functional.cross_entropy(student, teacher.softmax(dim=1))) == 0.0
    assert float(Regression().distillation(student, teacher)) > 0


def test_depthfls_exit_consistency_on_a_regression_is_the_tasks_divergence_not_a_zero_softmax(tmp_path):
    """DepthFL's mutual self-distillation takes the task's divergence: on a one-output
    regression a softmax KL is identically zero (the term would do nothing), the squared
    error between exits is not, so the run with it trains differently from the run without."""
    import torch

    from fedhet.data.task import Classification, Regression

    outputs = [torch.tensor([[0.3], [1.2]]), torch.tensor([[0.1], [0.9]])]
    assert all(float(d) == 0.0 for d in Classification().divergences(outputs))  # one logit: no signal
    assert all(float(d) > 0.0 for d in Regression().divergences(outputs))
    losses = {}
    for distillation in (True, False):
        document = {k: dict(v) for k, v in DIABETES.items()}
        document["run"].update(rounds=3, eval_every=1)
        document["model"] = {"name": "mlp-exits", "hidden": [16, 16]}
        document["algorithm"] = {"name": "depthfl", "distillation": distillation, "consistency_rampup": 0}
        result = run(from_dict(document), tmp_path / str(distillation))
        losses[distillation] = [r["train_loss"] for r in result.metrics]
    assert losses[True] != losses[False]


def test_the_progress_line_shows_the_score_the_run_tells_it(tmp_path, capsys):
    """The run tells the progress display its task's score (not guessed from the row's
    columns): a row whose first metric is another one still shows the score."""
    from fedhet.console import ScoreReader, progress_printer

    reader = ScoreReader()
    row = {"round": 2, "test_loss": 0.4, "test_mae": 0.3, "test_rmse": 0.5}
    assert reader.read(row) == ("mae", 0.3)  # untold: the first column after the loss
    reader.tell(Score("rmse", False))
    assert reader.read(row) == ("rmse", 0.5) and reader.read({"round": 3, "test_rmse": None}) is None
    document = {k: dict(v) for k, v in DIABETES.items()}
    document["run"].update(rounds=2, eval_every=1)
    config = from_dict(document)
    run(config, tmp_path / "p", on_round=progress_printer(config, "diabetes", every=0.0))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("diabetes round")]
    assert lines and all("test_rmse" in line for line in lines)
