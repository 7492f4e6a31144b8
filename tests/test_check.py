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


class NotAnAlgorithm:
    """Shaped like a plug-in (Options, build) but not derived from Algorithm."""

    from fedhet.registry import NoOptions as Options

    @classmethod
    def build(cls, options, ctx):
        return cls()


def _check(target: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "fedhet", "check", target], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


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
