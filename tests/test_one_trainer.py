"""One client computation for every rule: the batched pool trains each group of clients
that share a shape as one computation of the same trainer the in-process pool runs as a
group of one, and the two give the same run within float tolerance, for every built-in
rule, a rule with its own local loss and the docs' example plug-in. Grouped clients are
counted (``tasks_batched``): a test of grouping only if groups formed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import RULE_MODELS, rule_data, rule_setting

from fedhet.algorithms.fedavg import FedAvg
from fedhet.config import from_dict
from fedhet.engine.loop import RunLoop
from fedhet.registry import builtins

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "plugin" / "src"))


class SmoothLoss(FedAvg):
    """A plug-in rule with its own local loss: the task's loss plus a penalty on the
    outputs' size, written for one client, with nothing written for groups."""

    name = "smooth-loss"

    def local_loss(self, task, state, model, x, y, depth, loss, rng):
        outputs = model(x, depth)
        return loss(outputs, y) + 0.01 * outputs.pow(2).mean()


def _config(name: str, pool: str):
    keys, system, options = rule_setting(name)
    return from_dict(
        {
            "run": {"name": "one", "seed": 3, "rounds": 3, "threads": 1, "pool": pool, **keys},
            "data": rule_data(name, {"dataset": "digits", "num_clients": 8, "fraction": 0.5}),
            "model": RULE_MODELS.get(name, {"name": "mlp", "hidden": [16]}),
            "train": {"lr": 0.1, "batch_size": 8, "local_steps": 2},
            "algorithm": {"name": name, **options},
            "system": system,
        }
    )


def _same_run(tmp_path, name: str):
    runs = {}
    for pool in ("in-process", "batched"):
        loop = RunLoop(_config(name, pool), tmp_path / pool)
        runs[pool] = (loop, loop.run())
    (one, one_result), (many, many_result) = runs["in-process"], runs["batched"]
    assert many_result.summary["pool"] == "batched"
    assert many_result.summary["tasks_grouped"] == many.pool.tasks_batched
    for a, b in zip(one_result.metrics, many_result.metrics, strict=True):
        assert a["participants"] == b["participants"]
        if a["train_loss"] == a["train_loss"]:  # not NaN
            assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
    torch.testing.assert_close(many.state.params, one.state.params, atol=1e-5, rtol=1e-4)
    return many


@pytest.mark.parametrize("name", sorted(builtins("algorithm")))
def test_every_rule_trains_grouped_as_one_client_at_a_time(tmp_path, name):
    many = _same_run(tmp_path, name)
    if name != "adel-fl":  # ADEL-FL's first rounds are gradient probes, each alone
        assert many.pool.tasks_batched > 0


@pytest.mark.parametrize(
    "name", ["test_one_trainer:SmoothLoss", "fedhet_plugin_example.rules:CoordinateMedian"]
)
def test_a_plug_in_rule_trains_grouped_without_writing_anything_for_it(tmp_path, name):
    many = _same_run(tmp_path, name)
    assert many.pool.tasks_batched > 0 and many.pool.tasks_alone == 0
    rule = many.world.algorithm
    assert type(rule) not in many.world.worker.gradients.per_client  # its loss stacked


def test_a_loss_that_draws_per_client_is_found_out_and_computed_row_by_row(tmp_path):
    """FjORD draws a width per batch from each client's stream: declared per client, so a
    group computes its loss row by row, with each client's own draws."""
    many = _same_run(tmp_path, "fjord")
    assert many.world.algorithm.local_loss_per_client
    assert not many.world.worker.gradients.stacks(many.world.algorithm, torch.zeros(1, 64))
