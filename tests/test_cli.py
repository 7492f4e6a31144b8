"""The command line: the issue's config runs verbatim; bad input exits with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, SALF_DIGITS_TOML


def fedhet(*args, cwd):
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "fedhet", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "salf.toml"
    path.write_text(SALF_DIGITS_TOML)
    return path


def test_verbatim_config_runs_and_writes_run_directory(tmp_path, config_file):
    done = fedhet("run", str(config_file), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "runs" / "salf-digits" / "summary.json").read_text())
    assert summary["rounds"] == 5 and summary["algorithm"] == "salf"
    again = fedhet("run", str(config_file), "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("system.straggler_ratio=1.5", "system.straggler_ratio = 1.5"),
        ("algorithm.name=nope", "algorithm.name = 'nope'"),
        ("data.num_clients=abc", "data.num_clients = 'abc'"),
        ("train.nonsense=1", "train.nonsense: unknown key"),
        ("algorithm.bias_correction=maybe", "bias_correction"),
    ],
)
def test_invalid_values_exit_nonzero_with_one_line(tmp_path, config_file, override, words):
    done = fedhet("run", str(config_file), "--set", override, cwd=tmp_path)
    assert done.returncode == 2
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_missing_data_folder_and_config_file_are_named(tmp_path, config_file):
    done = fedhet(
        "run",
        str(config_file),
        "--set",
        "data.dataset=mnist",
        "--set",
        f"data.data_dir={tmp_path / 'absent'}",
        cwd=tmp_path,
    )
    assert done.returncode == 2 and str(tmp_path / "absent") in done.stderr
    assert "Traceback" not in done.stderr
    done = fedhet("run", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert done.returncode == 2 and "nope.toml: config file not found" in done.stderr


def test_list_names_the_registries(tmp_path):
    done = fedhet("list", cwd=tmp_path)
    assert done.returncode == 0
    for name in ("salf", "drop", "fedavg", "digits", "fmnist", "cnn2", "vgg19", "exponential"):
        assert name in done.stdout


def test_quickstart_example_is_valid():
    from fedhet.config import load_config

    config = load_config(REPO / "examples" / "quickstart.toml")
    assert config.compare.algorithms == ["fedavg", "drop", "salf"]


ADEL_TOML = (
    SALF_DIGITS_TOML.replace("rounds = 5", "rounds = 12\ntime_budget = 300.0")
    .replace(
        'model = "straggler-ratio"\nstraggler_ratio = 0.9',
        'model = "exponential"\ndeadline = 0\ncapability_profile = "uniform"\ncapability_low = 0.2',
    )
    .replace('name = "salf"\n', 'name = "adel-fl"\n[compare]\nalgorithms = ["adel-fl", "salf"]\n')
)


def test_plan_calibrates_depth_and_shows_the_schedule(tmp_path):
    path = tmp_path / "adel.toml"
    path.write_text(ADEL_TOML)
    done = fedhet("plan", str(path), "--depth-fraction", "0.5", "--out", "plan.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "depth 50% at batch 16: deadline" in done.stdout
    assert "adel-fl plan: optimal" in done.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["total_time"] <= 300.0 * (1 + 1e-12) and len(plan["deadlines"]) == 12


def test_plot_draws_accuracy_and_deadlines(tmp_path, finished_runs):
    done = fedhet("plot", str(finished_runs), "--out", "figs/cmp", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("cmp-accuracy.png", "cmp-deadlines.png"):
        assert (tmp_path / "figs" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = fedhet("plot", "nowhere", "--out", "x", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nowhere" in bad.stderr


def test_help_lists_every_command_in_plain_words_and_version_prints(tmp_path):
    done = fedhet("--help", cwd=tmp_path)
    assert done.returncode == 0 and "``" not in done.stdout
    for command in ("run", "reproduce", "compare", "plan", "calibrate", "trace", "plot", "report", "list"):
        assert f"\n    {command}" in done.stdout
    version = fedhet("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("fedhet ")


def test_progress_goes_to_logs_one_line_per_evaluation_when_not_a_terminal(tmp_path, config_file):
    done = fedhet("run", str(config_file), "--set", "run.rounds=6", "--set", "run.eval_every=2", cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if " round " in line]
    assert [line.split()[2] for line in lines] == ["2/6", "4/6", "6/6"]
    quiet = fedhet("run", str(config_file), "--overwrite", "--quiet", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_compare_accepts_a_folder_of_runs_as_the_quickstart_writes(tmp_path, finished_runs):
    shutil.copytree(finished_runs, tmp_path / "runs" / "cmp")  # compare writes its figure there
    done = fedhet("compare", "runs/cmp", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "fedstale" in done.stdout and "salf" in done.stdout
    assert (tmp_path / "runs" / "cmp" / "comparison-accuracy.png").exists()


def test_plan_refuses_depth_fraction_without_a_time_law_and_runs_the_shipped_example(tmp_path):
    done = fedhet("plan", str(REPO / "examples" / "quickstart.toml"), "--depth-fraction", "0.5", cwd=tmp_path)
    assert done.returncode == 2 and "has no time law" in done.stderr and done.stderr.count("\n") == 1
    shipped = fedhet(
        "plan", str(REPO / "examples" / "adelfl_digits.toml"), "--depth-fraction", "0.5", cwd=tmp_path
    )
    assert shipped.returncode == 0 and "adel-fl plan: optimal" in shipped.stdout


@pytest.mark.slow
def test_output_into_a_reader_that_quits_early_is_no_traceback():
    """`fedhet reproduce EXPERIMENT --list | head -c 1`: the closed pipe ends fedhet quietly."""
    script = (
        f"{sys.executable} -m fedhet reproduce experiments/salf_study.toml --list "
        f"--set run.rounds=1 | head -c 1 >/dev/null; "
        f"for i in 1 2 3; do {sys.executable} -m fedhet reproduce "
        "experiments/salf_study.toml --list; done | head -c 1 >/dev/null"
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_list_shows_one_plugins_description_and_options(capsys):
    from fedhet.cli import main as cli_main

    assert cli_main(["list", "algorithm", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algorithm fedprox (fedhet; fedhet.algorithms.fedprox.FedProx)")
    assert "mu" in out and "default 0.01" in out and "proximal" in out
    assert cli_main(["list", "system-model"]) == 0
    listed = capsys.readouterr().out
    assert "straggler-ratio" in listed and "fedprox" not in listed
    assert cli_main(["list", "algo"]) == 2
    assert "not a plug-in kind" in capsys.readouterr().err


def test_compare_on_a_running_run_says_it_is_running(tmp_path, capsys):
    """A run folder whose run is still going (its lock held) is named as running, with its
    progress, instead of 'not a run folder'."""
    from fedhet.results import RunDirectory

    folder = tmp_path / "live"
    run_dir = RunDirectory(folder)
    run_dir.prepare(resume=False, overwrite=False)  # takes the lock, as a running run does
    (folder / "metrics.csv").write_text("round,sim_time\n1,1.0\n2,2.0\n")
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fedhet", "compare", str(folder)], capture_output=True, text=True
    )
    run_dir.release()
    assert done.returncode == 2 and "still running (2 rounds so far)" in done.stderr


def test_the_configuration_reference_prints_without_a_site_build(capsys):
    """``fedhet list --reference`` prints every key the site's reference page holds."""
    from fedhet.cli import main
    from fedhet.reference import reference_markdown

    assert main(["list", "--reference"]) == 0
    output = capsys.readouterr().out
    assert output.strip() == reference_markdown().strip()
    assert "straggler_ratio" in output and "## [run]" in output
