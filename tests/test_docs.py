"""The API reference builds from the docstrings with warnings as errors (`mkdocs build
--strict`: a reference to a name that no longer exists, a docstring griffe cannot parse, a
broken link between pages fails it), and it documents the base class of every plug-in kind
the registry knows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.extended
def test_the_api_reference_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    page = (tmp_path / "site" / "api" / "plugins" / "index.html").read_text(encoding="utf-8")
    for hook in ("finish_local_work", "upload_payload", "after_round", "state_dict", "attach"):
        assert hook in page


def test_every_plugin_kind_has_its_base_class_in_the_reference():
    from fedhet.registry import KINDS

    index = (ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    missing = [group for group in KINDS.values() if f"`{group}`" not in index]
    assert not missing, f"docs/api/index.md lists no base class for {missing}"
