"""TimelyFL: the deadline is the k-th fastest client's unit time; every asked client's
planned work (more epochs for fast clients, the top layers for slow ones) finishes by it
under the system model; the server averages each layer over the clients that trained it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import config_from

from fedhet.config import ConfigError
from fedhet.engine.loop import RunLoop
from fedhet.world import build_world

BASE = {
    "run": {"name": "t", "rounds": 4, "threads": 1, "seed": 3},
    "data": {"dataset": "digits", "num_clients": 8, "fraction": 0.5},
    "model": {"name": "mlp", "hidden": [32, 16]},
    "train": {"batch_size": 8, "local_steps": 2},
    "system": {"model": "per-step", "time_per_sample_step": 0.01, "capability_profile": "list",
               "capabilities": [4.0, 2.0, 1.5, 1.0, 1.0, 0.5, 0.25, 0.05], "upload_bandwidth": 2e5},
    "algorithm": {"name": "timelyfl", "aggregation_goal": 4},
}  # fmt: skip


def _config(**sections):
    return config_from(BASE, **sections)


def test_every_planned_work_finishes_by_the_deadline_under_the_system_model():
    world = build_world(_config())
    rule, system = world.algorithm, world.server_system
    state = rule.init_state(world.setting())
    plan = rule.plan(0, state, system, None)
    work = plan.workload()
    from fedhet.engine.drivers import download_bytes, upload_bytes

    work.upload_bytes, work.download_bytes = upload_bytes(world, work.depth), download_bytes(world)
    out = system.sample(work, np.random.default_rng(0))
    asked = np.array([a.asked for a in plan.assignments])
    assert asked.sum() >= 4
    assert np.all(out.full_time[asked] <= plan.deadline * (1 + 1e-9))
    assert np.all(out.steps_done[asked] == work.local_steps[asked])
    assert np.all(out.depth[asked] == work.depth[asked])
    # the deadline is the 4th fastest client's unit time (one epoch of the whole model)
    one_epoch = system.sample(
        type(work)(None, work.batch_sizes, np.full(8, 2), upload_bytes=upload_bytes(world, np.ones(8, int)),
                   download_bytes=download_bytes(world)),
        np.random.default_rng(0),
    ).full_time  # fmt: skip
    assert plan.deadline == pytest.approx(np.sort(one_epoch)[3])


def test_fast_clients_get_more_epochs_and_slow_ones_fewer_layers():
    """Capabilities fall from client 0 to client 7: local steps fall, the first trained
    layer rises, partial clients train one epoch, and the clients left out are the slowest."""
    world = build_world(_config())
    rule = world.algorithm
    plan = rule.plan(0, rule.init_state(world.setting()), world.server_system, None)
    asked = [a for a in plan.assignments if a.asked]
    steps, depth = [a.local_steps for a in asked], [a.depth for a in asked]
    assert [a.asked for a in plan.assignments] == [True] * len(asked) + [False] * (8 - len(asked))
    assert steps == sorted(steps, reverse=True) and steps[0] > 2 and steps[-1] == 2
    assert depth == sorted(depth) and depth[0] == 1 and depth[-1] > 1
    assert all(s == 2 for s, d in zip(steps, depth, strict=True) if d > 1)  # partial: one epoch


def test_a_round_averages_each_layer_over_the_clients_that_trained_it(tmp_path):
    result = RunLoop(_config(), tmp_path / "t").run()
    log = json.loads((tmp_path / "t" / "timelyfl.json").read_text())["rounds"]
    assert len(log) == 4 and all(r["partial"] > 0 and r["full"] >= 4 and r["not_asked"] > 0 for r in log)
    assert result.metrics[-1]["test_accuracy"] > result.metrics[0]["test_accuracy"] - 0.2
    # every client that was asked delivered (the deterministic model: nobody is late)
    assert all(r["participants"] == log[0]["full"] + log[0]["partial"] for r in result.metrics)


def test_timelyfl_resumes_bit_identically_on_a_random_system_model(tmp_path):
    config = _config(
        run={"rounds": 6},
        system={"model": "exponential", "time_per_sample_layer": 0.01, "capability_profile": "uniform",
                "capability_low": 0.2, "capability_high": 2.0},
    )  # fmt: skip
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics


def test_timelyfl_needs_a_system_model_with_time(tmp_path):
    with pytest.raises(ConfigError, match="no time law"):
        RunLoop(_config(system={"model": "straggler-ratio"}), tmp_path / "x").run()
    with pytest.raises(ConfigError, match="algorithm.aggregation_goal = 9"):
        _config(algorithm={"aggregation_goal": 9})


def test_timelyfls_timing_draws_leave_a_selection_untouched(tmp_path):
    """TimelyFL plans from many draws of the clients' times; with a selection and random
    presence those draws must not count as rounds or ask anyone (they once did: TiFL saw
    thousands of rounds in which every client was asked and never answered, called them all
    dropouts, and no one took part again)."""
    config = _config(
        run={"rounds": 5},
        system={**BASE["system"], "participation": "uniform", "participation_low": 0.5},
        selection={"rule": "tifl", "clients_per_round": 4},
        algorithm={"aggregation_goal": 4, "timing_draws": 50},
    )  # fmt: skip
    result = RunLoop(config, tmp_path / "r").run()
    selection = json.loads((tmp_path / "r" / "selection.json").read_text())
    assert selection["rounds"] == 5 and sum(selection["times_asked"]) <= 5 * 4
    assert all(row["participants"] > 0 for row in result.metrics)
    world = build_world(config)
    system = world.server_system
    before = json.dumps(system.state_dict(), sort_keys=True)
    work = world.algorithm.plan(0, world.algorithm.init_state(world.setting()), system, None).workload()
    system.full_times(work, np.random.default_rng(0))
    assert json.dumps(system.state_dict(), sort_keys=True) == before
