"""Figures from run directories: test accuracy against simulated time (or rounds), and the
per-round deadline schedule (ADEL-FL Fig. 2a). Needs matplotlib (``pip install
fedhet[plot]``), imported only here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.results import RunDirectory


def find_runs(paths: Sequence[str | Path]) -> list[RunDirectory]:
    """Run directories among ``paths`` and their direct sub-folders (those with metrics.csv)."""
    runs = []
    for path in map(Path, paths):
        if (path / "metrics.csv").exists():
            runs.append(RunDirectory(path))
        elif path.is_dir():
            runs.extend(RunDirectory(p) for p in sorted(path.iterdir()) if (p / "metrics.csv").exists())
        else:
            raise FedhetError(f"{path}: not a run directory (no metrics.csv)")
    if not runs:
        raise FedhetError(f"{', '.join(map(str, paths))}: no run directories found")
    return runs


def _labels(runs: list[RunDirectory]) -> dict[Path, str]:
    """Legend labels: the algorithm's name when it tells runs apart, else the run's name."""
    algorithms = {}
    for run in runs:
        summary = run.read_summary() if run.summary_path.exists() else {}
        algorithms[run.path] = summary.get("algorithm") or run.path.name
    if len(set(algorithms.values())) == len(runs):
        return algorithms
    return {run.path: run.path.name for run in runs}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise FedhetError("plotting needs matplotlib: pip install 'fedhet[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(
    paths: Sequence[str | Path], out_prefix: str | Path, x: str = "sim_time", title: str = ""
) -> list[Path]:
    """Write ``<out_prefix>-accuracy.png`` (test accuracy vs ``x``) and, when some run has
    deadlines, ``<out_prefix>-deadlines.png`` (deadline per round). Returns the files."""
    plt = _pyplot()
    runs = find_runs(paths)
    labels = _labels(runs)
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        rows = [r for r in run.read_metrics() if r.get("test_accuracy") is not None]
        if rows:
            ax.plot([r[x] for r in rows], [r["test_accuracy"] for r in rows], label=labels[run.path])
    xlabel = "simulated time [s]" if x == "sim_time" else "round"
    written.append(_save(plt, fig, ax, xlabel, "test accuracy", title, out_prefix, "accuracy"))

    with_deadlines = [(run, run.read_metrics()) for run in runs]
    with_deadlines = [(run, rows) for run, rows in with_deadlines if any(r.get("deadline") for r in rows)]
    if with_deadlines:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run, rows in with_deadlines:
            ax.plot([r["round"] for r in rows], [r["deadline"] for r in rows], label=labels[run.path])
        written.append(_save(plt, fig, ax, "round", "deadline [s]", title, out_prefix, "deadlines"))
    return written


def _save(plt, fig, ax, xlabel: str, ylabel: str, title: str, out_prefix: Path, kind: str) -> Path:
    """Label, title and write one figure as ``<out_prefix>-<kind>.png``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = out_prefix.with_name(f"{out_prefix.name}-{kind}.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
