"""Outputs, input files and experiment files: what cannot be written is refused before any
work, files a run would misread (overlapping trace intervals, a calibration with
``batch_size = true``, FedScale finish times that are not times) are one line, ``fedhet
trace`` writes only traces a run accepts, a dead grid worker is one line that keeps the
finished cells, experiment cases cannot clash with their grid, and cells whose settings
changed run again."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import pickle
import textwrap

import numpy as np
import pytest
import tomli_w

from fedhet.algorithms.memory import ClientMemory
from fedhet.cli import main
from fedhet.errors import ConfigError, DataError, FedhetError
from fedhet.studies.grid import load_experiment
from fedhet.system.traces import from_fedscale, read_trace

BASE = {
    "run": {"name": "t", "seed": 1, "rounds": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}


def _write(path, document) -> str:
    path.write_text(tomli_w.dumps(document))
    return str(path)


def _one_line(capsys, code: int) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedhet: error:"), captured.err
    return lines[0]


# --- outputs ------------------------------------------------------------------------------


def test_calibrate_refuses_an_output_it_cannot_write_before_timing_anything(tmp_path, capsys):
    config = _write(tmp_path / "c.toml", BASE)
    line = _one_line(capsys, main(["calibrate", config, "--out", str(tmp_path / "missing" / "t.json")]))
    assert "its folder" in line and "does not exist" in line
    line = _one_line(capsys, main(["calibrate", config, "--out", str(tmp_path)]))
    assert "is a folder; --out names the calibration file" in line


def test_plot_out_below_a_file_is_one_line(tmp_path, capsys):
    config = _write(tmp_path / "c.toml", BASE)
    assert main(["run", config, "--out", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = _one_line(capsys, main(["plot", str(tmp_path / "run"), "--out", str(blocker / "fig")]))
    assert "is a file, not a figure folder" in line


def test_disk_client_memory_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(
        FedhetError, match=r"live.bin: cannot allocate the client memory on disk .*No space left"
    ):
        ClientMemory(10, 100, np.full(10, 0.1), "float16", "disk", tmp_path / "memory")


def test_disk_client_memory_reserves_its_blocks_and_starts_at_zero(tmp_path):
    memory = ClientMemory(50, 1000, np.full(50, 0.02), "float16", "disk", tmp_path / "memory")
    live = tmp_path / "memory" / "live.bin"
    assert live.stat().st_blocks * 512 >= memory.nbytes  # allocated, not a sparse file
    assert float(memory.rows.abs().sum()) == 0.0


# --- traces --------------------------------------------------------------------------------


def test_touching_intervals_are_one_online_span(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("# period: 10\n0-5 5-10\n-\n")
    trace = read_trace(path, 2)
    assert trace.share(0) == 1.0 and trace.share(1) == 0.0


@pytest.mark.parametrize("finish", [None, "soon", math.nan, math.inf, 0, -5.0])
def test_fedscale_finish_times_that_are_not_times_are_one_line(tmp_path, finish):
    path = tmp_path / "trace.pkl"
    path.write_bytes(pickle.dumps({0: {"active": [0.0], "inactive": [5.0], "finish_time": finish}}))
    with pytest.raises(DataError, match="client 0: finish_time"):
        from_fedscale(path)


def test_fedhet_trace_writes_only_traces_a_run_accepts(tmp_path, capsys):
    # messy but valid FedScale data: overlapping and touching spans, spans past the finish
    messy = {
        0: {"active": [0.0, 3.0, 8.0], "inactive": [5.0, 6.0, 30.0], "finish_time": 20.0},
        1: {"active": [2.0, 4.0], "inactive": [4.0, 9.0], "finish_time": 10.0},
        2: {"active": [25.0], "inactive": [40.0], "finish_time": 15.0},
    }
    source, out = tmp_path / "fs.pkl", tmp_path / "trace.txt"
    source.write_bytes(pickle.dumps(messy))
    assert main(["trace", str(source), "--out", str(out)]) == 0
    trace = read_trace(out, 3)  # the run's own reader accepts it
    assert trace.period == 20.0
    assert trace.intervals[0] == [(0.0, 6.0), (8.0, 20.0)]
    assert trace.intervals[1] == [(2.0, 9.0)]
    assert trace.intervals[2] == []  # online only after the period


# --- calibration files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"batch_size": True, "forward": [0.001, 0.001], "backward": [0.001, 0.001]}, "batch_size = True"),
        ({"batch_size": 8, "forward": [math.inf, 0.001], "backward": [0.001, 0.001]}, "layer 1 = inf"),
        ({"batch_size": 8, "forward": [0.0, 0.0], "backward": [0.0, 0.0]}, "every time is 0"),
        ({"batch_size": 8, "forward": 0.001, "backward": [0.001, 0.001]}, "forward must list 2 times"),
    ],
)
def test_a_calibration_file_is_checked_value_by_value(tmp_path, document, message):
    from fedhet.config import from_dict
    from fedhet.engine.loop import RunLoop

    times = tmp_path / "times.json"
    times.write_text(json.dumps(document, allow_nan=True))
    config = from_dict({**BASE, "system": {"model": "measured", "measured_times": str(times)}})
    with pytest.raises(ConfigError, match=message):
        RunLoop(config, tmp_path / "out").run()


# --- grids ------------------------------------------------------------------------------------------

DIE = textwrap.dedent(
    """
    import os, signal
    from fedhet.engine.callbacks import Callback

    class Die(Callback):
        name = "die"

        def on_round_end(self, state, row):
            if self.context.config.run.seed == 2:
                os.kill(os.getpid(), signal.SIGKILL)  # as an out-of-memory kill would
    """
)


def test_a_dead_grid_worker_is_one_line_and_the_finished_cells_stay(tmp_path, capsys, monkeypatch):
    (tmp_path / "dying_worker.py").write_text(DIE)
    monkeypatch.syspath_prepend(str(tmp_path))
    experiment = {
        "experiment": {"name": "e", "jobs": 2},
        **BASE,
        "run": {**BASE["run"], "callbacks": [{"name": "dying_worker:Die"}]},
        "grid": {"run.seed": [1, 2]},
        "report": {"rows": ["run.seed"], "columns": []},
    }
    path = _write(tmp_path / "e.toml", experiment)
    code = main(["reproduce", path, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("fedhet: error:")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0]  # after the header line only
    assert "a grid worker process died (killed, or out of memory)" in errors[0]
    assert "run the same command again" in errors[0]


def test_a_case_key_the_grid_also_sets_is_refused(tmp_path):
    experiment = {**BASE, "grid": {"run.seed": [1, 2]}, "cases": [{"train.lr": 0.05}, {"run.seed": 3}]}
    with pytest.raises(ConfigError, match=r"cases\[2\]: run.seed is also a \[grid\] axis"):
        load_experiment(_write(tmp_path / "e.toml", experiment))


def test_errors_in_a_case_name_the_case_and_its_key(tmp_path):
    experiment = {**BASE, "grid": {"run.seed": [1]}, "cases": [{"train.lr": 0.05}, {"train.batch_size": 0}]}
    with pytest.raises(ConfigError, match=r"cell 0-1 \(cases\[2\]\): train.batch_size") as caught:
        load_experiment(_write(tmp_path / "e.toml", experiment))
    assert "--set" not in str(caught.value) and "run.name" not in str(caught.value)


def test_cells_whose_settings_changed_run_again_and_more_rounds_resume(tmp_path, capsys, caplog):
    experiment = {"experiment": {"name": "e", "jobs": 1}, **BASE,
                  "grid": {"algorithm.name": ["salf", "drop"]},
                  "report": {"rows": ["algorithm.name"], "columns": []}}  # fmt: skip
    path, out = tmp_path / "e.toml", tmp_path / "out"
    _write(path, experiment)
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    first = json.loads((out / "salf" / "summary.json").read_text())
    # unchanged: nothing runs again
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "salf" / "summary.json").read_text())["wall_time"] == first["wall_time"]
    # a changed learning rate: both cells run again, from the start
    experiment["train"] = {**experiment["train"], "lr": 0.05}
    _write(path, experiment)
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    assert sum("its settings changed since it ran (train.lr" in r.getMessage() for r in caplog.records) == 2
    again = json.loads((out / "salf" / "summary.json").read_text())
    assert again["wall_time"] != first["wall_time"] and again["rounds"] == 2
    config = (out / "salf" / "config.toml").read_text()
    assert "lr = 0.05" in config
    # more rounds: the cells resume and end with 4 rounds
    experiment["run"] = {**experiment["run"], "rounds": 4}
    _write(path, experiment)
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "salf" / "summary.json").read_text())["rounds"] == 4


def test_compare_keeps_the_experiments_run_order(tmp_path, capsys):
    experiment = {"experiment": {"name": "e", "jobs": 1}, **BASE,
                  "grid": {"algorithm.name": ["salf", "drop", "fedavg"]},
                  "report": {"rows": ["algorithm.name"], "columns": []}}  # fmt: skip
    path, out = _write(tmp_path / "e.toml", experiment), tmp_path / "out"
    assert main(["reproduce", path, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.index("salf") < table.index("drop") < table.index("fedavg")


# --- plan ---------------------------------------------------------------------------------------


def test_plan_prints_the_deadline_the_run_uses(tmp_path, capsys):
    run, system = {**BASE["run"], "rounds": 4, "time_budget": 2.0}, {**BASE["system"], "deadline": 0.0}
    budget = {**BASE, "run": run, "system": system}
    assert main(["plan", _write(tmp_path / "a.toml", budget)]) == 0
    out = capsys.readouterr().out
    assert "deadline 0.5 per round (run.time_budget / run.rounds = 2 / 4)" in out
    assert "fixed deadline 1" not in out
    waits = {**BASE, "algorithm": {"name": "fedavg"}}
    assert main(["plan", _write(tmp_path / "b.toml", waits)]) == 0
    assert "no deadline: fedavg waits for every asked client" in capsys.readouterr().out


def test_the_flower_engine_checks_the_output_folder_before_starting_ray(tmp_path, capsys, monkeypatch):
    pytest.importorskip("flwr")
    import flwr.simulation

    def never(*args, **kwargs):
        raise AssertionError("Flower's simulation (and Ray) started before the folder was checked")

    monkeypatch.setattr(flwr.simulation, "run_simulation", never)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    config = _write(tmp_path / "c.toml", BASE)
    line = _one_line(capsys, main(["run", config, "--engine", "flower", "--out", str(blocker / "run")]))
    assert "cannot create the run folder" in line


def test_calibrate_times_any_configuration_without_its_system_or_algorithm(tmp_path, capsys):
    """A [compare] configuration on the straggler-ratio model (no [algorithm], options of a
    system model calibrate does not use) is timed without a warning, and the file it writes
    is one a measured run accepts."""
    document = {k: v for k, v in BASE.items() if k != "algorithm"}
    document["compare"] = {"algorithms": ["salf", "drop"]}
    out = tmp_path / "times.json"
    assert main(["calibrate", _write(tmp_path / "c.toml", document), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "mlp on digits, batch 8, 1 thread (median of 7)" in captured.out
    from fedhet.config import from_dict
    from fedhet.engine.loop import RunLoop

    measured = {**BASE, "system": {"model": "measured", "measured_times": str(out), "deadline": 1.0}}
    assert RunLoop(from_dict(measured), tmp_path / "run").run().summary["finished"]
