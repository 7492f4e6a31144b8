"""The two tiers: a test of the default tier that starts a bench, Flower's simulation, Ray,
a virtual environment, PostgreSQL, mkdocs or mypy fails in one line that names what it
started (tests/conftest.py), so the default tier stays affordable; the second tier's tests
(marked ``extended``) may start them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import SMOKE_SUITE, SecondTierOnly

COMMANDS = {
    "a bench": [sys.executable, "-m", "fedhet", "bench", str(SMOKE_SUITE)],
    "mypy": [sys.executable, "-m", "mypy"],
    "mkdocs": [sys.executable, "-m", "mkdocs", "build"],
    "a virtual environment": [sys.executable, "-m", "venv", "env"],
    "PostgreSQL": ["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/initdb", "-D", "x"],
    "Ray": ["/some/env/bin/ray", "start", "--head"],
    "Flower": ["flower-superlink", "--insecure"],
}


@pytest.mark.parametrize("what", sorted(COMMANDS))
def test_a_default_tier_test_cannot_start_a_heavy_child_process(what):
    with pytest.raises(SecondTierOnly, match=f"starts {what}: mark it extended"):
        subprocess.run(COMMANDS[what], capture_output=True)


def test_a_default_tier_test_cannot_start_a_bench_ray_or_a_venv_in_this_process(tmp_path):
    import venv

    from fedhet.bench.runner import Bench
    from fedhet.studies.executor import start_ray

    with pytest.raises(SecondTierOnly, match="starts a bench"):
        Bench._execute(None, [])
    with pytest.raises(SecondTierOnly, match="starts Ray"):
        start_ray("local", 1)
    with pytest.raises(SecondTierOnly, match="starts a virtual environment"):
        venv.EnvBuilder().create(tmp_path / "env")


def test_a_default_tier_test_cannot_start_flowers_simulation_but_the_engine_checks_first(tmp_path):
    pytest.importorskip("flwr")
    from conftest import make_config

    from fedhet.engine.flower import run_simulation

    with pytest.raises(SecondTierOnly, match="starts Flower's simulation"):
        run_simulation(make_config({"run.engine": "flower", "run.rounds": 1}), tmp_path / "run")


def test_other_child_processes_are_the_default_tiers_own():
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True)
    assert done.stdout == "ran\n"


@pytest.mark.extended
def test_the_second_tier_may_start_them():
    done = subprocess.run([sys.executable, "-m", "venv", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage" in done.stdout
