"""Measured device times: layer times timed on this host, scaled per client; depths,
steps and finish times follow from them, and the marginals match the draws."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fedhet.config import ConfigError, from_dict
from fedhet.engine.loop import RunLoop
from fedhet.system import Workload
from fedhet.system.measured import MeasuredTimes

TIMES = {"batch_size": 16, "threads": 1, "forward": [1.0, 1.0, 1.0], "backward": [1.0, 2.0, 3.0]}


def test_depth_and_steps_follow_the_measured_times():
    """time(d) = forward 3 + backward of layers d..3: 9, 8, 6 and 3 (nothing); a client of
    capability 2 is twice as fast; batch 32 costs twice batch 16."""
    model = MeasuredTimes(3, 3, np.array([1.0, 2.0, 1.0]), TIMES)
    work = Workload(7.0, np.array([16, 16, 32]), np.array([1, 1, 1]))
    out = model.sample(work, np.random.default_rng(0))
    assert out.depth.tolist() == [3, 1, 4]
    assert out.full_time.tolist() == [9.0, 4.5, 18.0]
    assert out.steps_done.tolist() == [0, 1, 0]
    two_steps = model.sample(Workload(20.0, np.full(3, 16), np.full(3, 2)), np.random.default_rng(0))
    assert two_steps.steps_done.tolist() == [2, 2, 2] and two_steps.full_time.tolist() == [18.0, 9.0, 18.0]
    marginals = model.marginals(work)
    np.testing.assert_array_equal(marginals.reach_prob, [[0, 0, 1], [1, 1, 1], [0, 0, 0]])


def test_with_jitter_the_marginals_match_the_draws():
    model = MeasuredTimes(2, 3, np.array([1.0, 0.7]), TIMES, jitter=0.4)
    work = Workload(8.0, np.full(2, 16), np.full(2, 2))
    draws = [model.sample(work, np.random.default_rng(seed)) for seed in range(4000)]
    depth = np.array([d.depth for d in draws])
    steps = np.array([d.steps_done for d in draws])
    marginals = model.marginals(work)
    for layer in (1, 2, 3):
        np.testing.assert_allclose(
            (depth <= layer).mean(axis=0), marginals.reach_prob[:, layer - 1], atol=0.03
        )
    for k in (1, 2):
        np.testing.assert_allclose((steps >= k).mean(axis=0), marginals.step_prob[:, k - 1], atol=0.03)


def test_a_measured_run_writes_and_resumes_with_the_times_it_started_with(tmp_path):
    config = from_dict({
        "run": {"name": "m", "rounds": 6, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [16]},
        "system": {"model": "measured", "deadline": 1e-4, "capability_profile": "uniform",
                   "capability_low": 0.5, "capability_high": 2.0, "step_jitter": 0.3},
        "algorithm": {"name": "salf"},
    })  # fmt: skip
    RunLoop(config, tmp_path / "r").run(stop_after=3)
    written = json.loads((tmp_path / "r" / "measured_times.json").read_text())
    assert len(written["forward"]) == len(written["backward"]) == 2 and written["batch_size"] == 16
    resumed = RunLoop(config, tmp_path / "r").run(resume=True)
    assert json.loads((tmp_path / "r" / "measured_times.json").read_text()) == written
    assert len(resumed.metrics) == 6

    path = tmp_path / "times.json"
    path.write_text(json.dumps(written))
    again = {**config.to_dict()}
    again["system"]["measured_times"] = str(path)
    one = RunLoop(from_dict(again), tmp_path / "a").run()
    two = RunLoop(from_dict(again), tmp_path / "b").run()
    assert one.metrics == two.metrics  # a saved calibration makes runs repeatable
    bad = dict(again)
    bad["system"] = {**again["system"], "measured_times": str(tmp_path / "missing.json")}
    with pytest.raises(ConfigError, match="missing.json'?: file not found"):
        RunLoop(from_dict(bad), tmp_path / "c").run()


def test_calibrate_prints_the_layer_table_and_writes_a_reusable_file(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[run]\nthreads = 1\n[data]\ndataset = "digits"\n[model]\nhidden = [16]\n[algorithm]\nname = "salf"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "fedhet", "calibrate", str(config), "--out", str(tmp_path / "t.json"),
         "--repeats", "3"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "forward ms" in done.stdout and done.stdout.count("%") == 2
    assert len(json.loads((tmp_path / "t.json").read_text())["backward"]) == 2
