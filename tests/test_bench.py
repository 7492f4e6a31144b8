"""``fedhet bench``: a bench killed during tuning and during seeds resumes without running a
trial or a seed twice and ends with the leaderboard of a bench never interrupted; ``--jobs``
and Ray give the same leaderboard; the statistics agree with scipy; bad suites are refused
in one line before anything runs."""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    BENCH_PLUGIN,
    BENCH_PLUGIN_RULE,
    SMOKE_BENCH_ARGS,
    SMOKE_SUITE,
    bench_env,
    bench_in_process,
    copy_bench,
    fedhet_in_process,
)

from fedhet.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SMOKE = SMOKE_SUITE
PLUGIN = BENCH_PLUGIN_RULE


def _bench_command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedhet", "bench", str(SMOKE), *SMOKE_BENCH_ARGS, "--out", str(out),
            "--quiet", *extra]  # fmt: skip


def _bench(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``fedhet bench`` in a child process (for Ray, whose workers import the test's rules
    from PYTHONPATH)."""
    done = subprocess.run(
        _bench_command(out, *extra), env=bench_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a bench's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"  # a zombie waiting to be reaped counts as gone


def _kill_when(out: Path, pattern: str, *extra: str, timeout: float = 300.0) -> None:
    """Start a bench and SIGKILL it as soon as a file matching ``pattern`` appears; return
    once its workers, which notice their parent is gone, have ended (a resume started while
    one still writes would find its run folder locked)."""
    process = subprocess.Popen(_bench_command(out, *extra), env=bench_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if list(out.glob(pattern)):
                break
            time.sleep(0.05)
        assert process.poll() is None, f"the bench ended before {pattern} appeared"
        workers = _children(process.pid)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    deadline = time.monotonic() + 60.0
    while not all(_gone(pid) for pid in workers):
        assert time.monotonic() < deadline, f"the killed bench's workers {workers} still run after 60 s"
        time.sleep(0.1)


def _counted_trials(out: Path) -> dict[str, list[dict]]:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = f"sqlite:///{out / 'bench.db'}"
    studies = {}
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        studies[summary.study_name] = [
            t.params
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        ]
    return studies


@pytest.mark.slow
@pytest.mark.extended
def test_a_bench_killed_during_tuning_and_seeds_resumes_to_the_same_leaderboard(tmp_path, smoke_bench):
    """A copy of the finished bench whose TrimmedMean is tuned and run again (``--rerun``),
    killed during that tuning and again during its seeds, then resumed: no trial or seed ran
    twice, and the leaderboard is the uninterrupted bench's."""
    out = copy_bench(smoke_bench, tmp_path / "killed")
    for folder in (*out.glob("trials/*/TrimmedMean"), *out.glob("seeds/*/TrimmedMean")):
        shutil.rmtree(folder)  # as --rerun does when it starts: the kills wait for new files
    _kill_when(out, "trials/*/TrimmedMean/**/trial-1/metrics.csv", "--rerun", "TrimmedMean")
    assert not list(out.glob("seeds/*/TrimmedMean/**/summary.json")), (
        "the first kill should come during tuning"
    )
    _kill_when(out, "seeds/*/TrimmedMean/**/metrics.csv")
    bench_in_process(out)
    # each study holds its two counted trials once (an interrupted trial is failed and its
    # values ran again as a new trial)
    studies = _counted_trials(out)
    assert len(studies) == 3 * 5 * 2  # scenarios x methods x tunings
    for name, params in studies.items():
        assert len(params) == 2, name
        assert params[0] != params[1], name
    # every seed ran once: one folder per seed, each with its rounds written once
    summaries = sorted(out.glob("seeds/**/seed-*/summary.json"))
    assert len(summaries) == 3 * 5 * 2 * 2
    for summary in summaries:
        rounds = [
            line.split(",")[0] for line in (summary.parent / "metrics.csv").read_text().splitlines()[1:]
        ]
        assert len(rounds) == len(set(rounds)), summary
    assert (out / "leaderboard.csv").read_text() == (smoke_bench / "leaderboard.csv").read_text()


@pytest.mark.extended
def test_a_tuned_settings_seed_runs_train_in_lockstep(smoke_bench):
    """suite.lockstep (the default): each tuned setting's two seed runs ran as one
    computation, and say so in their summaries."""
    import json

    summaries = [json.loads(p.read_text()) for p in smoke_bench.glob("seeds/**/seed-*/summary.json")]
    assert summaries and all(s.get("lockstep_runs") == 2 for s in summaries)


@pytest.mark.slow
@pytest.mark.extended
def test_a_methods_tuning_repeats_run_their_trials_in_lockstep(tmp_path, smoke_bench):
    """suite.lockstep with trials not pruned: the k-th trials of a method's two tunings ran
    as one computation (their summaries say so), and ask for the values a bench without
    lockstep asks for, scoring them the same within the rounding of a bigger group."""
    import json
    import tomllib

    import tomli_w

    trials = sorted(smoke_bench.glob("trials/**/trial-*/summary.json"))
    assert trials and all(json.loads(p.read_text()).get("lockstep_runs") == 2 for p in trials)
    document = tomllib.loads(SMOKE.read_text())
    document["suite"]["lockstep"] = False
    suite = tmp_path / "smoke-alone.toml"
    suite.write_bytes(tomli_w.dumps(document).encode())
    argv = ["bench", str(suite), *SMOKE_BENCH_ARGS, "--out", str(tmp_path / "alone"), "--quiet"]
    status, stderr = fedhet_in_process(argv, paths=(BENCH_PLUGIN,))
    assert status == 0, stderr[-3000:]
    alone = sorted((tmp_path / "alone").glob("trials/**/trial-*/summary.json"))
    assert [p.relative_to(tmp_path / "alone") for p in alone] == [p.relative_to(smoke_bench) for p in trials]
    for mine, theirs in zip(trials, alone, strict=True):
        a, b = json.loads(mine.read_text()), json.loads(theirs.read_text())
        assert "lockstep_runs" not in b
        assert a["final_test_accuracy"] == pytest.approx(b["final_test_accuracy"], abs=0.02), mine


@pytest.mark.slow
@pytest.mark.extended
def test_parallel_and_ray_benches_give_the_same_leaderboard(tmp_path, smoke_bench):
    """Copies of the finished bench with two methods tuned and run again, with ``--jobs 2``
    and as Ray tasks: the same leaderboard."""
    pytest.importorskip("ray")
    expected = (smoke_bench / "leaderboard.csv").read_text()
    again = ("--rerun", "TrimmedMean", "salf")
    bench_in_process(copy_bench(smoke_bench, tmp_path / "jobs2"), "--jobs", "2", *again)
    assert (tmp_path / "jobs2" / "leaderboard.csv").read_text() == expected
    _bench(copy_bench(smoke_bench, tmp_path / "ray"), "--ray", "--jobs", "2", *again)
    assert (tmp_path / "ray" / "leaderboard.csv").read_text() == expected


@pytest.mark.extended
def test_the_leaderboard_states_its_budget_and_flags_methods_with_knobs_of_their_own(smoke_bench):
    """Every method searches the shared knobs (client and server learning rate), whatever
    class it inherits; what it searches besides is its own, named in the table and flagged
    beside its row."""
    import csv
    import json

    rows = list(csv.DictReader((smoke_bench / "leaderboard.csv").open()))
    by_method = {(r["scenario"], r["method"]): r for r in rows}
    for method in ("salf", "drop", "fedavg", "fedprox", "TrimmedMean"):
        tunings = json.loads(by_method[("random-50", method)]["tuned"])  # each tuning's best setting
        assert len(tunings) == 2 and all({"train.lr", "server.lr"} <= set(tuned) for tuned in tunings)
    assert by_method[("random-50", "salf")]["own_knobs"] == ""
    assert by_method[("random-50", "TrimmedMean")]["own_knobs"] == "algorithm.trim"
    # at one local step FedProx's proximal term is inert: mu is not tuned, and the row says why
    assert by_method[("random-50", "fedprox")]["own_knobs"] == ""
    assert (
        "its proximal term (mu/2)||w - w_t||^2 (FedProx eq. (2)) is inert here"
        in (by_method[("random-50", "fedprox")]["caveats"])
    )
    assert sorted(r["rank"] for r in rows if r["scenario"] == "random-50")[0] == "1"
    import fedhet  # every row names the fedhet build its seed runs ran on

    assert all(r["fedhet"].startswith(fedhet.__version__) for r in rows if r["status"] == "ok")
    page = (smoke_bench / "leaderboard.md").read_text()
    facts = ("2 trials per method and scenario", "validation split of 0.2", "2 (1, 2) of each tuned setting",
             "shared knobs (every method): train.lr 0.02..0.5 log, server.lr 0.25..2 log",
             "2 independent tunings per method and scenario", "fedprox: algorithm.mu",
             "knobs not tuned (their mechanism is inert there): fedprox: algorithm.mu in random-50, "
             "persistent-90")  # fmt: skip
    for fact in (*facts, "fedhet version", "Holm"):
        assert fact in page
    import re

    assert re.search(r"\| TrimmedMean[^|]*\(\+1 own\) \|", page) and not re.search(r"\| salf[^|]*own", page)
    assert re.search(r"\| fedprox[^|]*⚠", page)  # at one local step, FedProx is drop-stragglers
    steps = page.split("## steps-5")[1]  # where slow clients finish fewer of five steps, mu acts
    assert re.search(r"\| fedprox[^|⚠]*\(\+1 own\)", steps) and not re.search(
        r"\| fedprox[^|]*own", page.split("## steps-5")[0]
    )
    html = (smoke_bench / "leaderboard.html").read_text()
    # the score and the energy against time, the budget curves, the clients' bytes, the ranks
    assert html.count("data:image/png;base64,") == 5


def test_a_bench_tuned_once_says_it_is_a_smoke_check_not_a_comparison():
    """The page's settings of a bench with one tuning per method say that its marks can
    come from one lucky search; with two they say the tuning is the unit."""
    from fedhet.bench.command import header
    from fedhet.bench.suite import load_suite

    once = header(load_suite(SMOKE, [], None, None, [], 1))["settings"]["tunings"]
    assert "A smoke check, not a comparison" in once and "one tuning per method and scenario" in once
    twice = header(load_suite(SMOKE, [], None, None, [], 2))["settings"]["tunings"]
    assert "A smoke check" not in twice and "the tuning is the unit of the intervals and tests" in twice


def test_holm_decisions_agree_with_scipy_and_intervals_stay_in_the_seeds_range():
    from scipy import stats

    from fedhet.bench.leaderboard import build
    from fedhet.studies.stats import holm

    # Holm on a known family: p sorted 0.01, 0.02, 0.03, 0.2 -> 0.04, 0.06, 0.06, 0.2
    assert holm([0.03, 0.01, None, 0.2, 0.02]) == pytest.approx([0.06, 0.04, None, 0.2, 0.06])
    seeds = {
        "best": [0.90, 0.92, 0.91, 0.93, 0.90],
        "close": [0.89, 0.92, 0.90, 0.93, 0.90],
        "far": [0.80, 0.83, 0.81, 0.84, 0.79],
        "farther": [0.70, 0.74, 0.69, 0.73, 0.71],
    }
    rows = [
        {"scenario": "s", "method": m, "status": "ok", "reason": "", "tunings": [
            {"params": {}, "validation": None,
             "seeds": {i + 1: {"accuracy": v} for i, v in enumerate(values)}}]}
        for m, values in seeds.items()
    ]  # fmt: skip
    board = build(rows, alpha=0.05)
    entries = {e.method: e for e in board.scenarios["s"]}
    for method, values in seeds.items():
        assert entries[method].mean == pytest.approx(np.mean(values))
        interval = entries[method].interval  # the seeds' bootstrap (one tuning): inside their range
        assert min(values) <= interval.low < np.mean(values) < interval.high <= max(values)
    assert entries["best"].best and entries["best"].rank == 1
    raw = {m: stats.ttest_rel(seeds["best"], seeds[m]).pvalue for m in ("close", "far", "farther")}
    m = len(raw)
    order = sorted(raw, key=raw.get)
    expected, running = {}, 0.0
    for i, method in enumerate(order):
        running = max(running, min(1.0, (m - i) * raw[method]))
        expected[method] = running
    for method in raw:
        assert entries[method].p == pytest.approx(raw[method])
        assert entries[method].p_holm == pytest.approx(expected[method])
        assert entries[method].worse == (expected[method] < 0.05)
    assert entries["close"].worse is False and entries["far"].worse and entries["farther"].worse
    assert [e.rank for e in sorted(entries.values(), key=lambda e: e.rank)] == [1, 2, 3, 4]
    overall = {o.method: o for o in board.overall}
    assert overall["best"].wins == 1 and overall["close"].not_worse == 1 and overall["far"].not_worse == 0
    assert math.isclose(overall["farther"].mean_rank, 4.0)


def test_lockstep_auto_is_on_for_a_gpu_only(tmp_path):
    """suite.lockstep = "auto" (the default) runs in lockstep where the runs' device is a GPU,
    not on the CPU, where it measured slower; true and false are as written."""
    from fedhet.bench.suite import load_suite

    text = SMOKE.read_text()
    for value, device, expected in (('"auto"', "cpu", False), ('"auto"', "cuda", True), ("true", "cpu", True),
                                    ("false", "cuda", False)):  # fmt: skip
        path = tmp_path / "suite.toml"
        path.write_text(text.replace("lockstep = true", f"lockstep = {value}", 1))
        suite = load_suite(path)
        suite.base.setdefault("run", {})["device"] = device
        assert suite.in_lockstep() is expected, (value, device)


def _suite(tmp_path: Path, text: str) -> Path:
    base = SMOKE.read_text()
    path = tmp_path / "suite.toml"
    path.write_text(base + text if not text.startswith("!") else text[1:])
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (("methods = [", 'methods = ["fedavgg", '), "'fedavgg': unknown; did you mean 'fedavg'"),
        (('"train.lr" = { low = 0.02, high = 0.5', '"train.lr" = { low = 0.5, high = 0.02'), "low < high"),
        (('"system.straggler_ratio" = 0.5', '"system.straggler_rate" = 0.5'),
         "scenarios.random-50: system.straggler_rate"),
        (("seeds = 3", "seeds = 0"), "suite.seeds = 0"),
        (("lockstep = true", 'lockstep = "always"'), 'suite.lockstep = \'always\': true, false or "auto"'),
        (("[algorithm_params", "[algorithm_params"), None),
    ],
)  # fmt: skip
def test_bad_suites_are_refused_in_one_line_before_anything_runs(tmp_path, change, message):
    from fedhet.bench.suite import load_suite

    if message is None:  # the unchanged suite loads
        load_suite(SMOKE)
        return
    path = tmp_path / "bad.toml"
    text = SMOKE.read_text()
    assert change[0] in text
    path.write_text(text.replace(change[0], change[1], 1))
    with pytest.raises(ConfigError) as caught:
        load_suite(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    status, stderr = fedhet_in_process(["bench", path, "--out", tmp_path / "out"])
    assert status == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert not (tmp_path / "out").exists()


def test_a_range_a_method_cannot_take_and_a_declared_option_it_lacks_are_refused(tmp_path):
    from fedhet.algorithms.base import check_algorithm_class
    from fedhet.bench.suite import load_suite
    from fedhet.search_space import declared_params

    path = tmp_path / "suite.toml"
    path.write_text(
        SMOKE.read_text() + '\n[algorithm_params.fedprox]\n"algorithm.mu" = { low = -1.0, high = 1.0 }\n'
    )
    with pytest.raises(ConfigError, match=r"method fedprox: algorithm.mu = -1.0"):
        load_suite(path)
    sys.path.insert(0, str(ROOT / "tests" / "bench_plugin"))
    try:
        from bench_rules import TrimmedMean
    finally:
        sys.path.pop(0)
    assert [p.key for p in declared_params(TrimmedMean, "x")] == ["algorithm.trim"]

    class Wrong(TrimmedMean):
        hyperparameters = {"trimm": {"low": 0.0, "high": 0.3}}

    with pytest.raises(ConfigError, match="'trimm' is not one of its options"):
        check_algorithm_class(Wrong, "wrong")


def test_a_method_table_sets_the_dotted_keys_its_method_needs(tmp_path):
    """{ name = "depthfl", "model.name" = "mlp-exits" }: every configuration of that method
    (tuning trials and seeds, every scenario) gets its model; the other methods keep theirs."""
    from fedhet.bench.suite import load_suite

    text = SMOKE.read_text()
    start = text.index("methods = [")
    path = tmp_path / "suite.toml"
    path.write_text(text[:start] + 'methods = ["fedavg", { name = "depthfl", "model.name" = "mlp-exits" }]\n'
                    + text[text.index("\n", text.index("]", start)) + 1:])  # fmt: skip
    suite = load_suite(path)
    for scenario, method in suite.pairs():
        raw = suite.config(scenario, method, {"train.lr": 0.1}, "x", seed=1)
        assert raw["model"]["name"] == ("mlp-exits" if method.label == "depthfl" else "mlp")
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace('"model.name" = "mlp-exits"', '"model.nam" = "mlp-exits"'))
    with pytest.raises(ConfigError, match="method depthfl: model.nam"):
        load_suite(bad)


def test_a_scenarios_dotted_options_set_that_methods_run_there_only():
    """options.fedbuff = { "run.rounds" = 100000 } in the heterogeneity suite's time-budget:
    FedBuff's server steps are not capped at the round rules' 100 rounds there; the round
    rules keep 100 and FedBuff keeps its rounds elsewhere; the algorithm options stay plain."""
    from fedhet.bench.suite import load_suite

    suite = load_suite(ROOT / "suites" / "heterogeneity.toml")
    scenarios, methods = {s.name: s for s in suite.scenarios}, {m.label: m for m in suite.methods}
    rounds = {
        (s, m): suite.config(scenarios[s], methods[m], {}, "x")["run"]["rounds"]
        for s in ("time-budget", "random-50")
        for m in ("fedbuff", "ringmaster", "salf")
    }
    assert rounds[("time-budget", "fedbuff")] == rounds[("time-budget", "ringmaster")] == 100000
    assert rounds[("time-budget", "salf")] == 100 and rounds[("random-50", "fedbuff")] == 100000
    assert suite.config(scenarios["time-budget"], methods["fedbuff"], {}, "x")["algorithm"] == {
        "name": "fedbuff"
    }


@pytest.mark.slow
@pytest.mark.extended
def test_report_on_a_bench_folder_gives_its_leaderboard_page_with_marks(smoke_bench, tmp_path):
    """``fedhet report`` on a bench folder points at (or copies) its leaderboard page (it used
    to refuse it as "neither a run folder nor a folder of runs"), and the page renders the
    markdown's marks: no literal ``*worse*`` or ``**best**``."""
    from fedhet.cli import main

    bench = copy_bench(smoke_bench, tmp_path / "bench")
    assert main(["report", str(bench)]) == 0
    page = (bench / "leaderboard.html").read_text(encoding="utf-8")
    assert "<strong>best</strong>" in page and "*worse*" not in page and "**" not in page
    assert "<em>worse</em>" in page  # the legend's mark
    assert main(["report", str(bench), "--out", str(tmp_path / "copy.html")]) == 0
    assert (tmp_path / "copy.html").read_text(encoding="utf-8") == page


EDITED_RULE = """
from fedhet.algorithms.fedavg import FedAvg


class Edited(FedAvg):
    name = "edited"

    def aggregate(self, params, buffers, updates, state, context, layout):
        new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
        {body}
"""
BROKEN = 'raise RuntimeError("not written yet")'
FIXED = "return params + 0.5 * (new_params - params), new_buffers"


def _rows(out: Path) -> dict[str, str]:
    lines = (out / "leaderboard.csv").read_text().splitlines()[1:]
    return {",".join(line.split(",")[:2]): line for line in lines}


# a row's columns that depend on the other methods of its scenario: its rank among them, its
# tests against their best and the reference, Holm-corrected over them, and its effects
RELATIVE_COLUMNS = (
    "rank", "p_vs_best", "p_holm", "worse_than_best", "vs_best", "vs_best_low", "vs_best_high",
    "vs_reference", "vs_reference_low", "vs_reference_high", "p_vs_reference", "p_holm_reference",
)  # fmt: skip


def _own_results(out: Path) -> dict[str, dict]:
    """Each row of leaderboard.csv without the columns that depend on the other methods."""
    import csv

    rows = csv.DictReader((out / "leaderboard.csv").open())
    return {
        f"{r['scenario']},{r['method']}": {k: v for k, v in r.items() if k not in RELATIVE_COLUMNS}
        for r in rows
    }


def _failed_trials(out: Path, method: str) -> list[int]:
    import csv

    rows = csv.DictReader((out / "leaderboard.csv").open())
    return [int(r["failed_trials"]) for r in rows if r["method"] == method and r["status"] == "failed"]


@pytest.mark.slow
@pytest.mark.extended
def test_a_rule_edited_between_two_benches_runs_again_alone(tmp_path, smoke_bench):
    """A bench into a folder whose plug-in rule changed since its studies ran tunes and runs
        that method again, says so in one line, and keeps every other method's own results byte
    for byte (its rank and Holm-corrected test move with the scenario's other methods); a rule
        whose trials failed, once fixed, gives the leaderboard of a bench where it never failed
        (its failed trials dropped with its older code). Each bench is a copy of the finished
        smoke bench with the rule added, run as a new process (the code is read once per process)."""
    module = tmp_path / "plugin"
    module.mkdir()
    rule = module / "edited_rule.py"

    def bench(out: Path, body: str, *extra: str) -> subprocess.CompletedProcess:
        rule.write_text(EDITED_RULE.format(body=body))
        command = [*_bench_command(out, "--method", "edited_rule:Edited"), *extra]
        done = subprocess.run(command, env=bench_env(module), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    bench(copy_bench(smoke_bench, tmp_path / "a"), BROKEN)
    before = _rows(tmp_path / "a")
    own_before = _own_results(tmp_path / "a")
    broken = [line for key, line in before.items() if key.endswith(",Edited")]
    assert broken and len(_failed_trials(tmp_path / "a", "Edited")) == len(broken)
    assert all(count > 0 for count in _failed_trials(tmp_path / "a", "Edited"))  # failed trials counted
    again = bench(tmp_path / "a", FIXED)
    said = "bench: Edited: its code changed since its studies ran: its studies and seeds run again"
    assert said in again.stderr
    after = _rows(tmp_path / "a")
    own_after = _own_results(tmp_path / "a")
    for key, row in own_before.items():
        if not key.endswith(",Edited"):
            assert own_after[key] == row, key  # the other methods' own results, byte for byte
    bench(copy_bench(smoke_bench, tmp_path / "never-broken"), FIXED)
    assert after == _rows(tmp_path / "never-broken")
    rerun = bench(tmp_path / "a", FIXED, "--rerun", "fedavg")
    assert "bench: fedavg: --rerun: its studies and seeds run again" in rerun.stderr
    assert _rows(tmp_path / "a") == after  # the same code runs the same trials and seeds
    # an edit that changes the rule's code but not its behaviour: its canary says so, and
    # its studies and seeds are kept (a field re-run survives commits that change no method)
    settled = _without_code(tmp_path / "a")
    kept = bench(tmp_path / "a", FIXED + "  # the same step, written again")
    assert "run again" not in kept.stderr
    assert (
        "bench: Edited: its code changed since its studies ran, its behaviour (canary) did not" in kept.stderr
    )
    assert _without_code(tmp_path / "a") == settled


def _without_code(out: Path) -> dict[str, dict]:
    """Each row of leaderboard.csv without its ``code`` column (the fingerprint of the code
    that read it)."""
    import csv

    rows = csv.DictReader((out / "leaderboard.csv").open())
    return {f"{r['scenario']},{r['method']}": {k: v for k, v in r.items() if k != "code"} for r in rows}


def test_selections_cross_every_round_rule_and_skips_and_options_follow(tmp_path):
    """[selections.<name>]: each round rule becomes one method per selection, whose every
    configuration carries that [selection]; an event-driven rule and a method that sets its
    own selection run once; a scenario's skip, options and [algorithm_params] of a crossed
    rule apply to each of its crossings; a bad selection is refused in one line naming it."""
    from fedhet.bench.suite import load_suite

    text = SMOKE.read_text()
    text = text.replace('methods = ["fedavg", "drop", "salf", "fedprox"]',
                        'methods = ["fedavg", "fedprox", "fedbuff", { name = "drop", label = "drop-own", '
                        '"selection.rule" = "uniform", "selection.clients_per_round" = 2 }]')  # fmt: skip
    text = text.replace("[scenarios.persistent-90]\n", "[scenarios.persistent-90]\nskip.fedavg = \"why\"\n"
                        "options.fedprox = { mu = 0.5 }\n")  # fmt: skip
    text += ('\n[algorithm_params.fedprox]\n"algorithm.mu" = { low = 0.01, high = 0.1 }\n'
             '\n[selections.uni]\nrule = "uniform"\nclients_per_round = 3\n'
             '\n[selections.powd]\nrule = "power-of-choice"\n'
             "clients_per_round = 3\ncandidates = 6\n")  # fmt: skip
    path = tmp_path / "suite.toml"
    path.write_text(text)
    suite = load_suite(path)
    labels = [m.label for m in suite.methods]
    assert labels == ["fedavg+uni", "fedavg+powd", "fedprox+uni", "fedprox+powd", "fedbuff", "drop-own"]
    assert suite.reference == "fedavg+uni"  # the suite's reference, crossed: its first crossing
    rules = {"uni": "uniform", "powd": "power-of-choice"}
    for scenario, method in suite.pairs():
        raw = suite.config(scenario, method, {"train.lr": 0.1}, "x", seed=1)
        expected = rules.get(method.label.partition("+")[2]) or (
            "uniform" if method.label == "drop-own" else None
        )
        assert raw.get("selection", {}).get("rule") == expected
        if scenario.name == "persistent-90" and method.name == "fedprox":
            assert raw["algorithm"]["mu"] == 0.5
    skipped = {
        m.label for s, m in [(s, m) for s in suite.scenarios for m in suite.methods] if m.label in s.skip
    }
    assert skipped == {"fedavg+uni", "fedavg+powd"}
    assert {p.key: (p.low, p.high) for p in suite.methods[2].params}["algorithm.mu"] == (0.01, 0.1)
    path.write_text(text.replace("candidates = 6", "candidates = 0"))
    with pytest.raises(ConfigError, match=r"method fedavg\+powd: selection.candidates = 0") as caught:
        load_suite(path)
    assert "\n" not in str(caught.value)
    path.write_text(text.replace('[selections.uni]\nrule = "uniform"\n', "[selections.uni]\n"))
    with pytest.raises(ConfigError, match="selections.uni: a selection needs a rule"):
        load_suite(path)


def test_the_bench_waits_for_its_tasks_by_their_completion_queue():
    """PendingTasks hands back each finished future once, in the order they finished, and
    nothing (after the timeout) while none has finished."""
    from concurrent.futures import Future

    from fedhet.bench.runner import PendingTasks

    pending = PendingTasks()
    futures = [Future() for _ in range(3)]
    for i, future in enumerate(futures):
        pending[future] = ("seed", i)
    assert pending.next_finished(timeout=0.01) == []
    futures[2].set_result(None)
    futures[0].set_result(None)
    assert pending.next_finished(timeout=0.01) == [futures[2], futures[0]]
    assert pending.next_finished(timeout=0.01) == []
    done = Future()
    done.set_result(None)
    pending[done] = ("seed", 3)  # already finished when handed in
    assert pending.next_finished(timeout=0.01) == [done]
