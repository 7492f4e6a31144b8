"""run.workers: client tasks in worker processes give bit-identical results to one process;
a dead worker stops the run with one line, keeps the checkpoint and leaves no process
behind; the evaluation that runs in a worker while the next round trains is neither lost nor
repeated by a resume; a grid's jobs and workers share the cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_config

import fedhet
from fedhet.engine.loop import RunLoop

CASES = {
    "salf-momentum": {"algorithm.name": "salf", "train.momentum": 0.5, "train.keep_momentum": True},
    "scaffold": {"algorithm.name": "scaffold", "system.model": "uniform-depth"},
    "fedstale-participation": {
        "algorithm.name": "fedstale",
        "algorithm.beta": 0.5,
        "system.model": "full",
        "system.participation": "two-group",
        "system.participation_min": 0.3,
    },
    "fedbuff": {"algorithm.name": "fedbuff", "system.model": "uniform-depth"},
}


def _config(workers, **overrides):
    # one worker: the in-process pool, one client at a time as in a worker process (auto
    # would group an MLP's clients, equal only within float tolerance)
    pool = {"run.pool": "in-process"} if workers == 1 else {}
    return make_config(
        {"run.rounds": 8, "run.eval_every": 1, "run.threads": 1, "run.workers": workers, **pool, **overrides}
    )


def _metrics(path: Path) -> bytes:
    return (path / "metrics.csv").read_bytes()


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_workers_give_the_metrics_of_one_process_byte_for_byte(tmp_path, case):
    one = fedhet.run(_config(1, **CASES[case]), tmp_path / "one")
    two = fedhet.run(_config(2, **CASES[case]), tmp_path / "two")
    assert len(one.metrics) == 8
    assert _metrics(one.path) == _metrics(two.path)
    assert all(row["test_accuracy"] is not None for row in two.metrics)  # evaluated in a worker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting to be reaped counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_killed_between_rounds_is_replaced_and_the_run_loses_nothing(tmp_path, caplog):
    """A worker that dies while idle (killed, out of memory) had no task under way: a new
    worker takes its place and the run ends with the metrics of an undisturbed one."""
    overrides = CASES["salf-momentum"]
    reference = fedhet.run(_config(1, **overrides), tmp_path / "reference")
    loop = RunLoop(_config(2, **overrides), tmp_path / "killed")
    seen = {}

    def kill_at_round_3(row):
        if row["round"] == 3 and not seen:
            seen["pids"] = loop.pool.pids
            os.kill(seen["pids"][1], signal.SIGKILL)
            deadline = time.time() + 10
            while _alive(seen["pids"][1]) and time.time() < deadline:
                time.sleep(0.01)  # dead before the next round's tasks are dealt

    loop.on_round = kill_at_round_3
    with caplog.at_level("WARNING", logger="fedhet"):
        result = loop.run()
    assert result.summary["finished"] and len(result.metrics) == 8
    assert not any(row["faults"] for row in result.metrics) and "absent" not in caplog.text
    assert _metrics(result.path) == _metrics(reference.path)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().split(")")[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")
def test_killing_the_run_leaves_no_worker_behind(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(_config(2, **{"run.rounds": 2000, **CASES["salf-momentum"]}).to_toml())
    run = subprocess.Popen(
        [sys.executable, "-m", "fedhet", "run", str(config), "--out", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    workers: set[int] = set()
    while time.time() < deadline and not (tmp_path / "out" / "checkpoint.pt").exists():
        time.sleep(0.2)
    workers = _descendants(run.pid)
    assert len(workers) >= 2, "the run did not start its workers"
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.time() + 15
    while any(_alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def test_an_evaluation_under_way_when_the_run_stops_is_done_once_on_resume(tmp_path):
    """Stop after round 5 while its evaluation runs in a worker: the checkpoint records it,
    the resume evaluates round 5 from the checkpoint's model, every round has exactly one
    evaluation and the file equals an uninterrupted run's."""
    overrides = {**CASES["salf-momentum"], "run.checkpoint_every": 0}  # a checkpoint after every round
    whole = fedhet.run(_config(1, **overrides), tmp_path / "whole")
    RunLoop(_config(2, **overrides), tmp_path / "cut").run(stop_after=5)
    import torch

    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)
    assert saved["round"] == 5 and saved["evaluating"] is None  # the last round's waited for at a stop
    lines = (tmp_path / "cut" / "metrics.csv").read_text().splitlines()
    assert len(lines) == 1 + 5
    resumed = fedhet.run(_config(2, **overrides), tmp_path / "cut", resume=True)
    assert _metrics(resumed.path) == _metrics(whole.path)


def test_a_checkpoint_taken_while_a_round_is_evaluated_resumes_with_that_evaluation(tmp_path):
    """A checkpoint written between rounds holds the round being evaluated; a run resumed
    from it evaluates that round from the saved model and matches an uninterrupted run."""
    import shutil

    import torch

    overrides = {**CASES["salf-momentum"], "run.checkpoint_every": 0}  # a checkpoint after every round
    whole = fedhet.run(_config(1, **overrides), tmp_path / "whole")
    copies = {}
    loop = RunLoop(_config(2, **overrides), tmp_path / "live")

    def copy_checkpoint(row):
        # round 4's row completes while round 5 trains; the checkpoint then on disk is round 4's,
        # written while round 4 was being evaluated
        if row["round"] == 4 and not copies:
            copies["checkpoint"] = (tmp_path / "live" / "checkpoint.pt").read_bytes()
            copies["metrics"] = (tmp_path / "live" / "metrics.csv").read_bytes()  # as a kill leaves it

    loop.on_round = copy_checkpoint
    loop.run()
    saved = torch.load(tmp_path / "live" / "checkpoint.pt", weights_only=False)
    assert saved["evaluating"] is None
    shutil.copytree(tmp_path / "live", tmp_path / "again")
    (tmp_path / "again" / "summary.json").unlink()
    (tmp_path / "again" / "checkpoint.pt").write_bytes(copies["checkpoint"])
    (tmp_path / "again" / "metrics.csv").write_bytes(copies["metrics"])
    interrupted = torch.load(tmp_path / "again" / "checkpoint.pt", weights_only=False)
    assert interrupted["evaluating"]["round"] == interrupted["round"] == 4
    assert interrupted["metrics"][-1]["test_accuracy"] is None
    resumed = fedhet.run(_config(2, **overrides), tmp_path / "again", resume=True)
    assert _metrics(resumed.path) == _metrics(whole.path)


def test_workers_are_refused_with_another_engine_and_bad_values_in_one_line():
    from fedhet.errors import ConfigError

    for value in (0, -1, "many", 2.5, True):
        with pytest.raises(ConfigError, match="run.workers"):
            _config(value)
    with pytest.raises(ConfigError, match="run.workers = 2: the flower engine"):
        _config(2, **{"run.engine": "flower"})


def test_a_grid_job_gets_at_most_its_share_of_the_cores_as_workers():
    from fedhet.threads import pool_workers, set_core_budget

    try:
        set_core_budget(1)  # two jobs on two cores
        assert pool_workers(4) == 1 and pool_workers("auto") == 1
        set_core_budget(4)
        assert pool_workers(2) == 2 and pool_workers(8) == 4
    finally:
        set_core_budget(None)


def test_rows_held_behind_a_slow_evaluation_resume_from_the_model_it_evaluates(tmp_path, monkeypatch):
    """An evaluation that outlasts the next rounds (forced here: its result is taken only
    when the next one is due) holds its row and the rows after it; a checkpoint written
    meanwhile keeps that round's model, and a resume from it ends with the metrics of an
    uninterrupted run."""
    import shutil

    import torch

    from fedhet.engine.processes import EvaluationHandle

    monkeypatch.setattr(EvaluationHandle, "done", lambda self: False)
    overrides = {**CASES["salf-momentum"], "run.eval_every": 3, "run.checkpoint_every": 0}
    whole = fedhet.run(_config(1, **overrides), tmp_path / "whole")
    copies = {}
    loop = RunLoop(_config(2, **overrides), tmp_path / "live")
    order = []

    def copy_checkpoint(row):
        order.append(row["round"])
        if row["round"] == 3 and not copies:  # emitted once round 6 is due: round 5's checkpoint
            copies["checkpoint"] = (tmp_path / "live" / "checkpoint.pt").read_bytes()
            copies["metrics"] = (tmp_path / "live" / "metrics.csv").read_bytes()  # as a kill leaves it

    loop.on_round = copy_checkpoint
    loop.run()
    assert order == list(range(1, 9))
    assert _metrics(tmp_path / "live") == _metrics(whole.path)
    shutil.copytree(tmp_path / "live", tmp_path / "again")
    (tmp_path / "again" / "summary.json").unlink()
    (tmp_path / "again" / "checkpoint.pt").write_bytes(copies["checkpoint"])
    (tmp_path / "again" / "metrics.csv").write_bytes(copies["metrics"])
    held = torch.load(tmp_path / "again" / "checkpoint.pt", weights_only=False)
    assert held["round"] == 5 and held["evaluating"]["round"] == 3
    assert not torch.equal(held["evaluating"]["params"], held["params"])
    resumed = fedhet.run(_config(2, **overrides), tmp_path / "again", resume=True)
    assert _metrics(resumed.path) == _metrics(whole.path)


def test_workers_is_the_process_pools_option_and_the_old_spelling_is_read_with_a_note(caplog):
    """``run.workers`` belongs to the ``processes`` pool; given without ``run.pool`` (the old
    spelling) it still selects that pool, with one note; one worker means the default pool."""
    import logging

    from fedhet.engine.processes import ProcessOptions

    explicit = make_config({"run.pool": "processes", "run.workers": 3})
    assert isinstance(explicit.run.options("pool"), ProcessOptions) and explicit.run.workers == 3
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        old = _config(5)
    assert old.run.pool == "processes" and old.run.workers == 5
    assert any('read as run.pool = "processes"' in r.getMessage() for r in caplog.records)
    default = make_config({"run.workers": 1})
    assert default.run.pool == "auto" and default.run.workers == 1
    assert make_config({"run.pool": "in-process"}).run.workers == 1  # no worker processes
