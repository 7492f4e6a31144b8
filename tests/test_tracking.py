"""Run tracking with the real libraries: an MLflow run read back from its SQLite store
(parameters, per-round metrics, artifacts, nesting, a resume continuing the same run), a
TensorBoard event file read back with TensorBoard's own reader, and a tracker that fails
while the run goes on."""

from __future__ import annotations

import csv
import json
import logging
import time

import pytest
import tomli_w

pytest.importorskip("mlflow", reason="tracking needs the extra: pip install 'fedhet[track]'")
pytest.importorskip("tensorboard", reason="tracking needs the extra: pip install 'fedhet[track]'")

from fedhet.cli import main  # noqa: E402
from fedhet.config import from_dict  # noqa: E402
from fedhet.engine.loop import RunLoop  # noqa: E402

BASE = {
    "run": {"name": "tracked", "seed": 1, "rounds": 6, "eval_every": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}


def _document(tmp_path, uri: str | None = None, **run) -> dict:
    """The base run, its MLflow tracker (if tracked) writing to ``uri`` (a store in tmp_path)."""
    uri = uri or f"sqlite:///{tmp_path / 'mlruns.db'}"
    track = [{"name": "mlflow", "uri": uri} if t == "mlflow" else t for t in run.pop("track", [])]
    return {**BASE, "run": {**BASE["run"], "track": track, **run}}


def _runs(tmp_path):
    """The runs of the store, read back through MLflow's own search (``mlflow.search_runs``)."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    try:
        runs = mlflow.search_runs(experiment_names=["fedhet"], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    return client, runs


def _metrics_csv(path):
    with open(path / "metrics.csv") as fh:
        return list(csv.DictReader(fh))


def test_an_mlflow_run_holds_the_config_every_round_and_the_artifacts(tmp_path):
    import mlflow

    result = RunLoop(from_dict(_document(tmp_path, track=["mlflow"])), tmp_path / "run").run()
    client, runs = _runs(tmp_path)
    assert len(runs) == 1
    found = runs[0]
    assert found.info.status == "FINISHED" and found.info.run_name == "tracked"
    params = found.data.params
    assert params["train.lr"] == "0.1" and params["algorithm.name"] == "salf"
    assert params["system.straggler_ratio"] == "0.5"
    history = client.get_metric_history(found.info.run_id, "sim_time")
    assert [m.step for m in history] == list(range(1, 7))
    assert [m.value for m in history] == [float(r["sim_time"]) for r in _metrics_csv(tmp_path / "run")]
    accuracy = client.get_metric_history(found.info.run_id, "test_accuracy")
    assert [m.step for m in accuracy] == [2, 4, 6]
    assert accuracy[-1].value == pytest.approx(result.summary["final_test_accuracy"])
    assert found.data.metrics["summary.final_test_accuracy"] == pytest.approx(
        result.summary["final_test_accuracy"]
    )
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"config.toml", "summary.json", "report.html"} <= artifacts
    local = mlflow.artifacts.download_artifacts(
        run_id=found.info.run_id, artifact_path="summary.json", tracking_uri=client.tracking_uri
    )
    assert json.loads(open(local).read())["rounds"] == 6
    assert (tmp_path / "mlartifacts").is_dir()  # beside the database, not in the working folder


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path):
    config = from_dict(_document(tmp_path, track=["mlflow"]))
    RunLoop(config, tmp_path / "run").run(stop_after=3)
    client, runs = _runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    RunLoop(config, tmp_path / "run").run(resume=True)
    client, runs = _runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "sim_time")]
    assert steps == list(range(1, 7))


def test_the_runs_of_a_compare_are_nested_under_one_parent(tmp_path, capsys):
    document = _document(tmp_path, track=["mlflow"])
    del document["algorithm"]
    document["compare"] = {"algorithms": ["salf", "drop"]}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(document))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    _, runs = _runs(tmp_path)
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == {"tracked", "salf", "drop"}
    parent = by_name["tracked"].info.run_id
    assert by_name["salf"].data.tags["mlflow.parentRunId"] == parent
    assert by_name["drop"].data.tags["mlflow.parentRunId"] == parent


def test_tensorboard_event_files_hold_every_metric_by_round_and_by_simulated_time(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    RunLoop(from_dict(_document(tmp_path, track=["tensorboard"])), tmp_path / "run").run()
    rows = _metrics_csv(tmp_path / "run")
    by_round = EventAccumulator(str(tmp_path / "run" / "tensorboard" / "round")).Reload()
    by_time = EventAccumulator(str(tmp_path / "run" / "tensorboard" / "sim_time")).Reload()
    assert "test_accuracy" in by_round.Tags()["scalars"] and "train_loss" in by_round.Tags()["scalars"]
    losses = by_round.Scalars("train_loss")
    assert [e.step for e in losses] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in losses] == pytest.approx([float(r["train_loss"]) for r in rows], rel=1e-6)
    assert all(abs(e.wall_time - time.time()) < 600 for e in losses)  # round points: the real clock
    timed = by_time.Scalars("train_loss")
    assert [e.step for e in timed] == [round(1000 * float(r["sim_time"])) for r in rows]
    assert [e.wall_time for e in timed] == pytest.approx([float(r["sim_time"]) for r in rows])


def test_a_failing_tracker_is_one_warning_and_the_run_goes_on(tmp_path, caplog):
    document = _document(tmp_path, uri="nosuchscheme://nowhere", track=["mlflow"])
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        result = RunLoop(from_dict(document), tmp_path / "run").run()
    assert result.summary["finished"] and result.summary["rounds"] == 6
    warnings = [r.getMessage() for r in caplog.records if "tracking failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("tracked: mlflow tracking failed")


def test_unknown_trackers_are_refused_in_one_line():
    from fedhet.errors import ConfigError

    with pytest.raises(ConfigError, match="run.track: 'wandb' is not a tracker"):
        from_dict({**BASE, "run": {**BASE["run"], "track": ["wandb"]}})
    with pytest.raises(ConfigError, match="run.track = 'mlflow': expected a list"):
        from_dict({**BASE, "run": {**BASE["run"], "track": "mlflow"}})


def test_a_tracker_is_a_callback_plugin_whose_uri_is_its_own_option(tmp_path):
    """``run.track`` tables carry the tracker's options (checked like any plug-in's); the
    old ``run.mlflow_uri`` key is refused in one line that says where it went."""
    from fedhet.errors import ConfigError

    config = from_dict(_document(tmp_path, uri="sqlite:///elsewhere.db", track=["mlflow", "tensorboard"]))
    (mlflow, options), (tensorboard, _) = config.run.tracker_plugins
    assert (mlflow.name, options.uri, tensorboard.name) == ("mlflow", "sqlite:///elsewhere.db", "tensorboard")
    with pytest.raises(ConfigError, match=r"run.track\[0\].urii: unknown option for run callback mlflow"):
        from_dict({**BASE, "run": {**BASE["run"], "track": [{"name": "mlflow", "urii": "x"}]}})
    with pytest.raises(ConfigError, match=r"run.mlflow_uri: now the MLflow tracker's own option"):
        from_dict({**BASE, "run": {**BASE["run"], "mlflow_uri": "sqlite:///x.db"}})
    with pytest.raises(ConfigError, match="a tracker listed twice"):
        from_dict({**BASE, "run": {**BASE["run"], "track": ["mlflow", {"name": "mlflow"}]}})


def test_the_default_store_is_in_the_run_folder_or_its_groups_never_the_current_directory(
    tmp_path, monkeypatch, capsys
):
    """A tracker that names no store writes mlruns.db (and its artifacts) into the run
    folder; the runs of a [compare] share one store in the compare's folder. The directory
    the command ran in stays empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    document = {**BASE, "run": {**BASE["run"], "track": ["mlflow", "tensorboard"]}}
    path = tmp_path / "one.toml"
    path.write_text(tomli_w.dumps(document))
    assert main(["run", str(path), "--out", str(tmp_path / "one"), "--quiet"]) == 0
    _, runs = _runs(tmp_path / "one")
    assert [r.info.run_name for r in runs] == ["tracked"]
    assert (tmp_path / "one" / "mlartifacts").is_dir()
    del document["algorithm"]
    document["compare"] = {"algorithms": ["salf", "drop"]}
    path.write_text(tomli_w.dumps(document))
    assert main(["run", str(path), "--out", str(tmp_path / "both"), "--quiet"]) == 0
    _, runs = _runs(tmp_path / "both")
    assert sorted(r.info.run_name for r in runs) == ["drop", "salf", "tracked"]
    assert list(cwd.iterdir()) == []
