"""The server's client memory (h_i of FedStale): its running weighted sum equals the sum of
its rows, float16 rows are the updates rounded to half precision, checkpoints journal only
the changed rows, and a memory restored from any checkpoint is exactly the memory then, in
RAM or memory-mapped on disk; a killed FedStale run resumes to the same metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_config
from test_stale import PARTIAL, _final_params

from fedhet.algorithms.memory import ClientMemory
from fedhet.config import build_options
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError


def _random_rounds(memory, rounds, rng, per_round=3):
    """Set ``per_round`` random rows per round; yields after each round."""
    for _ in range(rounds):
        for client in rng.choice(memory.num_clients, per_round, replace=False):
            memory.set(
                int(client),
                torch.randn(
                    memory.num_params, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))
                ),
            )
        yield


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_weighted_sum_follows_the_rows(dtype):
    rng = np.random.default_rng(0)
    q = rng.random(10)
    memory = ClientMemory(10, 7, q, dtype)
    for _ in _random_rounds(memory, 20, rng):
        pass
    rows = memory.rows.double()
    assert torch.allclose(memory.weighted_sum, torch.as_tensor(q) @ rows, atol=1e-12)
    assert memory.rows.dtype == getattr(torch, dtype)


def test_float16_rows_are_the_updates_rounded_to_half_precision():
    memory = ClientMemory(2, 5, np.ones(2), "float16")
    update = torch.tensor([1.0, 1e-3, 3.14159, -65000.0, 1 / 3])
    memory.set(1, update)
    assert torch.equal(memory.row(1), update.half().float())
    assert memory.nbytes == 2 * 5 * 2


@pytest.mark.parametrize("storage", ["ram", "disk"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_restore_from_any_checkpoint_gives_that_checkpoints_rows(tmp_path, storage, dtype):
    rng = np.random.default_rng(1)
    memory = ClientMemory(12, 9, rng.random(12), dtype, storage, tmp_path / "live" / "client-memory")
    saved = []
    for _ in _random_rounds(memory, 30, rng):  # 30 x 3 rows > 12 rows: the journal is folded
        reference = memory.persist()
        saved.append((reference, memory.rows.clone(), memory.weighted_sum.clone()))
    assert memory.generation >= 2
    # only the last two generations' files are kept
    names = sorted(p.name for p in (tmp_path / "live" / "client-memory").iterdir())
    assert {n for n in names if n.startswith("base")} <= {
        f"base-{memory.generation - 1}.bin",
        f"base-{memory.generation}.bin",
    }
    # the last checkpoint, and one before the last fold that is still on disk
    for reference, rows, weighted_sum in (
        saved[-1:] + [s for s in saved if s[0]["generation"] == memory.generation - 1][-1:]
    ):
        restored = ClientMemory.restore(reference, tmp_path / "live" / "client-memory")
        assert torch.equal(restored.rows, rows)
        assert torch.equal(restored.weighted_sum, weighted_sum)


def test_a_checkpoint_writes_only_the_changed_rows(tmp_path):
    memory = ClientMemory(1000, 50, np.full(1000, 1e-3), "float32", "ram", tmp_path)
    memory.persist()
    memory.set(3, torch.ones(50))
    memory.set(7, torch.ones(50))
    reference = memory.persist()
    assert reference["journal_bytes"] == 8 + 2 * 8 + 2 * 50 * 4  # count, two ids, two rows
    assert memory.persist()["journal_bytes"] == reference["journal_bytes"]  # nothing changed


def test_a_record_of_an_uncommitted_checkpoint_is_dropped(tmp_path):
    memory = ClientMemory(4, 3, np.full(4, 0.25), "float32", "ram", tmp_path)
    memory.set(0, torch.ones(3))
    committed = memory.persist()
    rows = memory.rows.clone()
    memory.set(1, torch.full((3,), 2.0))
    memory.persist()  # the process dies before this checkpoint is written
    resumed = ClientMemory.restore(committed, tmp_path)
    assert torch.equal(resumed.rows, rows)
    resumed.set(2, torch.full((3,), 5.0))
    again = ClientMemory.restore(resumed.persist(), tmp_path)
    assert torch.equal(again.rows[1], torch.zeros(3)) and torch.equal(again.rows[2], torch.full((3,), 5.0))


def test_memory_options_are_validated():
    with pytest.raises(ConfigError, match="memory_dtype"):
        build_options("fedstale", {"memory_dtype": "float8"})
    with pytest.raises(ConfigError, match="memory_storage"):
        build_options("mifa", {"memory_storage": "cloud"})


@pytest.mark.parametrize("options", [{"memory_storage": "disk", "memory_dtype": "float16"}, {}])
def test_killed_fedstale_run_resumes_identically_with_a_journaled_memory(tmp_path, options):
    overrides = {**PARTIAL, "algorithm.name": "fedvarp", **{f"algorithm.{k}": v for k, v in options.items()}}
    config = make_config(overrides)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert torch.equal(_final_params(tmp_path / "cut"), _final_params(tmp_path / "whole"))
    # the checkpoint holds a reference, not the N x P rows
    saved = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=False)["algorithm"]["memory"]
    assert saved["__persisted__"] == "fedhet.algorithms.memory:ClientMemory"
    sizes = [v.numel() for v in saved["reference"].values() if isinstance(v, torch.Tensor)]
    assert max(sizes) == whole.summary["num_params"]  # the weighted sum: one row
    assert any((tmp_path / "whole" / "client-memory").iterdir())
