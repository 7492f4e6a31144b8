"""The package type-checks: `mypy` (configured in pyproject.toml: mypy's default strictness
on src/fedhet, every annotated function checked, libraries without type information taken
as Any) finds no error, so the contracts a plug-in author's editor reads (the base classes'
signatures, the messages) hold in fedhet's own code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_package(tmp_path):
    pytest.importorskip("mypy", reason="mypy is part of the test extra")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
