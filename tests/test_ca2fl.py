"""CA2FL (Wang et al., ICLR 2024): each server step is FedBuff's buffer calibrated by every
client's cached latest update, v = h + (1/M) sum_{i in S} (Delta_i - h_i); checked against a
hand computation, against FedAvg where the cache cannot matter, and for a bit-identical
resume with the cache on disk."""

from __future__ import annotations

import json

import pytest
import torch
from test_fedbuff import _config

from fedhet.algorithms.ca2fl import CA2FL, CA2FLOptions
from fedhet.config import ConfigError, TrainConfig
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage


class _Setting:
    num_clients, num_params, work_dir = 3, 2, None


def _update(client: int, delta: list[float]) -> ClientUpdate:
    return ClientUpdate(client, Coverage(), 1, 10, 0.5, torch.tensor(delta))


def test_each_server_step_is_calibrated_by_the_cache_by_hand():
    rule = CA2FL(CA2FLOptions(buffer_size=2, server_lr=0.5), TrainConfig())
    state = rule.init_state(_Setting())
    x = torch.tensor([1.0, 1.0])
    # step 1: the cache is empty (h = 0), so v is the buffer's mean: ((2, 0) + (0, 4)) / 2
    x, _ = rule.apply_buffer(
        x, torch.zeros(0), [(_update(0, [2.0, 0.0]), 0), (_update(1, [0.0, 4.0]), 1)], state, 0
    )
    assert torch.allclose(x, torch.tensor([1.5, 2.0]))
    # step 2: h = ((2, 0) + (0, 4) + 0) / 3; client 0 again with (4, 2) and client 2 fresh with (3, 3):
    # v = h + ((4, 2) - (2, 0) + (3, 3) - 0) / 2 = (2/3, 4/3) + (2.5, 2.5)
    step = [(_update(0, [4.0, 2.0]), 0), (_update(2, [3.0, 3.0]), 0)]
    x, _ = rule.apply_buffer(x, torch.zeros(0), step, state, 1)
    expected = torch.tensor([1.5, 2.0]) + 0.5 * (torch.tensor([2 / 3, 4 / 3]) + torch.tensor([2.5, 2.5]))
    assert torch.allclose(x, expected)
    assert torch.allclose(state["memory"].stale_sum(), torch.tensor([7 / 3, 3.0]))  # ((4,2)+(0,4)+(3,3))/3


def test_with_every_client_in_every_buffer_ca2fl_is_fedavg(tmp_path):
    """Equal durations and M = N: each step's buffer holds every client once, so h's terms
    cancel (v = the buffer's mean) and every update is fresh: FedAvg's round, as FedBuff's."""
    mine = RunLoop(_config(system={"model": "full"}, algorithm={"name": "ca2fl", "buffer_size": 4}),
                   tmp_path / "c").run()  # fmt: skip
    theirs = RunLoop(_config(system={"model": "full"}, algorithm={"name": "fedavg"}), tmp_path / "f").run()
    assert [r["test_accuracy"] for r in mine.metrics] == pytest.approx(
        [r["test_accuracy"] for r in theirs.metrics]
    )
    log = json.loads((tmp_path / "c" / "ca2fl.json").read_text())["server_steps"]
    assert all(sorted(step["clients"]) == [0, 1, 2, 3] for step in log)


@pytest.mark.parametrize("storage", ["ram", "disk"])
def test_a_ca2fl_run_resumes_bit_identically_with_its_cache(tmp_path, storage):
    delays = {"run": {"rounds": 12}, "system": {"model": "exponential", "capability_profile": "uniform",
                                                "time_per_sample_layer": 0.1}}  # fmt: skip
    buffer = {"buffer_size": 2, "max_concurrency": 3}
    config = _config(**delays, algorithm={"name": "ca2fl", **buffer, "memory_storage": storage})
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    fedbuff = RunLoop(_config(**delays, algorithm={"name": "fedbuff", **buffer}), tmp_path / "fedbuff").run()
    assert fedbuff.metrics != whole.metrics  # the calibration changes the steps


def test_bad_ca2fl_options_are_refused():
    with pytest.raises(ConfigError, match="algorithm.memory_dtype = 'float64'"):
        _config(algorithm={"name": "ca2fl", "memory_dtype": "float64"})
    with pytest.raises(ConfigError, match="algorithm.buffer_size = 0"):
        _config(algorithm={"name": "ca2fl", "buffer_size": 0})
