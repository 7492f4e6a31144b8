"""`fedhet check` tries a plug-in on a tiny run and names what fails: its class checks, the
rounds (a failing hook, named), and an interrupted-and-resumed run that must end as the
uninterrupted one (a rule keeping state outside its server state fails that check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fedhet.algorithms.fedavg import FedAvg
from fedhet.cli import main

TESTS = str(Path(__file__).resolve().parent)


class ForgetsOnResume(FedAvg):
    """Keeps a count on the object, outside its server state: lost when a run resumes."""

    seen = 0

    def aggregate(self, params, buffers, updates, state, context, layout):
        self.seen += 1
        new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
        return params + (new_params - params) / self.seen, new_buffers


class FailsInRoundFour(FedAvg):
    """Aggregates well for three rounds, then returns a model of the wrong size."""

    def aggregate(self, params, buffers, updates, state, context, layout):
        new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
        return (new_params[:-1] if context.plan.round >= 3 else new_params), new_buffers


class NotAnAlgorithm:
    """Shaped like a plug-in (Options, build) but not derived from Algorithm."""

    from fedhet.registry import NoOptions as Options

    @classmethod
    def build(cls, options, ctx):
        return cls()


def _check(target: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "fedhet", "check", target, *flags], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip


def test_a_sound_plugin_passes_every_check(capsys):
    assert main(["check", "fedhet.algorithms.fedprox:FedProx"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["class", "rounds", "resume"]
    assert all(": ok" in line for line in lines)


def test_state_kept_outside_the_server_state_fails_the_resume_check():
    done = _check("test_check:ForgetsOnResume")
    assert done.returncode == 1
    assert "rounds: ok" in done.stdout
    assert "resume: interrupted after round 1 and resumed, the run differs from round 2 on" in done.stdout


def test_a_class_that_is_not_an_algorithm_fails_the_class_check():
    done = _check("test_check:NotAnAlgorithm")
    assert done.returncode == 1 and done.stdout.startswith("class: ")
    assert "not a subclass of fedhet.algorithms.Algorithm" in done.stdout


def test_a_bug_from_round_four_fails_the_default_check_and_rounds_sets_the_length(capsys):
    """The default check runs past round 3 (it used to stop there, so a hook that breaks in
    round 4 passed); ``--rounds`` sets the run's length, and a length the resume check cannot
    use is one line."""
    done = _check("test_check:FailsInRoundFour")
    assert done.returncode == 1, done.stdout
    assert "rounds: algorithm 'test_check:FailsInRoundFour'.aggregate (round 4)" in done.stdout
    assert _check("test_check:FailsInRoundFour", "--rounds", "3").returncode == 0
    assert main(["check", "fedhet.algorithms.fedavg:FedAvg", "--rounds", "7"]) == 0
    assert "rounds: ok (7 rounds" in capsys.readouterr().out
    assert main(["check", "fedhet.algorithms.fedavg:FedAvg", "--rounds", "1"]) == 2
    assert "--rounds 1: expected a whole number of rounds in 2..10000" in capsys.readouterr().err
