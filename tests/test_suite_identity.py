"""A bench's identity does not depend on where its files are named from: a suite that reads
a device file or a trace (the shipped selection suite) has the same study settings whether
it is named by a relative or an absolute path, from the repository or from elsewhere; an
edit to a file it reads changes them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fedhet.bench.study import settings_fingerprint, settings_of
from fedhet.bench.suite import Tuning, load_suite

ROOT = Path(__file__).resolve().parent.parent


def _identity(suite_path: str | Path, cwd: Path) -> tuple[str, dict]:
    before = Path.cwd()
    os.chdir(cwd)
    try:
        suite = load_suite(suite_path, trials=2, seeds=1)
        scenario = next(s for s in suite.scenarios if s.name == "devices-trace")
        method = next(m for m in suite.methods if m.label == "salf+uniform")
        return settings_fingerprint(suite, scenario, method), settings_of(suite, Tuning(scenario, method, 1))
    finally:
        os.chdir(before)


def test_a_suite_named_from_anywhere_has_one_identity_and_its_files_count_by_content(tmp_path):
    relative, settings = _identity("suites/selection.toml", ROOT)
    absolute, _ = _identity(ROOT / "suites" / "selection.toml", tmp_path)
    assert relative == absolute
    trace = settings["config"]["system"]["availability_trace"]
    assert trace.startswith("file synthetic-trace.txt sha256:") and "/" not in trace

    copy = tmp_path / "clone"  # the suite and its files moved elsewhere: the same identity
    shutil.copytree(ROOT / "suites", copy / "suites")
    shutil.copytree(ROOT / "examples" / "devices", copy / "examples" / "devices")
    assert _identity(copy / "suites" / "selection.toml", tmp_path)[0] == relative
    edited = copy / "examples" / "devices" / "synthetic-trace.txt"
    edited.write_text(edited.read_text() + "\n")
    assert _identity(copy / "suites" / "selection.toml", tmp_path)[0] != relative


def _fingerprint(root: Path) -> str:
    """The code fingerprint of the plug-in ``plug.rule:Scaled`` under ``root``, in a fresh
    process (a bench reads it once per process)."""
    import subprocess
    import sys

    script = (
        "from fedhet.bench.study import code_fingerprint\n"
        "from fedhet.bench.suite import Method\n"
        "print(code_fingerprint(Method('scaled', 'plug.rule:Scaled', {}, [])))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_edit_to_a_helper_module_of_a_plugin_changes_its_code_fingerprint(tmp_path):
    """A plug-in rule's class imports a helper module of its package: editing the helper
    (not the class's module) changes the fingerprint, so the bench runs the method again."""
    package = tmp_path / "plug"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("FACTOR = 1.0\n")
    (package / "rule.py").write_text(
        "from fedhet.algorithms.fedavg import FedAvg\n"
        "from plug.helpers import FACTOR\n\n\n"
        "class Scaled(FedAvg):\n"
        '    """FedAvg under another name (its helper holds a constant)."""\n\n'
        '    name = "scaled"\n'
    )
    before = _fingerprint(tmp_path)
    assert before == _fingerprint(tmp_path)  # nothing changed: the same
    (package / "helpers.py").write_text("FACTOR = 2.0\n")
    assert _fingerprint(tmp_path) != before
