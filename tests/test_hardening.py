"""Bad input is one line, numerical faults stop cleanly, run folders cannot lie, and the
participation marginals hold for 100,000 clients."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from fedhet.cli import main
from fedhet.config import SECTIONS, Config, ConfigError, from_dict, load_config
from fedhet.engine.loop import RunLoop
from fedhet.errors import FedhetError
from fedhet.results import RunDirectory, RunLock
from fedhet.system import StragglerRatio, Workload, poisson_binomial_pmf, random_subset_product
from fedhet.system.participation import BernoulliParticipation

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "run": {"name": "t", "seed": 1, "rounds": 3, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}


def _with(**sections) -> dict:
    out = {k: dict(v) for k, v in BASE.items()}
    for name, values in sections.items():
        out[name] = {**out.get(name, {}), **values}
    return out


def _cli(*argv: str, capsys) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


# --- configuration: every float key refuses NaN and infinities ---------------------------


def _float_keys():
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.type in ("float", float):
                yield f"{section}.{f.name}"


@pytest.mark.parametrize("key", list(_float_keys()))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_key_refuses_non_finite_values(key, value):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=rf"{key} = .*finite"):
        from_dict(_with(**{section: {name: value}}))


@pytest.mark.parametrize("option", ["server_lr", "beta"], ids=["fedavg.server_lr", "fedstale.beta"])
def test_algorithm_options_refuse_nan(option):
    name = "fedavg" if option == "server_lr" else "fedstale"
    with pytest.raises(ConfigError, match=f"algorithm.{option} = nan"):
        from_dict(_with(algorithm={"name": name, option: math.nan}))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty configuration"),
        (b"# only a comment\n", "empty configuration"),
        (b"[run]\nrounds = 3\n", "no algorithm given"),
        (b'[run]\nname = "\xff"\n', "not UTF-8"),
        (bytes(range(256)), "not UTF-8"),
    ],
)
def test_config_files_that_say_nothing_or_are_not_text_are_refused(tmp_path, content, message):
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_folder_as_config_is_one_line(tmp_path, capsys):
    code, err = _cli("run", str(tmp_path), capsys=capsys)
    assert code == 2 and err.strip().endswith("is a folder, not a TOML file") and err.count("\n") == 1


@pytest.mark.parametrize("algorithms", [[["salf"]], ["salf", "salf"], [1]])
def test_malformed_compare_is_refused(algorithms):
    with pytest.raises(ConfigError, match="compare.algorithms"):
        from_dict(_with(compare={"algorithms": algorithms}))


# --- property-based: any generated config validates or raises ConfigError ---------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
VALUES = st.one_of(
    SCALARS, st.lists(SCALARS, max_size=4), st.lists(st.lists(SCALARS, max_size=3), max_size=3)
)


def _keys(section: str) -> list[str]:
    from fedhet.algorithms import ALGORITHMS

    if section == "algorithm":
        names = {f.name for cls in ALGORITHMS.values() for f in dataclasses.fields(cls.Options)}
        return sorted(names | {"name", "bogus"})
    return [f.name for f in dataclasses.fields(SECTIONS[section])] + ["bogus"]


def _section_strategy(section: str):
    key = st.sampled_from(_keys(section))
    if section == "algorithm":
        from fedhet.algorithms import ALGORITHMS

        value = st.one_of(VALUES, st.sampled_from(sorted(ALGORITHMS)))
    else:
        value = VALUES
    return st.dictionaries(key, value, max_size=4)


CONFIGS = st.fixed_dictionaries(
    {},
    optional={name: _section_strategy(name) for name in [*SECTIONS, "algorithm"]},
).map(lambda d: {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in d.items()})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS)
def test_any_generated_config_validates_or_raises_one_config_error(raw):
    """Mutations of every section's keys with arbitrary TOML-like values: the only way to
    fail is a ConfigError with a one-line message."""
    merged = {k: dict(v) for k, v in BASE.items()}
    for section, values in raw.items():
        merged[section] = {**merged.get(section, {}), **values}
    try:
        config = from_dict(merged)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert isinstance(config, Config)
    for value in [config.train.lr, config.system.deadline, config.run.time_budget, config.data.fraction]:
        assert math.isfinite(value)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_as_a_config_file_is_a_config_error_or_a_config(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "c.toml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)


def test_the_bad_config_script_finds_no_traceback_and_no_silent_acceptance():
    """benchmarks/bad_configs.py: 386 invalid inputs, each must end as one error line."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bad_configs.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 tracebacks, 0 accepted silently, 0 rejected with extra output" in last
    assert int(last.split()[0]) >= 300


# --- experiment files are checked as strictly -------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        ({"experiment": {"jobs": "two"}}, "experiment.jobs"),
        ({"experiment": {"jbos": 2}}, "experiment.jbos: unknown key"),
        ({"report": {"value": "final_test_acuracy"}}, "report.value"),
        ({"report": {"rows": ["algorithm.nmae"]}}, "report key 'algorithm.nmae'"),
        ({"grid": {"run.seed": [1, 1]}}, "two cells are both named"),
    ],
)
def test_experiment_files_are_validated(tmp_path, change, message):
    from fedhet.studies.grid import load_experiment

    document = _with(grid={"run.seed": [1, 2]})
    for section, values in change.items():
        document[section] = {**document.get(section, {}), **values}
    path = tmp_path / "e.toml"
    path.write_text(tomli_w.dumps(document))
    with pytest.raises(ConfigError, match=message):
        load_experiment(path)


# --- numerical faults ------------------------------------------------------------------


def test_a_diverging_run_stops_with_its_last_good_checkpoint_and_resumes_skipping(tmp_path):
    """train.lr = 1e6: the run stops at the first non-finite update, keeps the checkpoint of
    the round before, marks the summary (strict JSON); resuming with skip-client goes on and
    counts the skipped clients in metrics.csv."""
    diverging = {"train": {"lr": 1e6}, "model": {"hidden": [32, 16]}, "algorithm": {"name": "fedavg"}}
    config = from_dict(_with(run={"rounds": 6, "checkpoint_every": 0}, **diverging))
    result = RunLoop(config, tmp_path / "r").run()
    summary_text = (tmp_path / "r" / "summary.json").read_text()
    summary = json.loads(summary_text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert summary["stopped_by"] == "non_finite" and not summary["finished"]
    fault = summary["non_finite"]
    assert fault["round"] == result.summary["rounds"] + 1 and "non-finite" in summary["notes"][-1]
    run_dir = RunDirectory(tmp_path / "r")
    assert run_dir.load_checkpoint()["round"] == fault["round"] - 1
    assert len(run_dir.read_metrics()) == fault["round"] - 1

    skipping = from_dict(
        _with(run={"rounds": 6, "on_non_finite": "skip-client", "checkpoint_every": 0}, **diverging)
    )
    resumed = RunLoop(skipping, tmp_path / "r").run(resume=True)
    rows = run_dir.read_metrics()
    assert len(rows) == 6 and resumed.summary["finished"]
    assert sum(r["skipped"] for r in rows) >= 1
    assert all(r["skipped"] + r["participants"] <= 4 for r in rows)


def test_a_fault_between_checkpoints_keeps_the_last_one_and_the_rows_it_covers(tmp_path):
    """With checkpoints far apart, a non-finite update stops the run with the last
    checkpoint before it kept; resuming with skip-client runs the rounds since then again,
    checks them against the rows on disk, and ends with the metrics of an uninterrupted
    skipping run."""
    diverging = {"train": {"lr": 1e3}, "model": {"hidden": [32, 16]}, "algorithm": {"name": "fedavg"}}
    run = {"rounds": 8, "checkpoint_every": 0.0}
    reference = RunLoop(
        from_dict(_with(run={**run, "on_non_finite": "skip-client"}, **diverging)), tmp_path / "ref"
    )
    expected = reference.run().metrics
    first_fault = next(i for i, r in enumerate(expected) if r["skipped"]) + 1
    assert first_fault < len(expected), "the run should go on after the fault"
    assert first_fault > 2, "the fault should come after a few clean rounds"
    stopping = RunLoop(from_dict(_with(run={**run, "checkpoint_every": 3600.0}, **diverging)), tmp_path / "r")
    stopping.run(stop_after=1)  # a checkpoint at round 1; the next is an hour away
    result = RunLoop(from_dict(_with(run={**run, "checkpoint_every": 3600.0}, **diverging)), tmp_path / "r")
    summary = result.run(resume=True).summary
    assert summary["stopped_by"] == "non_finite" and summary["non_finite"]["round"] == first_fault
    run_dir = RunDirectory(tmp_path / "r")
    assert run_dir.load_checkpoint()["round"] == 1
    assert len(run_dir.read_metrics()) == first_fault - 1  # rows on disk past the checkpoint
    skipping = from_dict(_with(run={**run, "on_non_finite": "skip-client"}, **diverging))
    RunLoop(skipping, tmp_path / "r").run(resume=True)
    assert (tmp_path / "r" / "metrics.csv").read_bytes() == (tmp_path / "ref" / "metrics.csv").read_bytes()


def test_nan_is_written_as_nan_not_as_a_blank(tmp_path):
    run_dir = RunDirectory(tmp_path)
    run_dir.create()
    run_dir.write_metrics(
        [{"round": 1, "train_loss": math.nan, "test_loss": math.inf, "test_accuracy": None}]
    )
    text = (tmp_path / "metrics.csv").read_text()
    assert ",nan," in text and ",inf," in text
    row = run_dir.read_metrics()[0]
    assert math.isnan(row["train_loss"]) and row["test_loss"] == math.inf and row["test_accuracy"] is None


# --- run folders ------------------------------------------------------------------------


def test_a_second_writer_stops_at_once_naming_the_holder(tmp_path):
    config = from_dict(BASE)
    holder = RunLock(tmp_path / "r" / ".lock")
    (tmp_path / "r").mkdir()
    holder.acquire()
    try:
        with pytest.raises(FedhetError, match=rf"in use by another fedhet run \(PID {os.getpid()}\)"):
            RunLoop(config, tmp_path / "r").run()
    finally:
        holder.release()
    assert RunLoop(config, tmp_path / "r").run().summary["finished"]


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    code = (
        "import sys, time; from pathlib import Path; from fedhet.results import RunLock;"
        f"lock = RunLock(Path({str(folder / '.lock')!r})); lock.acquire();"
        "print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(FedhetError, match=f"PID {proc.pid}"):
        RunLock(folder / ".lock").acquire()
    proc.kill()
    proc.wait()
    lock = RunLock(folder / ".lock")
    lock.acquire()  # the dead holder's lock is gone
    assert (folder / ".lock").read_text().strip() == str(os.getpid())
    lock.release()


def test_overwrite_removes_the_old_summary_before_the_first_round(tmp_path):
    config = from_dict(BASE)
    RunLoop(config, tmp_path / "r").run()
    assert (tmp_path / "r" / "summary.json").exists()
    RunLoop(config, tmp_path / "r").run(overwrite=True, stop_after=1)  # killed after round 1
    assert not (tmp_path / "r" / "summary.json").exists()
    assert len(RunDirectory(tmp_path / "r").read_metrics()) == 1


def test_resume_refuses_fewer_rounds_than_done_and_names_changed_keys(tmp_path):
    config = from_dict(BASE)
    RunLoop(config, tmp_path / "r").run()
    fewer = from_dict(_with(run={"rounds": 2}))
    with pytest.raises(FedhetError, match="already holds 3 rounds; --resume needs run.rounds >= 3"):
        RunLoop(fewer, tmp_path / "r").run(resume=True)
    other = from_dict(_with(train={"lr": 0.2}))
    with pytest.raises(FedhetError, match=r"train.lr \(0.1 -> 0.2\)"):
        RunLoop(other, tmp_path / "r").run(resume=True)
    assert (tmp_path / "r" / "config.toml").read_text().count("rounds = 3") == 1


def test_output_folder_problems_are_found_before_data_is_loaded(tmp_path, capsys):
    """--out that is a file: one line, even though the data folder does not exist either
    (the folder is checked first)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(_with(data={"dataset": "fmnist", "data_dir": str(tmp_path / "none")})))
    for out in (blocker, blocker / "sub"):
        code, err = _cli("run", str(path), "--out", str(out), "--quiet", capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and str(blocker) in err and "fmnist" not in err


def _resource_limited(limit: int):
    def apply():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_failed_write_mid_run_keeps_the_last_checkpoint_resumable(tmp_path):
    """A file-size limit (the same error path as a full disk) stops the run with one line
    once the checkpoint outgrows it; resuming without the limit ends with exactly the
    metrics of an uninterrupted run."""
    document = _with(run={"rounds": 40, "eval_every": 5, "checkpoint_every": 0})
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(document))
    reference = RunLoop(from_dict(document), tmp_path / "ref").run()
    sizes = {}
    probe = RunLoop(from_dict(document), tmp_path / "probe")
    for rounds in (5, 20):
        probe.run(resume=True, stop_after=rounds)
        sizes[rounds] = (tmp_path / "probe" / "checkpoint.pt").stat().st_size
    limit = (sizes[5] + sizes[20]) // 2
    cmd = [sys.executable, "-m", "fedhet", "run", str(path), "--out", str(tmp_path / "r"), "--quiet"]
    done = subprocess.run(
        cmd, capture_output=True, text=True, preexec_fn=_resource_limited(limit), timeout=300
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "--resume" in lines[0]
    kept = RunDirectory(tmp_path / "r").load_checkpoint()["round"]
    assert 5 <= kept < 20
    resumed = RunLoop(from_dict(document), tmp_path / "r").run(resume=True)
    assert resumed.metrics == reference.metrics


# --- reproduce owns its workers ------------------------------------------------------------


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc to find worker processes")
def test_killing_reproduce_ends_its_workers(tmp_path):
    document = _with(
        run={"rounds": 2000, "eval_every": 1000}, grid={"run.seed": [1, 2]}, experiment={"jobs": 2}
    )
    path = tmp_path / "e.toml"
    path.write_text(tomli_w.dumps(document))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhet", "reproduce", str(path), "--out", str(tmp_path / "g")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        workers = _children(proc.pid)
        time.sleep(0.2)
    assert len(workers) >= 2, "the workers did not start"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.1)
    alive = [
        w
        for w in workers
        if Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text().split(")")[1][:3]
    ]
    assert not alive, f"workers {alive} outlived their parent"


# --- participation marginals for 100,000 clients -------------------------------------------


def test_random_subset_product_matches_enumeration():
    rng = np.random.default_rng(0)
    for total in (1, 2, 5, 9):
        for size in range(total + 1):
            q, s = rng.uniform(0, 1, total), rng.uniform()
            inside, outside = 1 - q * s, 1 - q
            brute = np.mean([
                np.prod(np.where(np.isin(np.arange(total), subset), inside, outside))
                for subset in itertools.combinations(range(total), size)
            ])  # fmt: skip
            assert random_subset_product(inside, outside, size) == pytest.approx(brute, rel=1e-11, abs=1e-300)


def test_poisson_binomial_is_the_binomial_for_equal_probabilities():
    from scipy.stats import binom

    pmf = poisson_binomial_pmf(np.full(3000, 0.3))
    assert np.abs(pmf - binom.pmf(np.arange(3001), 3000, 0.3)).max() < 1e-13


@pytest.mark.parametrize("presence", [0.1, 1e-5])
def test_participation_marginals_hold_for_100000_clients(presence):
    """Equal presence q: P[no present client reaches l] = (1 - q s_l)^k (1 - q)^(U-k) in
    closed form; the exact method must agree (no overflow, no NaN) at U = 100,000."""
    clients, layers = 100_000, 3
    base = StragglerRatio(clients, layers, straggler_ratio=0.5, min_depth=2, deadline=1.0)
    model = BernoulliParticipation(base, np.full(clients, presence))
    work = Workload(1.0, np.full(clients, 16))
    marginals = model.marginals(work)
    k = base.num_stragglers
    s = base._straggler_reach()
    expected = np.exp(k * np.log1p(-presence * s) + (clients - k) * np.log1p(-presence))
    assert np.all(np.isfinite(marginals.no_reach_prob))
    np.testing.assert_allclose(marginals.no_reach_prob, expected, rtol=1e-9, atol=1e-300)


PER_STEP = {"model": "per-step", "time_per_sample_step": 0.05, "capability_profile": "uniform",
            "capability_low": 0.1, "capability_high": 2.0}  # fmt: skip
KILL_CASES = {
    "salf": {"algorithm": {"name": "salf"}},
    "fedstale": {"algorithm": {"name": "fedstale"}},
    # the peers and the server optimizer kind: their server state (sent models in flight,
    # moments) and client-side sampling must survive a kill
    "fedasync": {"algorithm": {"name": "fedasync", "max_concurrency": 3}},
    "ringmaster": {"algorithm": {"name": "ringmaster", "delay_threshold": 3}},
    "fadas": {"algorithm": {"name": "fadas", "buffer_size": 3, "delay_threshold": 1, "eta": 0.05}},
    "fedawe": {"algorithm": {"name": "fedawe"}},
    "slt": {"algorithm": {"name": "slt", "stage_rounds": 40}, "system": {**PER_STEP, "deadline": 1.5}},
    "timelyfl": {"algorithm": {"name": "timelyfl"}, "system": PER_STEP},
    "fjord": {"algorithm": {"name": "fjord"}, "system": PER_STEP},
    "depthfl": {"algorithm": {"name": "depthfl"}, "system": PER_STEP, "model": {"name": "mlp-exits"}},
    "salf-yogi": {"algorithm": {"name": "salf"}, "server": {"optimizer": "yogi", "lr": 0.05}},
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(KILL_CASES))
def test_kill_9_then_resume_ends_byte_identical(tmp_path, case):
    """A run killed with SIGKILL mid-run and resumed writes exactly the metrics.csv of an
    uninterrupted run (momentum in the client state; FedStale's server memory; FedAsync's
    models in flight; the server optimizer's moments). Checkpoints every 20 ms of wall time:
    the kill falls some rounds after the last one, which the resume runs again."""
    sections = {k: dict(v) for k, v in KILL_CASES[case].items()}
    system = {"participation": "two-group", "participation_min": 0.3, **sections.pop("system", {})}
    document = _with(
        run={"rounds": 150, "eval_every": 20, "checkpoint_every": 0.02},
        train={"lr": 0.05, "momentum": 0.9, "keep_momentum": True},
        system=system,
        **sections,
    )
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(document))
    run = [sys.executable, "-m", "fedhet", "run", str(path), "--quiet", "--out"]
    assert subprocess.run([*run, str(tmp_path / "ref")], capture_output=True, timeout=300).returncode == 0
    proc = subprocess.Popen([*run, str(tmp_path / "r")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "r" / "metrics.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or metrics.read_text().count("\n") < 40):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "r" / "summary.json").exists(), "the run finished before it was killed"
    resumed = subprocess.run(
        [*run, str(tmp_path / "r"), "--resume"], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert metrics.read_bytes() == (tmp_path / "ref" / "metrics.csv").read_bytes()


def test_a_new_run_removes_only_the_files_runs_wrote(tmp_path):
    """Starting over removes the old run's reports (FedStale's participation.json) but no
    other file that happens to be in the folder."""
    stale = from_dict(_with(algorithm={"name": "fedstale"}, system={"participation": "two-group"}))
    RunLoop(stale, tmp_path / "r").run()
    assert (tmp_path / "r" / "participation.json").exists()
    (tmp_path / "r" / "notes.json").write_text("{}")
    RunLoop(from_dict(BASE), tmp_path / "r").run(overwrite=True)
    assert not (tmp_path / "r" / "participation.json").exists()
    assert (tmp_path / "r" / "notes.json").exists()
