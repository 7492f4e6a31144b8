"""The batched pool trains a round's clients together (vmap over stacked copies of the
model) and gives the same run as the in-process pool, one client at a time: the same
draws, depths, sub-model masks, gradient corrections and optimizer steps, so the same
global model within float tolerance (a batched kernel adds in another order). Tasks it
cannot batch run one at a time, and those runs are identical."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from fedhet.config import from_dict
from fedhet.engine.batched import GROUP_OF_ONE
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError

STRAGGLERS = {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0}


def _config(
    pool: str,
    algorithm: dict,
    model: dict | None = None,
    train: dict | None = None,
    data: dict | None = None,
    **run_keys,
):
    return from_dict(
        {
            "run": {
                "name": "batched",
                "seed": 5,
                "rounds": 3,
                "threads": 1,
                "pool": pool,
                "device": "cpu",
                **run_keys,
            },  # fmt: skip
            "data": data or {"dataset": "digits", "num_clients": 8, "fraction": 0.5},
            "model": model or {"name": "mlp", "hidden": [16]},
            "train": {"lr": 0.1, "batch_size": 8, "local_steps": 3, **(train or {})},
            "algorithm": algorithm,
            "system": STRAGGLERS,
        }
    )


def _run(tmp_path, pool: str, algorithm: dict, **kwargs):
    loop = RunLoop(_config(pool, algorithm, **kwargs), tmp_path / pool)
    result = loop.run()
    assert result.summary["finished"] and result.summary["pool"] == pool
    return loop, result


def _same_run(tmp_path, algorithm: dict, atol: float = 1e-5, stacked: str = "auto", **kwargs):
    """The batched pool's run against the in-process pool's: metrics and final model."""
    one, one_result = _run(tmp_path, "in-process", algorithm, **kwargs)
    many, many_result = _run(tmp_path, "batched", algorithm, stacked=stacked, **kwargs)
    for a, b in zip(one_result.metrics, many_result.metrics, strict=True):
        assert a["participants"] == b["participants"] and a["mean_depth"] == b["mean_depth"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=atol)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.02)
    torch.testing.assert_close(many.state.params, one.state.params, atol=atol, rtol=1e-4)
    return one, many


CASES = {
    "fedavg": ({"name": "fedavg"}, {}),
    "salf, mixed depths": ({"name": "salf"}, {}),
    "heterofl, width masks": ({"name": "heterofl"}, {}),
    "fedprox, proximal term": ({"name": "fedprox", "mu": 0.5}, {}),
    "scaffold, control variates": ({"name": "scaffold"}, {}),
    "fedavg, momentum kept": ({"name": "fedavg"}, {"train": {"momentum": 0.9, "keep_momentum": True}}),
    "salf, momentum kept and weight decay (SALF Table II's optimizer)": (
        {"name": "salf"},
        {"train": {"momentum": 0.5, "keep_momentum": True, "weight_decay": 0.01}},
    ),
    "fedavg, adam": ({"name": "fedavg"}, {"train": {"optimizer": "adam", "lr": 0.01}}),
    "salf on cnn2 (convolutions, computed one after another on the CPU)": (
        {"name": "salf"},
        {"model": {"name": "cnn2"}},
    ),
    "salf on cnn2, stacked (vmap's grouped convolutions)": (
        {"name": "salf"},
        {"model": {"name": "cnn2"}, "stacked": "always"},
    ),
    "salf on cnn2, channels-last weights (row by row: vmap cannot batch them), momentum": (
        {"name": "salf"},
        {
            "model": {"name": "cnn2"},
            "memory_format": "channels_last",
            "train": {"momentum": 0.5},
            "stacked": "always",
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_batched_pool_gives_the_one_at_a_time_run(tmp_path, case):
    algorithm, kwargs = CASES[case]
    if "model" in kwargs:  # cnn2 needs 28x28 images: MNIST-format files of random pixels
        from conftest import write_idx_dataset

        folder = write_idx_dataset(tmp_path / "idx", n_train=160, n_test=40)
        kwargs = {**kwargs, "data": {"dataset": "mnist", "data_dir": str(folder), "num_clients": 8}}
    _one, many = _same_run(tmp_path, algorithm, **kwargs)
    alone_for_their_shape = many.pool.alone_reasons[GROUP_OF_ONE]  # the only tasks alone: groups of one
    assert many.pool.tasks_batched > 0 and many.pool.tasks_alone == alone_for_their_shape
    stacked = many.world.worker.gradients.unsupported is None  # vmap cannot batch channels-last inputs
    forced = kwargs.get("stacked") == "always" and "memory_format" not in kwargs
    assert stacked == (forced or "model" not in kwargs)


def test_salf_clients_of_different_depths_train_in_one_group(tmp_path):
    """The SALF case above is only a test of depths if a round mixes them."""
    _one, many = _run(tmp_path, "batched", {"name": "salf"})
    depths = [row["mean_depth"] for row in many.metrics]
    assert any(d != round(d) for d in depths)  # a fractional mean: several depths in a round


def test_heterofl_clients_of_one_width_train_together_and_widths_apart(tmp_path):
    from fedhet.client import LocalTrainer
    from fedhet.messages import ClientTask, Coverage
    from fedhet.world import build_world

    world = build_world(_config("batched", {"name": "heterofl"}))
    data = world.client_data(0)
    narrow = ClientTask(0, 0, 0.1, 8, 2, Coverage(1, 0.5))
    whole = ClientTask(0, 0, 0.1, 8, 2, Coverage(1, 1.0))
    assert LocalTrainer.group_key(narrow, data) != LocalTrainer.group_key(whole, data)
    assert LocalTrainer.group_key(narrow, data) == LocalTrainer.group_key(
        ClientTask(0, 3, 0.1, 8, 1, Coverage(1, 0.5)), data
    )


def test_groups_of_at_most_clients_per_batch_give_the_same_run(tmp_path):
    whole, _ = _run(tmp_path / "a", "batched", {"name": "salf"})
    pieces, _ = _run(tmp_path / "b", "batched", {"name": "salf"}, clients_per_batch=2)
    torch.testing.assert_close(pieces.state.params, whole.state.params, atol=1e-6, rtol=1e-5)


def test_amsfl_tracks_gradient_differences_in_groups_as_one_at_a_time(tmp_path):
    """AMSFL's per-step gradient at the received model is computed for the whole group: its
    tasks train grouped and the run equals the in-process pool's within float tolerance."""
    algorithm = {"name": "amsfl", "round_budget": 20.0}
    per_step = {"model": "per-step", "time_per_sample_step": 0.01, "comm_time": 0.05}
    runs = {}
    for pool in ("in-process", "batched"):
        config = _config(pool, algorithm)
        config.system = from_dict({**config.to_dict(), "system": per_step}).system
        loop = RunLoop(config, tmp_path / pool)
        runs[pool] = (loop, loop.run())
    one, many = runs["in-process"], runs["batched"]
    alone_for_their_shape = many[0].pool.alone_reasons[GROUP_OF_ONE]  # groups of one
    assert many[0].pool.tasks_alone == alone_for_their_shape and many[0].pool.tasks_batched > 0
    for a, b in zip(one[1].metrics, many[1].metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
    torch.testing.assert_close(many[0].state.params, one[0].state.params, atol=1e-5, rtol=1e-4)


def test_a_model_with_batchnorm_trains_grouped_with_its_running_statistics():
    """BatchNorm's running statistics are rows of the group: each client's buffers change
    as alone, and so do its parameters."""
    from torch import nn

    from fedhet.client import LocalTrainer
    from fedhet.client.group import Member
    from fedhet.client.state import ClientData
    from fedhet.messages import ClientTask, Coverage
    from fedhet.models.layers import FlatModel, LayeredModel

    torch.manual_seed(0)
    model = LayeredModel([nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), nn.Linear(3, 2)])
    trainer = LocalTrainer(FlatModel(model))
    params, buffers = trainer.flat.params.clone(), trainer.flat.buffers.clone()
    x, y = torch.randn(60, 4), torch.randint(0, 2, (60,))
    data = [ClientData(x, y, np.arange(20 * c, 20 * c + 20)) for c in range(3)]
    tasks = [ClientTask(0, c, 0.1, 5, 3, Coverage(1)) for c in range(3)]
    alone = [
        trainer.execute(t, params, buffers, d, {}, np.random.default_rng(t.client))
        for t, d in zip(tasks, data, strict=True)
    ]
    members = [Member(t, d, {}, np.random.default_rng(t.client)) for t, d in zip(tasks, data, strict=True)]
    grouped = trainer.train_group(members, params, buffers)
    assert trainer.gradients.model_reason(x) is None
    for a, b in zip(alone, grouped, strict=True):
        assert b is not None and float(b.delta_buffers.abs().sum()) > 0
        torch.testing.assert_close(b.delta_buffers, a.delta_buffers, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b.delta, a.delta, atol=1e-6, rtol=1e-5)


def test_the_batched_pool_draws_each_clients_batches_from_its_own_stream():
    """ClientData.draw is what batch indexes: the same stream gives the same examples."""
    from fedhet.client.state import ClientData

    x, y = torch.arange(40.0).view(20, 2), torch.arange(20)
    data = ClientData(x, y, np.arange(3, 17))
    first = data.draw(np.random.default_rng(4), 5)
    xb, yb = data.batch(np.random.default_rng(4), 5)
    assert torch.equal(yb, torch.as_tensor(first)) and torch.equal(xb, x[first])


def test_run_device_is_checked_in_one_line():
    with pytest.raises(ConfigError, match=r'run.device = .gpu.: expected "auto", "cpu", "cuda" or "cuda:N"'):
        _config("in-process", {"name": "fedavg"}, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="run.device = 'cuda': torch sees no GPU here"):
            _config("in-process", {"name": "fedavg"}, device="cuda")


def test_a_cpu_run_names_its_device_in_the_summary(tmp_path):
    _loop, result = _run(tmp_path, "in-process", {"name": "fedavg"}, rounds=1)
    assert result.summary["device"] == "cpu"


def test_cuda_with_several_worker_processes_is_refused_in_one_line(monkeypatch):
    """Worker processes would each hold the model and data on the one GPU: refused before
    anything runs (checked as on a machine whose torch sees a GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"run.device = 'cuda' with run.workers = 2: worker processes"):
        _config("in-process", {"name": "fedavg"}, device="cuda", workers=2)
    with pytest.raises(ConfigError, match=r"torch sees 1 GPU\(s\)"):
        _config("in-process", {"name": "fedavg"}, device="cuda:3")


def test_auto_takes_the_cpu_with_worker_processes(monkeypatch):
    from fedhet.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", 1).type == "cuda" and resolve_device("auto", 2).type == "cpu"
    assert resolve_device("auto", "auto").type == "cpu" and resolve_device("cuda", 1) == torch.device(
        "cuda:0"
    )


def test_a_gpu_share_per_flower_client_is_refused_where_torch_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="run.flower_gpus_per_client = 0.5: torch sees no GPU here"):
        _config("in-process", {"name": "fedavg"}, engine="flower", flower_gpus_per_client=0.5)


def test_a_run_resumes_after_switching_between_the_batched_and_in_process_pools(tmp_path):
    """Where clients train is declared resumable (run.pool, run.clients_per_batch): a run
    cut after 2 rounds in the batched pool resumes in the in-process pool and ends as the
    in-process run of 4 rounds, within float tolerance."""
    whole = RunLoop(_config("in-process", {"name": "salf"}, rounds=4), tmp_path / "whole")
    whole_result = whole.run()
    RunLoop(_config("batched", {"name": "salf"}, rounds=2, clients_per_batch=3), tmp_path / "cut").run()
    resumed = RunLoop(_config("in-process", {"name": "salf"}, rounds=4), tmp_path / "cut")
    result = resumed.run(resume=True)
    assert result.summary["finished"] and len(result.metrics) == 4
    for a, b in zip(whole_result.metrics, result.metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
    torch.testing.assert_close(resumed.state.params, whole.state.params, atol=1e-5, rtol=1e-4)


def test_a_group_of_one_is_counted_as_a_task_trained_alone(tmp_path):
    """With one client per batch every group is a group of one: the summary counts each task
    alone, for that reason, and none grouped."""
    config = _config("batched", {"name": "fedavg"}, clients_per_batch=1)
    summary = RunLoop(config, tmp_path / "ones").run().summary
    assert summary["tasks_grouped"] == 0 and summary["tasks_alone"] > 0
    assert summary["tasks_one_at_a_time"] == {GROUP_OF_ONE: summary["tasks_alone"]}


def test_a_row_by_row_group_over_the_row_budget_trains_as_groups_of_one(tmp_path, monkeypatch):
    """cnn2 on the CPU is computed row by row (no arithmetic shared); when its rows pass the
    row budget (here one client's), its clients train one by one in the working model: the
    same numbers bit for bit, no task grouped, and the tasks that shared a shape counted alone
    for the row-by-row reason."""
    from conftest import write_idx_dataset

    import fedhet.client.trainer as trainer

    folder = write_idx_dataset(tmp_path / "idx", n_train=160, n_test=40)
    data = {"dataset": "mnist", "data_dir": str(folder), "num_clients": 8}
    cnn2 = {"model": {"name": "cnn2"}, "data": data}
    whole_loop, whole = _run(tmp_path / "whole", "batched", {"name": "salf"}, **cnn2)
    monkeypatch.setattr(trainer, "ROW_GROUP_ELEMENTS", whole_loop.world.flat.params.numel())
    loop, capped = _run(tmp_path / "capped", "batched", {"name": "salf"}, **cnn2)
    assert [r["train_loss"] for r in capped.metrics] == [r["train_loss"] for r in whole.metrics]
    assert torch.equal(loop.state.params, whole_loop.state.params)
    reason = loop.world.worker.gradients.unsupported
    assert reason is not None and reason.startswith("convolutions on the CPU")
    assert whole.summary["tasks_grouped"] > 0 and capped.summary["tasks_grouped"] == 0
    assert capped.summary["tasks_one_at_a_time"] == {
        reason: whole.summary["tasks_one_at_a_time"][reason],
        GROUP_OF_ONE: whole.summary["tasks_one_at_a_time"][GROUP_OF_ONE],
    }


def test_the_default_pool_reads_the_batched_pools_keys_where_it_picks_it(tmp_path, caplog, monkeypatch):
    """``run.pool = "auto"`` picks the batched pool for SALF's MLP on the CPU with the run's
    ``run.clients_per_batch`` (here 1: every task alone), without a warning that it is unused."""
    import fedhet.config

    monkeypatch.setattr(fedhet.config, "_WARNED", set())  # warned once per process otherwise
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        config = _config("auto", {"name": "salf"}, clients_per_batch=1)
    assert "clients_per_batch" not in caplog.text
    summary = RunLoop(config, tmp_path / "auto").run().summary
    assert summary["pool"] == "batched" and summary["tasks_grouped"] == 0 and summary["tasks_alone"] > 0
    grouped = RunLoop(_config("auto", {"name": "salf"}), tmp_path / "default").run().summary
    assert grouped["pool"] == "batched" and grouped["tasks_grouped"] > 0
