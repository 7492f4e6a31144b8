"""The composed local trainer's new pieces: Adam as a local optimizer, clip-noise and
compression postprocessors, and the clock charge of a compressed update."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.client import Adam, ClientData, LocalTrainer
from fedhet.client.optimizers import AdamOptions
from fedhet.client.postprocess import ClipNoise, ClipNoiseOptions, Compress, CompressOptions, payload_bytes
from fedhet.client.state import OPTIMIZER, Namespace
from fedhet.config import from_dict
from fedhet.engine.drivers import upload_bytes
from fedhet.engine.launch import run
from fedhet.errors import ConfigError, FedhetError
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models import FlatModel, build_model
from fedhet.world import build_world

ROOT = Path(__file__).resolve().parents[1]


def _update(delta: torch.Tensor) -> ClientUpdate:
    return ClientUpdate(client=0, coverage=Coverage(1), steps=1, num_samples=10, loss=0.1, delta=delta)


# -- Adam ---------------------------------------------------------------------------------


def test_adam_steps_like_torch_adam_on_the_covered_parameters():
    torch.manual_seed(0)
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10, [16]))
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    params, buffers = flat.params.clone(), flat.buffers.clone()
    trainer = LocalTrainer(flat, Adam(AdamOptions(keep_state=False)))
    task = ClientTask(0, 0, 0.01, 32, 5, Coverage(1))
    update = trainer.execute(
        task, params, buffers, ClientData(x, y, np.arange(32)), {}, np.random.default_rng(0)
    )
    reference = build_model("mlp", (1, 8, 8), 10, [16])
    FlatModel(reference).load(params, buffers)
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    for _ in range(5):  # the batch is the whole client: the same examples every step
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()]) - params
    assert torch.allclose(update.delta, expected, atol=1e-6)


def test_adam_state_is_kept_in_the_client_state_only_when_asked():
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10, [16]))
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    data = ClientData(x, y, np.arange(16))
    task = ClientTask(0, 0, 0.01, 16, 2, Coverage(2))  # layers 2..L only
    for keep in (True, False):
        store: dict = {}
        LocalTrainer(flat, Adam(AdamOptions(keep_state=keep))).execute(
            task, flat.params.clone(), flat.buffers.clone(), data, store, np.random.default_rng(0)
        )
        state = Namespace(store, OPTIMIZER)  # the optimizer's part of the client's state
        assert set(state) == ({"adam.exp_avg", "adam.exp_avg_sq", "adam.steps"} if keep else set())
        if keep:  # layer 1 was not reached: its moments and step counts stay zero
            first = flat.param_slices.from_depth(1).start, flat.param_slices.start(2)
            assert not state["adam.steps"][first[0] : first[1]].any()
            assert (state["adam.steps"][first[1] :] == 2).all()


ADAM_RUN = """
[run]
name = "adam"
seed = 3
rounds = 40
eval_every = 5
threads = 1
[data]
dataset = "digits"
num_clients = 6
partition = "dirichlet"
[model]
name = "mlp"
hidden = [32, 16]
[train]
optimizer = "adam"
lr = 0.003
batch_size = 8
local_steps = 2
[system]
model = "straggler-ratio"
straggler_ratio = 0.5
[algorithm]
name = "salf"
"""


def test_adam_state_resumes_identically_after_kill_9(tmp_path):
    config_path = tmp_path / "adam.toml"
    config_path.write_text(ADAM_RUN)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    whole = run(from_dict(__import__("tomllib").loads(ADAM_RUN)), tmp_path / "whole")
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "fedhet", "run", str(config_path), "--out", str(out), "--quiet"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "metrics.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) > 10:
            break
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done = len(metrics.read_text().splitlines()) - 1
    assert 0 < done < 40, f"kill landed after {done} rounds"
    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    import csv

    with metrics.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["test_accuracy"]) for r in rows if r["test_accuracy"]] == [
        r["test_accuracy"] for r in whole.metrics if r["test_accuracy"] is not None
    ]
    assert [float(r["train_loss"]) for r in rows] == pytest.approx(
        [r["train_loss"] for r in whole.metrics], rel=0, abs=0
    )


# -- clip-noise ---------------------------------------------------------------------------


def test_clip_bounds_the_norm_and_leaves_small_updates_alone():
    clip = ClipNoise(ClipNoiseOptions(max_norm=0.5, noise_multiplier=0.0))
    generator = torch.Generator().manual_seed(0)
    for scale in (0.01, 1.0, 100.0):
        delta = torch.randn(1000, generator=generator) * scale
        out = clip.process(_update(delta.clone()), {}, generator).delta
        assert float(out.norm()) <= 0.5 * (1 + 1e-6)
        if float(delta.norm()) <= 0.5:
            assert torch.equal(out, delta)
        else:
            assert torch.allclose(out / out.norm(), delta / delta.norm(), atol=1e-6)  # direction kept


def test_noise_has_the_stated_variance_and_mean_zero():
    clip = ClipNoise(ClipNoiseOptions(max_norm=0.5, noise_multiplier=2.0))  # std = 1.0
    out = clip.process(_update(torch.zeros(200_000)), {}, torch.Generator().manual_seed(1)).delta
    assert abs(float(out.mean())) < 0.01
    assert float(out.var()) == pytest.approx(1.0, abs=0.02)


# -- compression ----------------------------------------------------------------------------


def test_int8_is_unbiased_within_one_level_and_counts_one_byte_per_element():
    compress = Compress(CompressOptions(method="int8"))
    delta = torch.randn(500, generator=torch.Generator().manual_seed(2))
    level = float(delta.abs().max()) / 127
    draws = torch.stack(
        [
            compress.process(_update(delta.clone()), {}, torch.Generator().manual_seed(s)).delta
            for s in range(400)
        ]
    )
    assert float((draws - delta).abs().max()) <= level * (1 + 1e-5)
    assert torch.allclose(draws.mean(0), delta, atol=4 * level / math.sqrt(400))
    assert compress.payload_bytes(500, 2000) == 504
    assert payload_bytes([compress], 500) == 504 and payload_bytes([], 500) == 2000


def test_topk_sends_the_largest_and_error_feedback_loses_nothing():
    compress = Compress(CompressOptions(method="topk", fraction=0.1, error_feedback=True))
    assert compress.payload_bytes(1000, 4000) == 8 * 100 + 4
    generator = torch.Generator().manual_seed(3)
    state: dict = {}
    total_in, total_sent = torch.zeros(50), torch.zeros(50)
    for _ in range(6):
        delta = torch.randn(50, generator=generator)
        total_in += delta
        sent = compress.process(_update(delta.clone()), state, generator).delta
        assert int((sent != 0).sum()) == 5
        total_sent += sent
    # what was not sent is exactly what the client still holds
    assert torch.allclose(total_sent + state["compress.residual"], total_in, atol=1e-5)


def _per_step(extra_train: dict, bandwidth: float, algorithm: str = "drop") -> dict:
    return {
        "run": {"name": "c", "seed": 1, "rounds": 3, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.5},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"lr": 0.05, "batch_size": 8, **extra_train},
        "system": {"model": "per-step", "time_per_sample_step": 0.01, "deadline": 1.0,
                   "upload_bandwidth": bandwidth},
        "algorithm": {"name": algorithm},
    }  # fmt: skip


def test_the_clock_charges_the_compressed_payload():
    compressed = {"postprocess": [{"name": "compress", "method": "int8"}]}
    plain_world = build_world(from_dict(_per_step({}, 1e4)))
    small_world = build_world(from_dict(_per_step(compressed, 1e4)))
    n = plain_world.initial_params.numel()
    plan = plain_world.algorithm.plan(0, {}, plain_world.system, 1.0)
    assert (upload_bytes(plain_world, plan.workload().depth) == 4 * n).all()
    assert (upload_bytes(small_world, plan.workload().depth) == n + 4).all()
    work = plan.workload()
    work.upload_bytes = upload_bytes(plain_world, plan.workload().depth)
    slow = plain_world.system.sample(work, np.random.default_rng(0)).full_time
    work.upload_bytes = upload_bytes(small_world, plan.workload().depth)
    fast = small_world.system.sample(work, np.random.default_rng(0)).full_time
    assert np.allclose(slow - fast, (4 * n - (n + 4)) / 1e4)


def test_a_compressed_straggler_finishes_in_time_where_a_full_one_does_not(tmp_path):
    n = build_world(from_dict(_per_step({}, 1.0))).initial_params.numel()
    bandwidth = 4 * n / 1.5  # a float32 upload takes 1.5 s, past the 1 s deadline; int8 0.375 s
    with pytest.raises(FedhetError, match=r"no client can deliver an update by the deadline \(1 s\)"):
        run(from_dict(_per_step({}, bandwidth)), tmp_path / "full")  # refused before training
    small = run(
        from_dict(_per_step({"postprocess": [{"name": "compress", "method": "int8"}]}, bandwidth)),
        tmp_path / "small",
    )
    assert all(row["participants"] == 4 for row in small.metrics)


def test_postprocessor_options_are_checked_with_one_line():
    for bad, words in [
        ([{"name": "clip-noise", "max_norm": 0}], "max_norm = 0"),
        ([{"name": "compress", "method": "zip"}], "compress method = 'zip'"),
        ([{"name": "nope"}], "train.postprocess\\[0\\].name = 'nope': unknown"),
        (["clip-noise"], "expected a table with a name"),
        ([{"name": "compress", "levels": 4}], "train.postprocess\\[0\\].levels: unknown option"),
    ]:
        with pytest.raises(ConfigError, match=words) as caught:
            from_dict(_per_step({"postprocess": bad}, 0.0))
        assert "\n" not in str(caught.value)
