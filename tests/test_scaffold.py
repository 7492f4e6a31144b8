"""`fedhet new rule NAME` writes a plug-in package that installs and passes its own tests as
created (the rule runs `fedhet check` and its aggregation test), registers its entry point,
and refuses a name it cannot use or a folder that exists, in one line."""

from __future__ import annotations

import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from fedhet.cli import main


def _isolated_python(tmp_path):
    """A virtual environment of its own that sees this one's packages (fedhet, torch, pip,
    setuptools, pytest), so that installing the scaffold registers its entry point there only."""
    venv.EnvBuilder(with_pip=False).create(tmp_path / "env")
    python = tmp_path / "env" / "bin" / "python"
    target = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    here = sysconfig.get_paths()["purelib"]
    (Path(target) / "_parent.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return python


@pytest.mark.extended
def test_a_scaffolded_rule_installs_and_passes_its_tests(tmp_path, capsys):
    assert main(["new", "rule", "my-rule", "--out", str(tmp_path)]) == 0
    package = tmp_path / "my-rule"
    assert "python -m pip install -e '.[test]' && python -m pytest" in capsys.readouterr().out
    python = _isolated_python(tmp_path)
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."]
    subprocess.run(install, cwd=package, check=True, capture_output=True, timeout=300)
    tests = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=package,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-2000:]
    assert "2 passed" in tests.stdout
    listed = subprocess.run([python, "-m", "fedhet", "list", "algorithm"], capture_output=True, text=True)
    assert "my-rule" in listed.stdout and "entry point of my-rule" in listed.stdout


def test_a_bad_name_or_an_existing_folder_is_one_line(tmp_path, capsys):
    assert main(["new", "rule", "My Rule", "--out", str(tmp_path)]) == 2
    assert "a rule name is lower case letters, digits, - or _" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert main(["new", "rule", "taken", "--out", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("class", "is a Python keyword"),
        ("fedhet", "a module 'fedhet' is already importable here"),
        ("torch", "a module 'torch' is already importable here"),
        ("json", "a module 'json' is already importable here"),
        ("salf", "fedhet has a built-in rule of that name"),
        ("a" * 41, "41 characters; a rule name has at most 40"),
    ],
)
def test_a_name_the_package_could_not_use_is_one_line(tmp_path, capsys, name, says):
    """A keyword, a module that import would find first, a built-in rule's name, an
    over-long name: refused before anything is written."""
    assert main(["new", "rule", name, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["new", "rule", "good-rule", "--out", str(tmp_path / "file")]) == 2
    assert "--out" in capsys.readouterr().err
