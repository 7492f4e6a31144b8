"""User plug-ins without forking: examples/plugin's algorithm and system model run from the
command line by module path and, once its package is installed, by entry-point name; and
each of them does what it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin"
sys.path.insert(0, str(PLUGIN / "src"))

from fedhet_plugin_example.markov import MarkovOptions, MarkovStragglers  # noqa: E402
from fedhet_plugin_example.rules import (  # noqa: E402
    CoordinateMedian,
    CoordinateMedianOptions,
    FinishedStepsMean,
    FinishedStepsMeanOptions,
)

from fedhet.config import from_dict  # noqa: E402
from fedhet.engine.loop import RunLoop  # noqa: E402
from fedhet.messages import ClientUpdate, Coverage  # noqa: E402
from fedhet.system import Workload  # noqa: E402


def _env(*paths: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*(str(p) for p in paths), str(ROOT / "src")])}


def _fedhet(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedhet", *args], env=env, capture_output=True, text=True)


def test_the_example_runs_from_the_command_line_by_module_path(tmp_path):
    done = _fedhet(
        ["run", str(PLUGIN / "plugin.toml"), "--out", str(tmp_path), "--quiet"], _env(PLUGIN / "src")
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "CoordinateMedian" / "summary.json").read_text())
    assert summary["finished"] and summary["rounds"] == 40
    assert summary["algorithm"] == "fedhet_plugin_example.rules:CoordinateMedian"
    resolved = (tmp_path / "CoordinateMedian" / "config.toml").read_text()
    assert 'model = "fedhet_plugin_example.markov:MarkovStragglers"' in resolved
    assert "stay_slow = 0.7" in resolved  # the plug-in's own options, resolved


def _install_metadata(site: Path) -> None:
    """What ``pip install examples/plugin`` leaves for importlib.metadata: a dist-info
    folder with the package's entry points (read from its pyproject.toml)."""
    import tomllib

    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    info = site / "fedhet_plugin_example-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: 0.1.0\n")
    lines = []
    for group, points in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_installed_plugins_answer_to_their_names_and_are_listed(tmp_path):
    _install_metadata(tmp_path / "site")
    env = _env(tmp_path / "site", PLUGIN / "src")
    listing = _fedhet(["list"], env)
    assert listing.returncode == 0, listing.stderr
    assert (
        "coordinate-median" in listing.stdout and "[entry point of fedhet-plugin-example]" in listing.stdout
    )
    assert "markov-stragglers" in listing.stdout
    sets = ["--set", "compare.algorithms=[]", "--set", 'algorithm.name="coordinate-median"',
            "--set", 'system.model="markov-stragglers"', "--set", "run.rounds=5"]  # fmt: skip
    done = _fedhet(["run", str(PLUGIN / "plugin.toml"), "--out", str(tmp_path / "r"), "--quiet", *sets], env)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["finished"]


def test_an_unknown_plugin_name_is_one_line():
    done = _fedhet(
        ["run", str(PLUGIN / "plugin.toml"), "--set", 'system.model="markov"'], _env(PLUGIN / "src")
    )
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "system.model = 'markov': unknown" in done.stderr


def test_a_dataset_plugin_reads_its_files_by_entry_point(tmp_path):
    rng = np.random.default_rng(0)
    for split, rows in (("train", 120), ("test", 40)):
        x = rng.normal(size=(rows, 3))
        y = (x[:, 0] + x[:, 1] > 0).astype(int)  # a learnable rule
        lines = ["a,b,label,c"] + [f"{r[0]},{r[1]},{t},{r[2]}" for r, t in zip(x, y, strict=True)]
        (tmp_path / f"{split}.csv").write_text("\n".join(lines) + "\n")
    _install_metadata(tmp_path / "site")
    config = tmp_path / "csv.toml"
    config.write_text(
        '[run]\nname = "csv"\nrounds = 30\nthreads = 1\n'
        f'[data]\ndataset = "csv"\nnum_clients = 4\ntrain_file = "{tmp_path / "train.csv"}"\n'
        f'test_file = "{tmp_path / "test.csv"}"\n'
        '[model]\nname = "mlp"\nhidden = [8]\n[train]\nlr = 0.3\n'
        '[system]\nmodel = "full"\n[algorithm]\nname = "fedavg"\n'
    )
    env = _env(tmp_path / "site", PLUGIN / "src")
    done = _fedhet(["run", str(config), "--out", str(tmp_path / "r"), "--quiet"], env)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["dataset"] == "csv" and summary["final_test_accuracy"] > 0.8  # it learns the rule
    (tmp_path / "test.csv").write_text("a,b,c\n1,2,3\n")
    bad = _fedhet(["run", str(config), "--out", str(tmp_path / "bad"), "--quiet"], env)
    assert bad.returncode != 0 and "no column 'label'" in bad.stderr and bad.stderr.count("\n") == 1


def test_median_is_the_coordinate_wise_median_of_the_finishers():
    rule = CoordinateMedian(CoordinateMedianOptions(server_lr=0.5), None)
    deltas = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    updates = [ClientUpdate(u, Coverage(1), 1, 10, 0.1, deltas[u]) for u in range(5)]
    updates.append(ClientUpdate(5, Coverage(3), 1, 10, 0.1, torch.full((3,), 1e9)))  # a straggler: left out
    params = torch.zeros(7)
    new, _ = rule.aggregate(params, torch.zeros(0), updates, {}, None, None)
    assert torch.equal(new, 0.5 * deltas.median(dim=0).values)


def test_the_partial_work_example_uses_every_straggler_s_finished_steps(tmp_path):
    """FinishedStepsMean (``partial_work = "steps"``) averages the updates weighted by the
    steps each client finished; in a per-step run with a deadline, clients that finished
    only some of their steps deliver them and count."""
    rule = FinishedStepsMean(FinishedStepsMeanOptions(), None)
    updates = [ClientUpdate(u, Coverage(1), steps, 10, 0.1, torch.tensor([value]))
               for u, (steps, value) in enumerate([(1, 4.0), (3, 0.0)])]  # fmt: skip
    new, _ = rule.aggregate(torch.zeros(1), torch.zeros(0), updates, {}, None, None)
    assert torch.equal(new, torch.tensor([1.0]))  # (1 x 4 + 3 x 0) / 4
    config = from_dict({
        "run": {"name": "p", "seed": 1, "rounds": 3, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.5},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"lr": 0.1, "batch_size": 8, "local_steps": 4},
        "system": {"model": "per-step", "time_per_sample_step": 0.02, "capability_profile": "uniform",
                   "capability_low": 0.2, "capability_high": 1.8, "deadline": 1.0},
        "algorithm": {"name": "fedhet_plugin_example.rules:FinishedStepsMean"},
    })  # fmt: skip
    result = RunLoop(config, tmp_path / "run").run()
    steps = [row["mean_steps"] for row in result.metrics]
    assert all(0 < s < 4 for s in steps), steps  # partial steps delivered and counted


def test_markov_marginals_match_the_draws_given_the_previous_round():
    options = MarkovOptions(become_slow=0.3, stay_slow=0.6)
    model = MarkovStragglers(4, 3, options, 1.0, np.random.default_rng(0))
    work = Workload(1.0, np.full(4, 8))
    rng = np.random.default_rng(1)
    start = model.state_dict()
    counts, predicted = np.zeros(3), None
    draws = 20_000
    for _ in range(draws):  # the same previous state every time: restore it before each draw
        model.load_state_dict(start)
        model.previous = model.slow.copy()
        outcome = model.sample(work, rng)
        marginals = model.marginals(work)
        predicted = marginals.no_reach_prob
        counts += [(outcome.depth > layer).all() for layer in (1, 2, 3)]
    assert counts / draws == pytest.approx(predicted, abs=0.01)
    assert predicted[0] > 0  # some chance that nobody reaches the first layer, or the test says nothing


def test_a_run_with_both_plugins_resumes_identically(tmp_path):
    import tomllib

    raw = tomllib.loads((PLUGIN / "plugin.toml").read_text())
    raw.pop("compare")
    raw["algorithm"] = {"name": "salf"}
    raw["run"]["rounds"] = 12
    config = from_dict(raw)
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics


class Recorder:
    """A run callback given by module path: records the hooks it sees, in order."""

    name = "recorder"
    seen: list = []

    from dataclasses import dataclass as _dataclass

    @_dataclass
    class Options:
        tag: str = "x"

    @classmethod
    def build(cls, options, ctx=None):
        recorder = cls()
        recorder.tag = options.tag
        return recorder

    def on_start(self, state):
        Recorder.seen.append((self.tag, "start", state.round))

    def on_round_end(self, state, row):
        # evaluation and the files ran first: the row is complete and already on disk
        on_disk = (self.context.folder / "metrics.csv").read_text().splitlines()
        Recorder.seen.append(
            (self.tag, "round", row["round"], row["test_accuracy"] is not None, len(on_disk))
        )

    def on_budget_stop(self, state):
        Recorder.seen.append((self.tag, "budget"))

    def on_end(self, state, summary):
        Recorder.seen.append((self.tag, "end", summary["rounds"]))


def test_a_callback_plugin_sees_every_hook_after_the_built_ins(tmp_path):
    Recorder.seen.clear()
    config = from_dict({
        "run": {"name": "cb", "rounds": 3, "eval_every": 2, "threads": 1,
                "callbacks": [{"name": "test_plugins:Recorder", "tag": "t"}]},
        "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg"},
    })  # fmt: skip
    RunLoop(config, tmp_path / "r").run()
    assert Recorder.seen == [
        ("t", "start", 0),
        ("t", "round", 1, False, 2),
        ("t", "round", 2, True, 3),
        ("t", "round", 3, True, 4),
        ("t", "end", 3),
    ]
    with pytest.raises(Exception, match=r"run.callbacks\[0\].tags: unknown option for run callback"):
        from_dict({"run": {"callbacks": [{"name": "test_plugins:Recorder", "tags": 1}]},
                   "algorithm": {"name": "fedavg"}})  # fmt: skip
