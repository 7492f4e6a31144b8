"""One contract for every client pool (in-process, worker processes, Flower): updates in
task order and client state merged back (the same metrics whichever pool ran them); an
evaluation handle shaped like a concurrent.futures.Future; and the same failure semantics:
a client whose code raises stops the run in one line naming the hook (or, with
run.on_client_error = "skip", is not delivered: a fault, counted, and the run goes on); a
worker killed with SIGKILL mid-round is a fault too, the run goes on and resumes
bit-identically."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from dataclasses import dataclass

import pytest
import torch

from fedhet.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import FedhetError

BASE = {
    "run": {"name": "pools", "seed": 2, "rounds": 4, "threads": 1, "eval_every": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 8, "local_steps": 2, "momentum": 0.9, "keep_momentum": True},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}


@dataclass
class TroubledOptions(FedAvgOptions):
    """``trouble``: what client 1 does in round 2 ("" nothing, "raise", "kill" its own worker
    process, never the process whose id is ``parent``)."""

    trouble: str = ""
    parent: int = 0


class Troubled(FedAvg):
    """FedAvg whose client code misbehaves for client 1 in round 2."""

    name = "troubled"
    Options = TroubledOptions

    def finish_local_work(self, task, update, state, region, local, anchor):
        if task.round == 1 and task.client == 1:
            if self.options.trouble == "raise":
                raise ZeroDivisionError("client 1 divides by zero")
            if self.options.trouble == "kill" and os.getpid() != self.options.parent:
                os.kill(os.getpid(), signal.SIGKILL)
        super().finish_local_work(task, update, state, region, local, anchor)


def _config(pool: str, trouble: str = "", **run_keys):
    document = {k: dict(v) for k, v in BASE.items()}
    document["algorithm"] = {"name": "test_pools:Troubled", "trouble": trouble, "parent": os.getpid()}
    document["run"].update(run_keys)
    if pool == "processes":
        document["run"].update(pool="processes", workers=2)
    elif pool == "flower":
        document["run"]["engine"] = "flower"
    elif pool == "batched":
        document["run"]["pool"] = "batched"
    else:
        document["run"]["pool"] = "in-process"
    return from_dict(document)


# Flower starts Ray: its cases run in the second tier
POOLS = ["in-process", "processes", "batched", pytest.param("flower", marks=pytest.mark.extended)]


def _rows(result) -> list[tuple]:
    return [(r["round"], r["participants"], r["faults"], r["train_loss"], r["test_accuracy"])
            for r in result.metrics]  # fmt: skip


def _close(mine: list[tuple], theirs: list[tuple]) -> None:
    """Equal metrics; Flower's float32 arrays round-trip through NumPy: within 1e-6."""
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert a[:3] == b[:3]
        assert a[3] == pytest.approx(b[3], abs=1e-6) and a[4] == pytest.approx(b[4], abs=1e-6)


def _skip_flower(pool: str) -> None:
    if pool == "flower":
        pytest.importorskip("flwr")


@pytest.mark.parametrize("pool", POOLS)
def test_every_pool_gives_the_same_run(tmp_path, pool):
    """Task order and the merge of client state (momentum kept between rounds): a pool that
    reorders updates or loses a client's state changes the metrics."""
    _skip_flower(pool)
    reference = RunLoop(_config("in-process"), tmp_path / "ref", client_order=lambda tasks: tasks[::-1]).run()
    result = run(_config(pool), tmp_path / pool)
    assert result.summary["pool"] == pool and result.summary["finished"]
    _close(_rows(result), _rows(reference))


def test_the_process_pools_evaluation_handle_is_shaped_like_a_future(tmp_path):
    from fedhet.engine.pool import PoolContext
    from fedhet.engine.processes import ProcessPool
    from fedhet.world import build_world

    config = _config("processes")
    world = build_world(config)
    pool = ProcessPool.build(config.run.options("pool"), PoolContext(config))
    try:
        pool.attach(world)
        handle = pool.submit_evaluation(world.initial_params, world.initial_buffers)
        for name in ("done", "result"):  # the parts of concurrent.futures.Future it has
            assert callable(getattr(handle, name)) and callable(getattr(concurrent.futures.Future, name))
        deadline = time.time() + 120
        while not handle.done() and time.time() < deadline:  # done() never blocks
            time.sleep(0.01)
        assert handle.done()
        metrics = handle.result()
    finally:
        pool.close()
    from fedhet.engine.evaluation import make_evaluator

    assert metrics == make_evaluator(world)(world.initial_params, world.initial_buffers)


@pytest.mark.parametrize("pool", POOLS)
def test_a_client_that_raises_stops_the_run_in_one_line_naming_the_hook(tmp_path, pool):
    _skip_flower(pool)
    with pytest.raises(FedhetError) as err:
        run(_config(pool, "raise"), tmp_path / "r")
    message = str(err.value)
    assert "\n" not in message and message.startswith("round 2, client 1: Troubled.finish_local_work")
    assert "ZeroDivisionError: client 1 divides by zero" in message and "on_client_error" in message
    saved = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)
    assert saved["round"] == 1  # finished work is kept


@pytest.mark.parametrize("pool", POOLS)
def test_with_skip_a_raising_client_is_a_fault_and_the_run_goes_on(tmp_path, pool, caplog):
    _skip_flower(pool)
    reference = run(_config("in-process"), tmp_path / "ref")
    with caplog.at_level("WARNING", logger="fedhet"):
        result = run(_config(pool, "raise", on_client_error="skip"), tmp_path / "r")
    assert result.summary["finished"] and len(result.metrics) == 4
    first, second = result.metrics[0], result.metrics[1]
    assert first["faults"] == 0 and first["participants"] == reference.metrics[0]["participants"]
    assert second["faults"] == 1 and second["participants"] == reference.metrics[1]["participants"] - 1
    assert "round 2: client 1 absent: client error: Troubled.finish_local_work" in caplog.text


def test_a_worker_killed_mid_round_is_a_fault_and_the_run_resumes_bit_identically(tmp_path, caplog):
    """SIGKILL in the middle of client 1's task: that client is not delivered, the tasks
    queued behind it run on the other worker and the new one, and the run ends as one that
    skipped the same client (the fault costs exactly that update)."""
    with caplog.at_level("WARNING", logger="fedhet"):
        killed = run(_config("processes", "kill"), tmp_path / "killed")
    assert killed.summary["finished"] and [r["faults"] for r in killed.metrics] == [0, 1, 0, 0]
    assert "round 2: client 1 absent: worker" in caplog.text and "SIGKILL" in caplog.text
    skipped = run(_config("in-process", "raise", on_client_error="skip"), tmp_path / "skipped")
    assert _rows(killed) == _rows(skipped)
    run(_config("processes", "kill", rounds=2), tmp_path / "resumed")  # stopped after round 2
    resumed = run(_config("processes", "kill"), tmp_path / "resumed", resume=True)
    assert _rows(resumed) == _rows(killed)
    assert (tmp_path / "resumed" / "metrics.csv").read_text() == (
        tmp_path / "killed" / "metrics.csv"
    ).read_text()


@pytest.mark.parametrize("count, parts", [(10_000, 2), (10_000, 3), (300, 2), (256, 4), (1, 2), (5_000, 7)])
def test_evaluation_shards_cover_the_test_set_in_whole_batches(count, parts):
    """The process pool evaluates one shard per worker: contiguous ranges that cover every
    example once, start on batch boundaries (so each batch is the one a single pass sees),
    and are as even as whole batches allow."""
    from fedhet.client.evaluate import EVAL_BATCH, shards

    ranges = shards(count, parts)
    assert ranges[0][0] == 0 and ranges[-1][1] == count and len(ranges) <= parts
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(start % EVAL_BATCH == 0 and stop > start for start, stop in ranges)
    batches = [-(-(stop - start) // EVAL_BATCH) for start, stop in ranges]
    assert max(batches) - min(batches) <= 1
