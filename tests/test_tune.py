"""`fedhet tune` on Optuna with a real SQLite study database: trials are run folders, the
median pruner stops runs early and says so, a killed tune resumes the same study (every
trial counted once, the interrupted one run again), parallel jobs share the storage, the
best trial becomes a runnable best.toml, and the report shows the study."""

from __future__ import annotations

import html
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

optuna = pytest.importorskip("optuna", reason="fedhet tune needs the extra: pip install 'fedhet[tune]'")

from fedhet.cli import main  # noqa: E402
from fedhet.config import from_dict  # noqa: E402
from fedhet.engine.loop import RunLoop  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402
from fedhet.studies.tune import load_space  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "run": {"name": "tn", "seed": 1, "rounds": 8, "eval_every": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.5, "validation_fraction": 0.2},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}
SPACE = {
    "objective": {"value": "final_test_accuracy", "direction": "maximize"},
    "sampler": {"seed": 1},
    "pruner": {"startup_trials": 2},
    "params": {
        "train.lr": {"low": 0.001, "high": 1.0, "log": True},
        "train.batch_size": {"choices": [4, 8, 16]},
    },
}


def _files(tmp_path, config=CONFIG, space=SPACE) -> tuple[str, str]:
    (tmp_path / "c.toml").write_text(tomli_w.dumps(config))
    (tmp_path / "space.toml").write_text(tomli_w.dumps(space))
    return str(tmp_path / "c.toml"), str(tmp_path / "space.toml")


def _study(out: Path, name: str = "c"):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")


def _states(study) -> dict[str, list]:
    out: dict[str, list] = {}
    for trial in study.get_trials(deepcopy=False):
        out.setdefault(trial.state.name, []).append(trial)
    return out


def test_a_tune_prunes_writes_run_folders_and_a_runnable_best_toml(tmp_path, capsys):
    config, space = _files(tmp_path)
    out = tmp_path / "out"
    assert main(["tune", config, "--space", space, "--trials", "6", "--out", str(out)]) == 0
    states = _states(_study(out))
    counted = states.get("COMPLETE", []) + states.get("PRUNED", [])
    assert len(counted) == 6 and not states.get("FAIL")
    assert states.get("PRUNED"), "the median pruner stopped no run"
    for trial in states["PRUNED"]:
        assert (out / "c" / f"trial-{trial.number}" / "pruned.json").exists()  # it says so
    for trial in states["COMPLETE"]:
        folder = out / "c" / f"trial-{trial.number}"
        summary = tomllib.loads((folder / "config.toml").read_text())
        assert summary["train"]["lr"] == pytest.approx(trial.params["train.lr"])
        assert (folder / "summary.json").exists()
    best = tomllib.loads((out / "c" / "best.toml").read_text())
    assert best["train"]["lr"] == pytest.approx(_study(out).best_trial.params["train.lr"])
    assert "validation_fraction" not in best["data"]  # the tuned setting runs on the test set
    result = RunLoop(from_dict(best), tmp_path / "best-run").run()
    assert result.summary["evaluated_on"] == "test" and result.summary["finished"]
    printed = capsys.readouterr().out
    finished, pruned = len(states["COMPLETE"]), len(states["PRUNED"])
    assert printed.startswith(f"c: {finished} trials finished, {pruned} pruned, 0 failed; best trial")


def test_trials_are_judged_on_the_validation_split():
    from fedhet.world import build_world

    world = build_world(from_dict(CONFIG))
    plain = build_world(from_dict({**CONFIG, "data": {**CONFIG["data"], "validation_fraction": 0.0}}))
    held = plain.dataset.num_train - world.dataset.num_train
    assert held == round(0.2 * plain.dataset.num_train)
    assert world.dataset.x_test.shape[0] == held  # evaluation on the held-out training examples


def test_a_killed_tune_resumes_its_study_and_counts_every_trial_once(tmp_path):
    config, space = _files(tmp_path, config={**CONFIG, "run": {**CONFIG["run"], "rounds": 30}})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [
        sys.executable,
        "-m",
        "fedhet",
        "tune",
        config,
        "--space",
        space,
        "--trials",
        "6",
        "--out",
        str(out),
    ]
    log = tmp_path / "tune.log"
    with log.open("w") as stream:
        process = subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT)
    deadline, counted = time.monotonic() + 300, 0
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
        if (out / "study.db").exists():
            try:
                states = _states(_study(out))
            except KeyError:  # the study is not created yet
                continue
            counted = len(states.get("COMPLETE", []) + states.get("PRUNED", []))
            if counted >= 2:
                break
    assert process.poll() is None, f"the tune ended before it was killed: {log.read_text()[-2000:]}"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert counted >= 2, f"two trials did not finish in 300 s: {log.read_text()[-2000:]}"
    running = _states(_study(out)).get("RUNNING", [])
    interrupted = [t.params for t in running if t.params]  # a trial killed before drawing has none
    assert main(["tune", config, "--space", space, "--trials", "6", "--out", str(out)]) == 0
    states = _states(_study(out))
    counted = states.get("COMPLETE", []) + states.get("PRUNED", [])
    assert len(counted) == 6
    assert len({t.number for t in counted}) == 6
    assert len(states.get("FAIL", [])) == len(running) and not states.get("RUNNING")
    for params in interrupted:  # the interrupted point ran again, once (a kill between two
        # draws leaves some of its values: those run again, the rest are drawn afresh)
        assert sum(all(t.params.get(k) == v for k, v in params.items()) for t in counted) == 1


def _open_fresh_storage(path: str, barrier) -> str:
    from fedhet.studies.tune import _storage_url

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    barrier.wait()
    try:
        url = _storage_url(Path(path).parent, None)
        optuna.create_study(study_name="s", storage=url, load_if_exists=True)
        return "ok"
    except Exception as error:  # what a racing process would die of
        return f"{type(error).__name__}: {error}"


@pytest.mark.slow
def test_processes_opening_a_new_study_database_at_once_all_succeed(tmp_path):
    """Optuna's schema set-up of a new SQLite file races (two schema-version stamps, one
    process fails); the tune folder's database is created whole before it is opened."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    processes = 6
    with context.Manager() as manager, context.Pool(processes) as pool:
        for attempt in range(4):
            folder = tmp_path / f"t{attempt}"
            folder.mkdir()
            barrier = manager.Barrier(processes)
            outcomes = pool.starmap(_open_fresh_storage, [(str(folder / "study.db"), barrier)] * processes)
            assert outcomes == ["ok"] * processes
            assert [p.name for p in folder.iterdir()] == ["study.db"]  # no private file left behind


def test_parallel_jobs_share_the_study_and_run_exactly_the_trials_asked(tmp_path):
    config, space = _files(tmp_path)
    out = tmp_path / "out"
    assert main(["tune", config, "--space", space, "--trials", "4", "--jobs", "2", "--out", str(out)]) == 0
    states = _states(_study(out))
    counted = states.get("COMPLETE", []) + states.get("PRUNED", [])
    assert len(counted) == 4
    assert len({tuple(sorted(t.params.items())) for t in counted}) == 4  # the two workers' points differ


@pytest.mark.extended
def test_trial_workers_run_as_tasks_of_a_local_ray_through_the_one_executor(tmp_path):
    """``--ray``: the trial workers are Ray tasks sharing the SQLite study; exactly the
    trials asked are counted, each a run folder, and the best trial is written."""
    pytest.importorskip("ray", reason="--ray needs the flower extra (it brings ray)")
    config, space = _files(tmp_path)
    out = tmp_path / "out"
    args = ["tune", config, "--space", space, "--trials", "3", "--jobs", "2", "--ray", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    states = _states(_study(out))
    counted = states.get("COMPLETE", []) + states.get("PRUNED", [])
    assert len(counted) == 3
    assert all((out / "c" / f"trial-{t.number}" / "config.toml").exists() for t in counted)
    assert (out / "c" / "best.toml").exists()


def test_a_compare_gives_one_study_per_algorithm_with_its_own_keys(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "algorithm"}
    config["compare"] = {"algorithms": ["salf", "fedprox"]}
    space = {
        **SPACE,
        "algorithm_params": {"fedprox": {"algorithm.mu": {"low": 0.001, "high": 1.0, "log": True}}},
    }
    paths = _files(tmp_path, config, space)
    out = tmp_path / "out"
    assert main(["tune", paths[0], "--space", paths[1], "--trials", "3", "--out", str(out)]) == 0
    assert "algorithm.mu" in _study(out, "c-fedprox").best_trial.params
    assert "algorithm.mu" not in _study(out, "c-salf").best_trial.params
    assert (out / "c-fedprox" / "best.toml").exists() and (out / "c-salf" / "best.toml").exists()


def test_the_report_of_a_tune_folder_shows_trials_history_and_importances(tmp_path):
    config, space = _files(tmp_path)
    out = tmp_path / "out"
    assert main(["tune", config, "--space", space, "--trials", "5", "--out", str(out)]) == 0
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "optimisation history" in page and "parameter importances" in page
    assert page.count("data:image/png") == 2 and "<td>PRUNED</td>" in page or "<td>COMPLETE</td>" in page


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"params": {"lr": {"low": 0.1, "high": 1.0}}}, "a searched key looks like section.key"),
        ({"params": {"train.lr": {"low": 1.0, "high": 0.1}}}, "needs numbers low < high"),
        ({"params": {"train.lr": {"low": 0.0, "high": 1.0, "log": True}}}, "a log scale needs low > 0"),
        ({"params": {"train.lr": {"choices": []}}}, "choices must be a non-empty list"),
        ({"params": {"train.lr": {"low": 0.1, "high": 1.0, "step": 2}}}, "unknown option 'step'"),
        ({"objective": {"value": "accuracy"}}, "objective.value = 'accuracy'"),
        ({"objective": {"value": "time_to:2"}}, "an accuracy in \\(0, 1\\]"),
        ({"sampler": {"name": "cmaes"}}, "sampler.name = 'cmaes'"),
        ({"params": {}}, "nothing to search"),
        ({"studies": {}}, "unknown section"),
    ],
)
def test_a_bad_search_space_is_one_line_naming_the_key(tmp_path, change, message):
    space = {**SPACE, **change}
    (tmp_path / "space.toml").write_text(tomli_w.dumps(space))
    with pytest.raises(ConfigError, match=message):
        load_space(tmp_path / "space.toml")


def test_a_diverged_trial_scores_the_worst_value_not_its_last_evaluation(tmp_path):
    space = {**SPACE, "params": {"train.lr": {"choices": [1e10]}}}
    config, space_path = _files(tmp_path, space=space)
    out = tmp_path / "out"
    assert main(["tune", config, "--space", space_path, "--trials", "1", "--out", str(out)]) == 0
    trial = _study(out).best_trial
    assert trial.value == 0.0 and trial.user_attrs.get("diverged") is True


# -- tuning that cannot run away ------------------------------------------------------------


def _broken_algorithm():
    """An algorithm plug-in whose aggregate raises: every trial of a study fails."""
    from fedhet.algorithms.fedavg import FedAvg

    class AlwaysRaises(FedAvg):
        def aggregate(self, params, buffers, updates, state, context, layout):
            raise RuntimeError("boom in aggregate")

    return AlwaysRaises


AlwaysRaises = _broken_algorithm()


@pytest.mark.parametrize(
    "config_change, space_change, message",
    [
        ({}, {"params": {"train.lrr": {"low": 0.01, "high": 0.1}}},
         r"params.'train.lrr' = 0.01: train.lrr: unknown"),
        ({"compare": {"algorithms": ["fedavg", "fedprox"]}, "algorithm": {"name": "fedavg"}},
         {"params": {"algorithm.mu": {"low": 0.01, "high": 0.1}}},
         r"params.'algorithm.mu' = 0.01 \(algorithm fedavg\): .*algorithm_params.<name>"),
        ({}, {"params": {"train.lr": {"low": 0.01, "high": 0.1}},
              "algorithm_params": {"fedprx": {"algorithm.mu": {"low": 0.01, "high": 0.1}}}},
         r"\[algorithm_params.fedprx\]: 'fedprx' is not an algorithm tuned here \(tuned: salf\)"),
        ({}, {"params": {"train.local_steps": {"low": 1.5, "high": 4, "int": True}}},
         r"int = true needs whole numbers"),
        ({}, {"params": {"train.batch_size": {"choices": [8, 0]}}}, r"train.batch_size = 0"),
    ],
)  # fmt: skip
def test_a_space_the_configuration_refuses_is_one_line_before_any_trial(
    tmp_path, capsys, config_change, space_change, message
):
    config = {**CONFIG, **config_change}
    if "compare" in config_change:
        config["data"] = {**CONFIG["data"]}
    space = {**SPACE, **space_change}
    if "params" in space_change and "algorithm_params" not in space_change:
        space["params"] = space_change["params"]
    paths = _files(tmp_path, config, space)
    assert main(["tune", *paths[:1], "--space", paths[1], "--trials", "2", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    import re

    assert len(err) == 1 and re.search(message, err[0]), err
    assert not any((tmp_path / "t").glob("*/trial-*"))  # no trial ran


def test_a_study_whose_trials_all_fail_stops_after_three_with_the_reason(tmp_path, capsys):
    config = {**CONFIG, "algorithm": {"name": "test_tune:AlwaysRaises"}}
    paths = _files(tmp_path, config)
    out = tmp_path / "t"
    started = time.time()
    assert main(["tune", paths[0], "--space", paths[1], "--trials", "5", "--out", str(out)]) == 2
    assert time.time() - started < 120
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "study c: 3 trials in a row failed, the study stops" in last
    reason = "algorithm 'test_tune:AlwaysRaises'.aggregate (round 1): raised RuntimeError: boom in aggregate"
    assert last.endswith(reason)
    assert err.count(f"failed: {reason}") == 3  # one line per trial
    study = _study(out)
    assert [t.state.name for t in study.get_trials()] == ["FAIL"] * 3
    assert all(t.user_attrs["error"] == reason for t in study.get_trials())
    from fedhet.studies.tune import read_trials

    assert {row["error"] for row in read_trials(f"sqlite:///{out / 'study.db'}", "c")} == {reason}
    assert main(["report", str(out)]) == 0  # the stopped study, each trial with its reason
    page = (out / "report.html").read_text()
    assert page.count(f"<td>{html.escape(reason)}</td>") == 3 and "the study stops" in page


def test_tuning_on_the_test_set_needs_to_be_asked_for(tmp_path, capsys):
    config = {**CONFIG, "data": {k: v for k, v in CONFIG["data"].items() if k != "validation_fraction"}}
    paths = _files(tmp_path, config)
    args = ["tune", paths[0], "--space", paths[1], "--trials", "1", "--out", str(tmp_path / "t")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "data.validation_fraction is not set" in err and "--allow-test-set" in err and "\n" not in err
    assert main([*args, "--allow-test-set", "--quiet"]) == 0


def test_every_finished_trial_is_one_line(tmp_path, capsys):
    paths = _files(tmp_path)
    assert main(["tune", paths[0], "--space", paths[1], "--trials", "3", "--out", str(tmp_path / "t")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("c: trial ")]
    assert len(lines) >= 3
    assert all(("value " in line or "pruned" in line) and "train.lr=" in line for line in lines)
