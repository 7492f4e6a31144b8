"""The task is a seam: the dataset supplies the loss and the metrics. A regression dataset
(scikit-learn's diabetes data) trains with MSE and reports RMSE below what predicting the
training mean gives, under SALF and FedAvg and every algorithm family; label partitions
are refused for it in one line; `measured` times any model; a LEAF-format folder brings its
own users, which `partition = "natural"` makes the clients, and trains."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.config import from_dict
from fedhet.data.leaf import LEAF_LETTERS, load_leaf
from fedhet.data.tabular import load_diabetes
from fedhet.engine.launch import run
from fedhet.errors import ConfigError, DataError
from fedhet.models.layers import LayeredModel

DIABETES = {
    "run": {"name": "diabetes", "seed": 1, "rounds": 60, "eval_every": 20, "threads": 1},
    "data": {"dataset": "diabetes", "num_clients": 10},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.05, "batch_size": 16, "local_steps": 2},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}


def _mean_predictor_rmse() -> float:
    """RMSE, in the target's units, of predicting the training mean for every test patient."""
    data = load_diabetes()
    scale = data.task.target_scale
    return float(torch.sqrt(((data.y_test - data.y_train.mean()) ** 2).mean())) * scale


def _diabetes(algorithm: str, **sections) -> dict:
    document = {k: dict(v) for k, v in DIABETES.items()}
    document["algorithm"] = {"name": algorithm}
    for section, values in sections.items():
        document.setdefault(section, {}).update(values)
    return document


@pytest.mark.parametrize("algorithm", ["salf", "fedavg"])
def test_a_regression_learns_below_the_mean_predictors_rmse(tmp_path, algorithm):
    result = run(from_dict(_diabetes(algorithm)), tmp_path / "r")
    baseline = _mean_predictor_rmse()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["task"] == "regression" and summary["final_test_accuracy"] is None
    assert summary["final_test_rmse"] < 0.8 * baseline, (summary["final_test_rmse"], baseline)
    header = (tmp_path / "r" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "test_rmse" in header and result.metrics[-1]["test_rmse"] == summary["final_test_rmse"]
    # the loss column is the MSE of the standardised target: RMSE = sqrt(loss) x scale
    scale = load_diabetes().task.target_scale
    assert math.isclose(
        math.sqrt(result.metrics[-1]["test_loss"]) * scale, summary["final_test_rmse"], rel_tol=1e-9
    )


@pytest.mark.parametrize(
    "algorithm, sections",
    [
        ("fedprox", {"algorithm": {"mu": 0.01}}),
        ("scaffold", {}),
        ("feddyn", {}),
        ("fednova", {}),
        ("fedstale", {"algorithm": {"beta": 0.5}, "system": {"participation": "two-group"}}),
        ("fedbuff", {"algorithm": {"buffer_size": 3}}),
        ("heterofl", {}),
        (
            "amsfl",
            {
                "system": {"model": "per-step", "time_per_sample_step": 0.01, "comm_time": 0.05},
                "algorithm": {"round_budget": 20.0},
            },
        ),
    ],
)
def test_every_algorithm_family_trains_the_regression(tmp_path, algorithm, sections):
    document = _diabetes(algorithm, run={"rounds": 6, "eval_every": 3})
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    summary = run(from_dict(document), tmp_path / "r").summary
    assert summary["finished"] and math.isfinite(summary["final_test_rmse"])


def test_label_partitions_are_refused_for_a_regression_in_one_line(tmp_path):
    for data, what in (({"partition": "dirichlet"}, "data.partition = 'dirichlet'"),
                       ({"swap_fraction": 0.5}, "data.swap_fraction")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            run(from_dict(_diabetes("fedavg", data=data)), tmp_path / "r")
        assert str(err.value).startswith(what) and "regression" in str(err.value)
        assert "\n" not in str(err.value)


class TwoLayers:
    """A model plug-in without a `hidden` option (measured timing once read model.hidden)."""

    name = "two-layers"
    from fedhet.registry import NoOptions as Options

    @classmethod
    def build(cls, options, ctx):
        inputs = int(np.prod(ctx.input_shape))
        return LayeredModel([nn.Sequential(nn.Flatten(), nn.Linear(inputs, 12), nn.ReLU()),
                             nn.Sequential(nn.Linear(12, ctx.num_classes))])  # fmt: skip


@pytest.mark.parametrize("model", [{"name": "test_tasks:TwoLayers"}, {"name": "simple-cnn"}])
def test_measured_times_any_model(tmp_path, model):
    document = {
        "run": {"name": "m", "rounds": 2, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
        "model": model,
        "system": {"model": "measured", "deadline": 0.01},
        "algorithm": {"name": "salf"},
    }
    summary = run(from_dict(document), tmp_path / "r").summary
    assert summary["finished"] and summary["system"] == "measured"
    times = json.loads((tmp_path / "r" / "measured_times.json").read_text())
    assert len(times["forward"]) == summary["num_layers"]


# --- LEAF ------------------------------------------------------------------------------------


def _write_leaf(root, users: dict[str, tuple[list, list]], split: str, files: int = 2) -> None:
    """users -> (x, y), spread over ``files`` JSON files of LEAF's format."""
    folder = root / split
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(users)
    for f in range(files):
        mine = names[f::files]
        document = {
            "users": mine,
            "num_samples": [len(users[u][1]) for u in mine],
            "user_data": {u: {"x": users[u][0], "y": users[u][1]} for u in mine},
        }
        (folder / f"all_data_{f}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(document))


def _femnist_like(root, writers: int = 6, per_writer: int = 40, seed: int = 0) -> None:
    """28 x 28 'characters' whose class (0..3) is the quadrant that holds the ink, written
    by ``writers`` users with their own stroke strength."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_writer), ("test", per_writer // 4)):
        users = {}
        for w in range(writers):
            xs, ys = [], []
            for _ in range(count):
                label = int(rng.integers(4))
                image = rng.random((28, 28)) * 0.1
                r, c = divmod(label, 2)
                image[r * 14 : r * 14 + 14, c * 14 : c * 14 + 14] += 0.4 + 0.1 * w
                xs.append(image.ravel().round(4).tolist())
                ys.append(label)
            users[f"f{w:04d}_{w}"] = (xs, ys)
        _write_leaf(root, users, split)


def test_a_leaf_folder_brings_its_users_and_natural_partition_makes_them_the_clients(tmp_path):
    _femnist_like(tmp_path / "femnist")
    data = load_leaf(str(tmp_path / "femnist"))
    assert data.input_shape == (1, 28, 28) and data.num_classes == 4 and len(data.user_names) == 6
    document = {
        "run": {"name": "leaf", "seed": 1, "rounds": 30, "eval_every": 10, "threads": 1},
        "data": {"dataset": "leaf", "data_dir": str(tmp_path / "femnist"), "partition": "natural",
                 "num_clients": 6},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"lr": 0.1, "batch_size": 8},
        "system": {"model": "full"},
        "algorithm": {"name": "fedavg"},
    }  # fmt: skip
    config = from_dict(document)
    from fedhet.world import build_world

    world = build_world(config)
    users = data.train_users.numpy()
    for client, indices in enumerate(world.client_indices):  # client c holds exactly user c's examples
        assert np.array_equal(indices, np.flatnonzero(users == client))
    summary = run(config, tmp_path / "r").summary
    assert summary["final_test_accuracy"] > 0.8  # the quadrant is learnable; chance is 0.25
    document["data"]["num_clients"] = 7
    with pytest.raises(ConfigError, match="data.num_clients = 7: dataset 'leaf' has 6 users"):
        run(from_dict(document), tmp_path / "r7")
    document["data"].update(dataset="digits", num_clients=3)
    del document["data"]["data_dir"]
    with pytest.raises(ConfigError, match="dataset 'digits' brings no users of its own"):
        run(from_dict(document), tmp_path / "rd")


def test_shakespeare_and_sent140_records_are_read(tmp_path):
    text = "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer the slings"
    lines = [text[i : i + 80] for i in range(0, 5)]
    users = {"THE_TRAGEDY_OF_HAMLET_HAMLET": (lines, [text[i + 80] for i in range(0, 5)])}
    _write_leaf(tmp_path / "shakespeare", users, "train", files=1)
    _write_leaf(tmp_path / "shakespeare", users, "test", files=1)
    data = load_leaf(str(tmp_path / "shakespeare"))
    assert data.input_shape == (80,) and data.x_train[0, 0] == LEAF_LETTERS.index("T")
    assert int(data.y_train[0]) == LEAF_LETTERS.index(text[80])
    document = {
        "run": {"name": "sh", "rounds": 2, "threads": 1},
        "data": {"dataset": "leaf", "data_dir": str(tmp_path / "shakespeare"), "partition": "natural",
                 "num_clients": 1},
        "model": {"name": "char-mlp", "hidden": 16},
        "system": {"model": "full"},
        "algorithm": {"name": "fedavg"},
    }  # fmt: skip
    assert run(from_dict(document), tmp_path / "r").summary["finished"]
    records = [["1", "Mon", "NO_QUERY", "alice", "I love this"], ["2", "Mon", "NO_QUERY", "alice", "awful"]]
    tweets = {"alice": (records, [1, 0])}
    _write_leaf(tmp_path / "sent140", tweets, "train", files=1)
    _write_leaf(tmp_path / "sent140", tweets, "test", files=1)
    data = load_leaf(str(tmp_path / "sent140"), hashed_features=64)
    assert data.input_shape == (64,) and torch.allclose(data.x_train.sum(1), torch.ones(2))


def test_a_damaged_leaf_file_is_one_line_naming_it(tmp_path):
    _femnist_like(tmp_path / "f", writers=2, per_writer=4)
    path = sorted((tmp_path / "f" / "train").glob("*.json"))[0]
    path.write_text(path.read_text()[:200])
    with pytest.raises(DataError, match=f"{path}: not JSON") as err:
        load_leaf(str(tmp_path / "f"))
    assert "\n" not in str(err.value)
    document = {"users": ["u"], "num_samples": [3], "user_data": {"u": {"x": [[0.0], [1.0]], "y": [0, 1]}}}
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match="user 'u': 2 x, 2 y and num_samples 3 disagree"):
        load_leaf(str(tmp_path / "f"))
    with pytest.raises(DataError, match="LEAF split folder not found"):
        load_leaf(str(tmp_path / "nowhere"))
