"""FedBuff on the event-driven driver: buffered asynchronous aggregation with staleness
weights 1/sqrt(1 + s), clients training continuously on the virtual clock."""

from __future__ import annotations

import json

import pytest

from fedhet.config import ConfigError, from_dict
from fedhet.engine.loop import RunLoop

BASE = {
    "run": {"name": "b", "rounds": 6, "threads": 1, "seed": 5},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"batch_size": 8},
}


def _config(**sections):
    document = {k: dict(v) for k, v in BASE.items()}
    for name, values in sections.items():
        document[name] = {**document.get(name, {}), **values}
    return from_dict(document)


def test_without_delays_a_full_buffer_of_every_client_is_fedavg(tmp_path):
    """Equal durations, K = N, all clients in flight: every server step averages N fresh
    updates (staleness 0, weight 1), exactly FedAvg's round."""
    mine = RunLoop(
        _config(system={"model": "full"}, algorithm={"name": "fedbuff", "buffer_size": 4}), tmp_path / "b"
    ).run()
    theirs = RunLoop(_config(system={"model": "full"}, algorithm={"name": "fedavg"}), tmp_path / "f").run()
    assert [r["test_accuracy"] for r in mine.metrics] == [r["test_accuracy"] for r in theirs.metrics]
    assert [r["test_loss"] for r in mine.metrics] == [r["test_loss"] for r in theirs.metrics]
    log = json.loads((tmp_path / "b" / "fedbuff.json").read_text())["server_steps"]
    assert all(step["staleness"] == [0, 0, 0, 0] for step in log)


def test_staleness_is_counted_on_a_hand_made_schedule(tmp_path):
    """Two clients whose step takes 2/3 s and 2 s (per-step model, capabilities 1 and 1/3,
    normalised to mean 1), K = 1: server steps at t = 2/3, 4/3, 2 from client 0 (fresh),
    then client 1's update started on version 0 arrives after 3 steps (staleness 3), then
    client 0's started on version 3 (staleness 1)."""
    config = _config(
        run={"rounds": 5},
        data={"num_clients": 2},
        system={"model": "per-step", "time_per_sample_step": 0.125, "capability_profile": "list",
                "capabilities": [1.0, 1 / 3]},
        algorithm={"name": "fedbuff", "buffer_size": 1},
    )  # fmt: skip
    result = RunLoop(config, tmp_path / "r").run()
    log = json.loads((tmp_path / "r" / "fedbuff.json").read_text())["server_steps"]
    assert [s["clients"] for s in log] == [[0], [0], [0], [1], [0]]
    assert [s["staleness"] for s in log] == [[0], [0], [0], [3], [1]]
    assert [r["sim_time"] for r in result.metrics] == pytest.approx([2 / 3, 4 / 3, 2, 2, 8 / 3])


def test_a_fedbuff_run_resumes_with_clients_in_flight(tmp_path):
    config = _config(
        run={"rounds": 12},
        system={"model": "exponential", "capability_profile": "uniform", "time_per_sample_layer": 0.1},
        algorithm={"name": "fedbuff", "buffer_size": 2, "max_concurrency": 3},
    )
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics


def test_bad_fedbuff_options_are_refused(tmp_path):
    for options, key in (({"buffer_size": 0}, "buffer_size"), ({"max_concurrency": -1}, "max_concurrency")):
        with pytest.raises(ConfigError, match=f"algorithm.{key}"):
            _config(algorithm={"name": "fedbuff", **options})
    with pytest.raises(ConfigError, match="more than the 4 clients"):
        RunLoop(_config(algorithm={"name": "fedbuff", "buffer_size": 9}), tmp_path / "x").run()
