"""What each device sent, received and trained (fedhet.engine.traffic), against hand counts
on digits' MLP 64-32-16-10 (2,778 parameters, no buffers): a task's download is the model's
float32 parameters, a delivered update's upload the layers it reached (after a compressor,
its bytes), and its FLOPs 2 x batch x (forward + weight gradients + input gradients of the
reached layers but the lowest) per step; clients.csv gives them per client and summary.json
their sums."""

from __future__ import annotations

import csv

import pytest
from conftest import FOUR_CLIENTS_PER_STEP, make_config

from fedhet.engine.launch import run

LAYERS = [(64, 32), (32, 16), (16, 10)]  # digits' 8x8 inputs, the MLP's hidden (32, 16), 10 classes
PARAMS = [i * o + o for i, o in LAYERS]  # 2080, 528, 170
BATCH = 16
# clients 0 and 1 straggle (4.1 and 4.2 s of full work) at the 3 s deadline
PER_STEP = FOUR_CLIENTS_PER_STEP


def step_flops(depth: int = 1) -> int:
    """One step's FLOPs reaching layers depth..3, by hand."""
    macs = [i * o for i, o in LAYERS]
    reached = macs[depth - 1 :]
    return 2 * BATCH * (sum(macs) + sum(reached) + sum(reached[1:]))


def _table(folder) -> list[dict]:
    with open(folder / "clients.csv") as handle:
        return [{k: float(v) for k, v in row.items() if k != "device"} for row in csv.DictReader(handle)]


def test_waiting_for_everyone_every_client_moves_the_whole_model_each_round(tmp_path):
    """FedAvg: 3 rounds, every client downloads and uploads 2,778 float32 values a round and
    trains 2 full steps; summary.json gives the sums."""
    result = run(make_config({**PER_STEP, "algorithm.name": "fedavg"}), tmp_path / "fedavg")
    table = _table(tmp_path / "fedavg")
    assert [r["bytes_down"] for r in table] == [3 * 4 * sum(PARAMS)] * 4
    assert [r["bytes_up"] for r in table] == [3 * 4 * sum(PARAMS)] * 4
    assert [r["train_flops"] for r in table] == [3 * 2 * step_flops()] * 4
    assert result.summary["bytes_up"] == 4 * 3 * 4 * sum(PARAMS)
    assert result.summary["train_flops"] == 4 * 3 * 2 * step_flops()


def test_a_straggler_uploads_and_trains_only_the_layers_it_reached(tmp_path):
    """SALF: the stragglers (clients 0 and 1) reach a depth d > 1 by the deadline each round;
    they upload 4 bytes per parameter of layers d..3 and train back to d only, the others
    the whole model."""
    run(make_config({**PER_STEP, "algorithm.name": "salf"}), tmp_path / "salf")
    table = _table(tmp_path / "salf")
    suffixes = {depth: sum(PARAMS[depth - 1 :]) for depth in (1, 2, 3)}
    for row in table[2:]:
        assert row["bytes_up"] == 3 * 4 * suffixes[1]
        assert row["train_flops"] == 3 * 2 * step_flops(1)
    for row in table[:2]:
        depths = [d for d in (2, 3) if row["bytes_up"] == 3 * 4 * suffixes[d]]
        assert depths, row  # a whole number of rounds at one reached depth
        assert row["train_flops"] < 3 * 2 * step_flops(1)
        assert row["bytes_down"] == 3 * 4 * sum(PARAMS)  # every client is sent the whole model


def test_a_compressor_sets_the_upload_bytes(tmp_path):
    """int8 compression: one byte per element and a float32 scale per update."""
    post = {"train.postprocess": [{"name": "compress", "method": "int8"}]}
    run(make_config({**PER_STEP, **post, "algorithm.name": "fedavg"}), tmp_path / "int8")
    assert [r["bytes_up"] for r in _table(tmp_path / "int8")] == [3 * (sum(PARAMS) + 4)] * 4


def test_a_sub_model_is_sent_and_returns_its_own_elements(tmp_path):
    """HeteroFL: a straggler is sent a narrower sub-model, fewer bytes than the whole model,
    both ways."""
    run(make_config({**PER_STEP, "algorithm.name": "heterofl"}), tmp_path / "heterofl")
    table = _table(tmp_path / "heterofl")
    whole = 3 * 4 * sum(PARAMS)
    assert [r["bytes_down"] for r in table[2:]] == [whole, whole]
    for row in table[:2]:
        assert 0 < row["bytes_down"] < whole and 0 < row["bytes_up"] < whole


@pytest.mark.parametrize(("rule", "options"), [("fedbuff", {"algorithm.buffer_size": 2}), ("asyncfl", {})])
def test_an_event_driven_client_uploads_what_arrives(tmp_path, rule, options):
    """Event-driven: an upload is counted when its update arrives, a download when the
    client starts; each whole model, so every total is a whole number of models, and the
    updates the server applied are among those that arrived."""
    longer = {"run.rounds": 6, "run.eval_every": 6}
    config = make_config({**PER_STEP, **options, **longer, "algorithm.name": rule})
    result = run(config, tmp_path / rule)
    table = _table(tmp_path / rule)
    model = 4 * sum(PARAMS)
    ups, downs = sum(r["bytes_up"] for r in table), sum(r["bytes_down"] for r in table)
    assert ups % model == 0 and downs % model == 0
    applied = sum(int(r["participants"]) for r in result.metrics)
    assert applied * model <= ups <= downs


def test_a_straggler_whose_work_is_discarded_still_received_the_model(tmp_path):
    """Drop-stragglers: clients 0 and 1 cannot finish by the deadline; they are sent the
    model and work until the deadline (their energy says so), but upload nothing and their
    discarded steps are not computed, so no FLOPs; the others move the model both ways."""
    run(make_config({**PER_STEP, "algorithm.name": "drop"}), tmp_path / "drop")
    table = _table(tmp_path / "drop")
    whole = 3 * 4 * sum(PARAMS)
    for row in table[:2]:
        assert (row["bytes_down"], row["bytes_up"], row["train_flops"]) == (whole, 0.0, 0.0)
        assert row["train_s"] > 0  # charged for the work thrown away
    for row in table[2:]:
        assert (row["bytes_down"], row["bytes_up"]) == (whole, whole)
