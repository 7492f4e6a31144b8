"""Every command on every engine: `run`, `reproduce` and `tune` launch through
`fedhet.engine.launch`, so a grid cell or a trial with `run.engine = "flower"` runs on
Flower's runtime (it is called, and its pool carries the tasks), an engine plug-in
installed by another package runs all three commands with its own `[run]` options, a
combination an engine cannot honour is refused in one line before anything runs, and the
summary names the engine that ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from fedhet.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "run": {"name": "eng", "seed": 1, "rounds": 2, "threads": 1, "eval_every": 1},
    "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}


def _experiment(tmp_path: Path, engine: str, seeds=(1, 2), **run) -> Path:
    document = {k: dict(v) for k, v in BASE.items()}
    document["run"].update(engine=engine, **run)
    document["experiment"] = {"name": "eng-grid", "jobs": 1}
    document["grid"] = {"run.seed": list(seeds)}
    path = tmp_path / "grid.toml"
    path.write_text(tomli_w.dumps(document))
    return path


@pytest.fixture
def flower_calls(monkeypatch):
    """Counts the calls of Flower's own simulation entry point (the real one runs)."""
    flwr_simulation = pytest.importorskip("flwr.simulation")
    calls = {"n": 0}
    real = flwr_simulation.run_simulation

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(flwr_simulation, "run_simulation", counted)
    return calls


@pytest.mark.slow
@pytest.mark.extended
def test_a_grid_cell_with_the_flower_engine_runs_on_flower(tmp_path, flower_calls):
    from fedhet.studies.grid import load_experiment, run_experiment

    experiment = load_experiment(_experiment(tmp_path, "flower", seeds=(1,)), [])
    summaries = run_experiment(experiment, tmp_path / "out")
    assert flower_calls["n"] == 1 and len(summaries) == 1  # the cell's own Flower simulation
    for summary in summaries.values():
        assert summary["engine"] == "flower" and summary["pool"] == "flower" and summary["finished"]
    written = json.loads((tmp_path / "out" / "1" / "summary.json").read_text())
    assert written["engine"] == "flower" and written["pool"] == "flower"


def test_a_grid_cell_on_the_embedded_engine_says_so(tmp_path):
    from fedhet.studies.grid import load_experiment, run_experiment

    experiment = load_experiment(_experiment(tmp_path, "embedded", seeds=(1,)), [])
    summaries = run_experiment(experiment, tmp_path / "o")
    (summary,) = summaries.values()
    assert summary["engine"] == "embedded" and summary["pool"] in ("in-process", "batched")  # auto's choice


@pytest.mark.slow
@pytest.mark.extended
def test_a_tune_with_the_flower_engine_runs_its_trials_on_flower(tmp_path, flower_calls):
    pytest.importorskip("optuna")
    from fedhet.studies.tune import tune

    config = {k: dict(v) for k, v in BASE.items()}
    config["run"].update(engine="flower", rounds=2)
    config["data"]["validation_fraction"] = 0.2
    (tmp_path / "c.toml").write_text(tomli_w.dumps(config))
    space = {"sampler": {"seed": 1}, "pruner": {"name": "none"},
             "params": {"train.lr": {"low": 0.01, "high": 0.5, "log": True}}}  # fmt: skip
    (tmp_path / "space.toml").write_text(tomli_w.dumps(space))
    (result,) = tune(tmp_path / "c.toml", tmp_path / "space.toml", 1, tmp_path / "tune")
    assert result["finished"] == 1 and flower_calls["n"] == 1
    summary = json.loads((tmp_path / "tune" / "c" / "trial-0" / "summary.json").read_text())
    assert summary["engine"] == "flower" and summary["pool"] == "flower"


def test_engines_that_cannot_share_the_machine_are_refused_before_anything_runs(tmp_path):
    pytest.importorskip("flwr")
    from fedhet.studies.grid import load_experiment, run_experiment
    from fedhet.studies.tune import tune

    experiment = load_experiment(_experiment(tmp_path, "flower"), [])
    with pytest.raises(ConfigError, match="cell 1: run.engine = 'flower' cannot run as a Ray task") as err:
        run_experiment(experiment, tmp_path / "out", ray="local")
    assert "\n" not in str(err.value) and not (tmp_path / "out" / "1").exists()
    pytest.importorskip("optuna")
    config = {k: dict(v) for k, v in BASE.items()}
    config["run"]["engine"] = "flower"
    (tmp_path / "c.toml").write_text(tomli_w.dumps(config))
    (tmp_path / "space.toml").write_text(tomli_w.dumps({"params": {"train.lr": {"low": 0.01, "high": 0.5}}}))
    with pytest.raises(ConfigError, match="runs one run at a time on this machine; run tune with --jobs 1"):
        tune(tmp_path / "c.toml", tmp_path / "space.toml", 2, tmp_path / "t", jobs=2)
    assert not (tmp_path / "t" / "c").exists()  # no study folder, no trial


ENGINE_PLUGIN = '''
from dataclasses import dataclass

from fedhet.engine.launch import EmbeddedEngine


@dataclass
class RecordingOptions:
    record_file: str = ""  # every run this engine runs adds a line here


class RecordingEngine(EmbeddedEngine):
    """The embedded engine, recording each run it runs (name and group)."""

    name = "recording"
    Options = RecordingOptions

    def run(self, config, out_dir, launch):
        result = super().run(config, out_dir, launch)
        with open(self.options.record_file, "a") as fh:
            fh.write(f"{config.run.name} {launch.group}\\n")
        return result
'''


def _install_engine_plugin(site: Path) -> None:
    """A package declaring an engine entry point, as pip would leave it installed."""
    site.mkdir(parents=True)
    (site / "recording_engine.py").write_text(ENGINE_PLUGIN)
    info = site / "recording_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recording-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedhet.engines]\nrecording = recording_engine:RecordingEngine\n")


def _fedhet(args: list[str], site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    return subprocess.run([sys.executable, "-m", "fedhet", *args], env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_an_entry_point_engine_runs_run_reproduce_and_tune(tmp_path):
    pytest.importorskip("optuna")
    site = tmp_path / "site"
    _install_engine_plugin(site)
    record = tmp_path / "record.txt"
    engine = {"engine": "recording", "record_file": str(record)}
    grid = _experiment(tmp_path, "recording", seeds=(1, 2), record_file=str(record))
    done = _fedhet(["reproduce", str(grid), "--out", str(tmp_path / "grid"), "--quiet"], site)
    assert done.returncode == 0, done.stderr
    config = {k: dict(v) for k, v in BASE.items()}
    config["run"].update(engine)
    (tmp_path / "c.toml").write_text(tomli_w.dumps(config))
    done = _fedhet(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "one"), "--quiet"], site)
    assert done.returncode == 0, done.stderr
    config["data"]["validation_fraction"] = 0.2
    (tmp_path / "t.toml").write_text(tomli_w.dumps(config))
    (tmp_path / "space.toml").write_text(tomli_w.dumps({"params": {"train.lr": {"low": 0.01, "high": 0.5}}}))
    args = ["tune", str(tmp_path / "t.toml"), "--space", str(tmp_path / "space.toml"), "--trials", "2",
            "--out", str(tmp_path / "tune")]  # fmt: skip
    done = _fedhet(args, site)
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    assert lines[:2] == ["1 eng-grid", "2 eng-grid"]  # the cells' run names, in the grid's order
    assert lines[2] == "eng None" and lines[3:] == ["t-trial-0 t", "t-trial-1 t"]
    for folder in (tmp_path / "grid" / "1", tmp_path / "one", tmp_path / "tune" / "t" / "trial-1"):
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["engine"] == "recording" and summary["finished"]
    bad = _fedhet(["run", str(tmp_path / "c.toml"), "--set", "run.record_files=1", "--quiet"], site)
    assert bad.returncode == 2 and "run.record_files: unknown key" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


def test_a_comparison_runs_through_the_grid_launcher(tmp_path, monkeypatch):
    """`fedhet run` with a [compare] launches its cells through the grid launcher (the path
    `reproduce` takes): each algorithm's folder, its run order, and the figures beside them;
    without --resume an existing comparison is refused in one line, with --resume its
    finished cells are kept as they are."""
    from fedhet.cli import main
    from fedhet.studies import launcher

    launched = []
    real = launcher.run_experiment

    def counted(experiment, *args, **kwargs):
        launched.append([cell.name for cell in experiment.cells])
        return real(experiment, *args, **kwargs)

    monkeypatch.setattr(launcher, "run_experiment", counted)
    monkeypatch.setattr("fedhet.studies.comparison.run_experiment", counted)
    document = {k: dict(v) for k, v in BASE.items() if k != "algorithm"}
    document["compare"] = {"algorithms": ["salf", "drop"]}
    path = tmp_path / "cmp.toml"
    path.write_text(tomli_w.dumps(document))
    out = tmp_path / "cmp"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    assert launched == [["salf", "drop"]]
    assert (out / "salf" / "summary.json").is_file() and (out / "drop" / "summary.json").is_file()
    assert (out / "comparison-accuracy.png").is_file()
    before = (out / "salf" / "metrics.csv").read_text()
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2  # exists: one line
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume"]) == 0
    assert (out / "salf" / "metrics.csv").read_text() == before


def test_the_flower_pool_is_built_through_the_registry_over_the_engines_link():
    """The Flower engine hands its pool a link (grid, nodes, timeout) and the default pool
    builds the pool declaring that engine; without a link the Flower pool is refused in one
    line (it cannot run on the embedded engine)."""
    from conftest import make_config

    from fedhet.engine.flower import FlowerLink, FlowerPool
    from fedhet.engine.pool import AutoPool, PoolContext
    from fedhet.errors import ConfigError
    from fedhet.registry import NoOptions

    config = make_config({})
    link = FlowerLink(grid=object(), nodes={0: 11, 1: 12}, timeout=5.0)
    pool = AutoPool.build(NoOptions(), PoolContext(config, engine="flower", link=link))
    assert isinstance(pool, FlowerPool) and pool.nodes == link.nodes and pool.timeout == 5.0
    with pytest.raises(ConfigError, match="Flower's pool runs on the flower engine"):
        FlowerPool.build(NoOptions(), PoolContext(config))
