"""Which fedhet made a result: the package version and, for a source checkout, its git
commit (``0.1.0+g1a2b3c4``, ``.dirty`` when the package's files differ from that commit).
Run summaries carry it (``summary.json``'s ``fedhet``), and the per-run tables of grids."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path


@functools.lru_cache(maxsize=1)
def fedhet_build() -> str:
    """The version, with the commit of the checkout the package is imported from (no commit
    for an installed wheel, or where git is missing)."""
    from fedhet import __version__

    package = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        commit = git("rev-parse", "--short=10", "HEAD")
        if not commit:
            return __version__
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", str(package))
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}" + (".dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """The version and a short hash of the package's Python sources: what a result depends
    on of fedhet, the same for every checkout, commit or install whose code is the same
    (a change to docs or tests leaves it as it is)."""
    import hashlib

    from fedhet import __version__

    package = Path(__file__).resolve().parent
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return f"{__version__}+src.{digest.hexdigest()[:12]}"
