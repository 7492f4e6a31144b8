"""fedhet: federated learning on heterogeneous devices under time constraints.

Public API::

    from fedhet import load_config, run
    result = run(load_config("examples/quickstart.toml"), "runs/quick")

Heavy modules (torch, scipy) load on first use, so ``import fedhet`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fedhet.config import Config
    from fedhet.engine.loop import RunResult


def load_config(path: str, overrides: list[str] | None = None) -> Config:
    """Read and validate a TOML configuration (see :mod:`fedhet.config`)."""
    from fedhet.config import load_config as _load

    return _load(path, overrides)


def run(config: Config, out_dir: str, **kwargs: Any) -> RunResult:
    """Run ``config`` on its engine (``run.engine``), writing the run directory ``out_dir``."""
    from fedhet.engine.launch import run as _run

    return _run(config, out_dir, **kwargs)


def registries() -> dict[str, tuple[str, ...]]:
    """Names of every plug-in kind (:mod:`fedhet.registry`); ``partition`` names the
    partitioners."""
    from fedhet import registry

    out = {kind: tuple(registry.names(kind)) for kind in registry.KINDS}
    out["partition"] = out["partitioner"]
    return out
