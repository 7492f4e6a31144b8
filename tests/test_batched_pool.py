"""The batched pool trains a round's clients together (vmap over stacked copies of the
model) and gives the same run as the in-process pool, one client at a time: the same
draws, depths, sub-model masks, gradient corrections and optimizer steps, so the same
global model within float tolerance (a batched kernel adds in another order). Tasks it
cannot batch run one at a time, and those runs are identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.config import from_dict
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


def _same_run(tmp_path, algorithm: dict, atol: float = 1e-5, **kwargs):
    """The batched pool's run against the in-process pool's: metrics and final model."""
    one, one_result = _run(tmp_path, "in-process", algorithm, **kwargs)
    many, many_result = _run(tmp_path, "batched", algorithm, **kwargs)
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
    "salf on cnn2 (convolutions)": ({"name": "salf"}, {"model": {"name": "cnn2"}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_batched_pool_gives_the_one_at_a_time_run(tmp_path, case):
    algorithm, kwargs = CASES[case]
    if "model" in kwargs:  # cnn2 needs 28x28 images: MNIST-format files of random pixels
        from conftest import write_idx_dataset

        folder = write_idx_dataset(tmp_path / "idx", n_train=160, n_test=40)
        kwargs = {**kwargs, "data": {"dataset": "mnist", "data_dir": str(folder), "num_clients": 8}}
    _one, many = _same_run(tmp_path, algorithm, **kwargs)
    assert many.pool.tasks_batched > 0 and many.pool.tasks_alone == 0


def test_salf_clients_of_different_depths_train_in_one_group(tmp_path):
    """The SALF case above is only a test of depths if a round mixes them."""
    _one, many = _run(tmp_path, "batched", {"name": "salf"})
    depths = [row["mean_depth"] for row in many.metrics]
    assert any(d != round(d) for d in depths)  # a fractional mean: several depths in a round


def test_heterofl_clients_of_one_width_train_together_and_widths_apart(tmp_path):
    from fedhet.client.batched import BatchedTrainer
    from fedhet.world import build_world

    world = build_world(_config("batched", {"name": "heterofl"}))
    data = world.client_data(0)
    from fedhet.messages import ClientTask, Coverage

    narrow = ClientTask(0, 0, 0.1, 8, 2, Coverage(1, 0.5))
    whole = ClientTask(0, 0, 0.1, 8, 2, Coverage(1, 1.0))
    assert BatchedTrainer.group_key(narrow, data) != BatchedTrainer.group_key(whole, data)


def test_groups_of_at_most_clients_per_batch_give_the_same_run(tmp_path):
    whole, _ = _run(tmp_path / "a", "batched", {"name": "salf"})
    pieces, _ = _run(tmp_path / "b", "batched", {"name": "salf"}, clients_per_batch=2)
    torch.testing.assert_close(pieces.state.params, whole.state.params, atol=1e-6, rtol=1e-5)


def test_what_cannot_be_batched_runs_one_at_a_time_with_identical_results(tmp_path):
    """AMSFL tracks gradient differences at every step: its tasks run alone, bit for bit as
    in the in-process pool."""
    algorithm = {"name": "amsfl", "round_budget": 20.0}
    per_step = {"model": "per-step", "time_per_sample_step": 0.01, "comm_time": 0.05}
    runs = {}
    for pool in ("in-process", "batched"):
        config = _config(pool, algorithm)
        config.system = from_dict({**config.to_dict(), "system": per_step}).system
        loop = RunLoop(config, tmp_path / pool)
        runs[pool] = (loop, loop.run())
    one, many = runs["in-process"], runs["batched"]
    assert many[0].pool.tasks_alone > 0 and many[0].pool.tasks_batched == 0
    assert [r["train_loss"] for r in one[1].metrics] == [r["train_loss"] for r in many[1].metrics]
    assert torch.equal(one[0].state.params, many[0].state.params)


def test_a_model_with_batchnorm_runs_one_at_a_time():
    """BatchNorm's running statistics are buffers a vmapped step would not update."""
    from torch import nn

    from fedhet.client import LocalTrainer
    from fedhet.client.batched import BatchedTrainer
    from fedhet.models.layers import FlatModel, LayeredModel

    with_norm = FlatModel(LayeredModel([nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), nn.Linear(3, 2)]))
    reason = BatchedTrainer(LocalTrainer(with_norm)).model_reason(torch.zeros(2, 4))
    assert reason is not None and "BatchNorm" in reason
    without = FlatModel(LayeredModel([nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.Linear(3, 2)]))
    assert BatchedTrainer(LocalTrainer(without)).model_reason(torch.zeros(2, 4)) is None


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
