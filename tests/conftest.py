"""Shared helpers for fedhet's tests: small real configurations and IDX file writers."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# One torch thread for everything the tests run in this process: the suite's models are
# small, and a second thread waiting on a core that another process holds is many times
# slower (runs built from a config choose their own threads, "auto" by default).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """The longer real runs (marked slow) first, in their order, then the rest: on two
    xdist workers they run beside the short tests instead of ending the suite alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


SALF_DIGITS_TOML = """\
[run]
name = "salf-digits"
seed = 1
rounds = 30
eval_every = 5
[data]
dataset = "digits"
partition = "iid"
num_clients = 10
[model]
name = "mlp"
[train]
lr = 0.1
batch_size = 16
local_steps = 1
[system]
model = "straggler-ratio"
straggler_ratio = 0.9
[algorithm]
name = "salf"
"""


# The tests that run every built-in rule run it on STRAGGLERS with an MLP, except the rules
# below, which need a setting of their own: (run keys, [system] table, algorithm options).
STRAGGLERS = {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0}
EXPONENTIAL = {"model": "exponential"}
PER_STEP = {"model": "per-step", "time_per_sample_step": 0.01, "comm_time": 0.05}
RULE_SETTINGS = {
    "adel-fl": ({"time_budget": 6.0}, EXPONENTIAL, {}),  # plans against the exponential model
    "amsfl": ({}, PER_STEP, {"round_budget": 20.0}),  # allocates steps with per-step costs
    "timelyfl": ({}, PER_STEP, {}),  # plans from clients' times
    "fedbalancer": ({}, {**PER_STEP, "deadline": 1.0}, {"inference": "pipelined"}),  # likewise
    "fedbuff": ({}, STRAGGLERS, {"buffer_size": 4}),
    "ca2fl": ({}, STRAGGLERS, {"buffer_size": 4}),
}
RULE_MODELS = {"depthfl": {"name": "mlp-exits", "hidden": [8]}}  # a model with exits


def rule_setting(name: str) -> tuple[dict, dict, dict]:
    """The run keys, [system] table and algorithm options a test runs rule ``name`` with."""
    return RULE_SETTINGS.get(name, ({}, STRAGGLERS, {}))


def make_config(overrides: dict | None = None):
    """The issue's verbatim digits config, with ``{"section.key": value}`` overrides."""
    import tomllib

    from fedhet.config import from_dict

    raw = tomllib.loads(SALF_DIGITS_TOML)
    for key, value in (overrides or {}).items():
        section, field = key.split(".")
        raw.setdefault(section, {})[field] = value
    return from_dict(raw)


def config_from(base: dict, *parts: dict, **sections):
    """A configuration from the document ``base`` with each section of ``parts`` and
    ``sections`` merged over it, key by key."""
    from fedhet.config import from_dict

    document = {k: dict(v) for k, v in base.items()}
    for part in (*parts, sections):
        for name, values in part.items():
            document[name] = {**document.get(name, {}), **values}
    return from_dict(document)


def write_idx(path: Path, array: np.ndarray, compress: bool = False, magic: int | None = None) -> Path:
    """Write ``array`` (uint8) as a real IDX file (optionally gzipped or with a bad magic)."""
    array = np.asarray(array, dtype=np.uint8)
    code = magic if magic is not None else (0x08 << 8) | array.ndim
    header = struct.pack(">I", code) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_idx_dataset(folder: Path, n_train=60, n_test=20, compress=True, seed=0) -> Path:
    """Four MNIST-format IDX files with random 28x28 images and labels 0..9."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte", rng.integers(0, 256, (n_train, 28, 28)), compress)
    write_idx(folder / "train-labels-idx1-ubyte", rng.integers(0, 10, n_train), compress)
    write_idx(folder / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28)), compress)
    write_idx(folder / "t10k-labels-idx1-ubyte", rng.integers(0, 10, n_test), compress)
    return folder


@pytest.fixture
def idx_folder(tmp_path: Path) -> Path:
    return write_idx_dataset(tmp_path / "idx")
