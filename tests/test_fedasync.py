"""FedAsync on the event-driven driver: each arrival is mixed into the global model with
weight alpha s(staleness), from the model its client was sent (Xie et al., Algorithm 1)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import config_from

from fedhet.algorithms.fedasync import staleness_function
from fedhet.config import ConfigError
from fedhet.engine.loop import RunLoop

BASE = {
    "run": {"name": "a", "rounds": 6, "threads": 1, "seed": 5},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"batch_size": 8},
}
# two clients whose step takes 2/3 s and 2 s: server steps from clients 0, 0, 0, 1 (staleness
# 3: started on version 0, arrives after three steps), 0 (staleness 1); see test_fedbuff
SCHEDULE = {
    "run": {"rounds": 5},
    "data": {"num_clients": 2},
    "system": {"model": "per-step", "time_per_sample_step": 0.125, "capability_profile": "list",
               "capabilities": [1.0, 1 / 3]},
}  # fmt: skip


def _config(*parts, **sections):
    return config_from(BASE, *parts, **sections)


def test_staleness_functions_follow_the_paper():
    assert staleness_function("constant", 7) == 1.0
    assert staleness_function("polynomial", 3, a=0.5) == pytest.approx(0.5)  # (3 + 1)^-0.5
    assert staleness_function("hinge", 4, a=10, b=4) == 1.0
    assert staleness_function("hinge", 6, a=10, b=4) == pytest.approx(1 / 21)


@pytest.mark.parametrize("kind", ["polynomial", "hinge", "constant"])
def test_the_mixing_weight_follows_the_staleness_function(tmp_path, kind):
    config = _config(SCHEDULE, algorithm={"name": "fedasync", "alpha": 0.8, "staleness": kind,
                                          "staleness_a": 2.0, "staleness_b": 1.0})  # fmt: skip
    RunLoop(config, tmp_path / kind).run()
    log = json.loads((tmp_path / kind / "fedasync.json").read_text())["server_steps"]
    assert [s["client"] for s in log] == [0, 0, 0, 1, 0]
    assert [s["staleness"] for s in log] == [0, 0, 0, 3, 1]
    expected = {"constant": lambda d: 1.0, "polynomial": lambda d: (d + 1) ** -2.0,
                "hinge": lambda d: 1.0 if d <= 1 else 1 / (2.0 * (d - 1) + 1)}[kind]  # fmt: skip
    assert [s["weight"] for s in log] == pytest.approx([0.8 * expected(s["staleness"]) for s in log])


def test_a_stale_arrival_is_mixed_from_the_model_its_client_was_sent(tmp_path):
    """The server step equals (1 - a) x_{t-1} + a (x_tau + delta) with x_tau the model of the
    version the client started on, not the current one."""
    from fedhet.algorithms.fedasync import FedAsync, FedAsyncOptions

    rule = FedAsync(FedAsyncOptions(alpha=0.5), train=None)
    x_now, x_sent, delta = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 2.0]), torch.tensor([0.5, -1.0])

    class Update:
        client, delta_buffers = 3, torch.zeros(0)

    Update.delta = delta
    arrival = (Update(), 3, x_sent, torch.zeros(0))
    params, _ = rule.apply_models(x_now, torch.zeros(0), [arrival], {"log": []}, 5)
    weight = 0.5 * (3 + 1) ** -0.5
    assert torch.allclose(params, (1 - weight) * x_now + weight * (x_sent + delta))
    assert torch.equal(x_now, torch.tensor([1.0, 1.0]))  # the current model is not written


def test_with_alpha_one_and_no_staleness_the_global_model_is_the_clients(tmp_path):
    """alpha = 1, constant s, one client at a time: each server step takes the arriving
    client's local model as it is, which is FedAvg over one client per round."""
    one_at_a_time = {"data": {"num_clients": 1}, "system": {"model": "full"}, "run": {"rounds": 4}}
    plain = {"name": "fedasync", "alpha": 1.0, "staleness": "constant", "rho": 0.0}
    mine = RunLoop(_config(one_at_a_time, algorithm=plain), tmp_path / "a").run()
    theirs = RunLoop(_config(one_at_a_time, algorithm={"name": "fedavg"}), tmp_path / "f").run()
    assert [r["test_accuracy"] for r in mine.metrics] == [r["test_accuracy"] for r in theirs.metrics]
    assert [r["test_loss"] for r in mine.metrics] == pytest.approx([r["test_loss"] for r in theirs.metrics])


def test_a_fedasync_run_resumes_bit_identically_with_clients_in_flight(tmp_path):
    config = _config(
        run={"rounds": 12},
        system={"model": "exponential", "capability_profile": "uniform", "time_per_sample_layer": 0.1},
        algorithm={"name": "fedasync", "max_concurrency": 3},
    )
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics


def test_bad_fedasync_options_are_refused():
    cases = (({"alpha": 0.0}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"staleness": "exp"}, "staleness"),
             ({"rho": -1.0}, "rho"), ({"max_concurrency": -2}, "max_concurrency"))  # fmt: skip
    for options, key in cases:
        with pytest.raises(ConfigError, match=f"algorithm.{key}"):
            _config(algorithm={"name": "fedasync", **options})
