"""Figures from run directories: test accuracy against simulated time (or rounds), and the
per-round deadline schedule (ADEL-FL Fig. 2a). matplotlib is imported only here."""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import Sequence
from pathlib import Path

from fedhet.checks import counted
from fedhet.errors import FedhetError
from fedhet.results import RunDirectory, make_folder, run_order

log = logging.getLogger("fedhet")


def find_runs(paths: Sequence[str | Path], marker: str = "metrics.csv") -> list[RunDirectory]:
    """Run directories among ``paths`` and their direct sub-folders (those holding
    ``marker``: metrics.csv, or summary.json for finished runs)."""
    runs = []
    for path in map(Path, paths):
        if (path / marker).exists():
            runs.append(RunDirectory(path))
        elif (path / "metrics.csv").exists() and RunDirectory(path).running():
            done = RunDirectory(path).rounds_so_far()
            raise FedhetError(
                f"{path}: still running ({counted(done, 'round')} so far); it has no {marker} yet"
            )
        elif path.is_dir():
            order = {name: index for index, name in enumerate(run_order(path))}  # the experiment's
            folders = sorted(path.iterdir(), key=lambda p: (order.get(p.name, len(order)), p.name))
            found = [RunDirectory(p) for p in folders if (p / marker).exists()]
            running = [p.name for p in folders if not (p / marker).exists() and RunDirectory(p).running()]
            if running:
                log.warning("%s: %s still running, left out", path, ", ".join(running))
            if not found:
                raise FedhetError(f"{path}: neither a run folder nor a folder of runs (no {marker})")
            runs.extend(found)
        else:
            raise FedhetError(f"{path}: not a run folder (no {marker})")
    if not runs:
        raise FedhetError(f"{', '.join(map(str, paths))}: no run folders found")
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


# Strong colours for the methods most often compared, then one of its own for every other
# built-in rule (in name order), then the colours no built-in uses, for plug-ins and labels.
COLOR_ORDER = ("salf", "fedavg", "drop", "adel-fl", "fedstale", "amsfl", "u-fedavg", "fedvarp", "mifa",
               "fedprox", "fednova", "scaffold", "feddyn")  # fmt: skip
PALETTE = (
    "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    # matplotlib's tab20b and tab20c
    "#393b79", "#5254a3", "#6b6ecf", "#9c9ede", "#637939", "#8ca252", "#b5cf6b", "#cedb9c",
    "#8c6d31", "#bd9e39", "#e7ba52", "#e7cb94", "#843c39", "#ad494a", "#d6616b", "#e7969c",
    "#7b4173", "#a55194", "#ce6dbd", "#de9ed6", "#3182bd", "#6baed6", "#9ecae1", "#c6dbef",
    "#e6550d", "#fd8d3c", "#fdae6b", "#fdd0a2", "#31a354", "#74c476", "#a1d99b", "#c7e9c0",
    "#756bb1", "#9e9ac8", "#bcbddc", "#dadaeb", "#636363", "#969696", "#bdbdbd", "#d9d9d9",
)  # fmt: skip


@functools.cache
def builtin_slots() -> dict[str, int]:
    """Each built-in rule's slot in :data:`PALETTE`: :data:`COLOR_ORDER` first, then the
    other registered algorithms by name."""
    from fedhet.registry import names

    rest = sorted(set(names("algorithm")) - set(COLOR_ORDER))
    return {name: slot for slot, name in enumerate([*COLOR_ORDER, *rest])}


def algorithm_color(name: str) -> str:
    """The colour of an algorithm in every figure: a built-in rule's own (FedAvg is the same
    colour in all of them, and no two built-ins share one); any other name (a plug-in, a
    bench label) one of the colours no built-in uses, chosen by the name."""
    slots = builtin_slots()
    if name in slots:
        return PALETTE[slots[name] % len(PALETTE)]
    free = PALETTE[len(slots) :] or PALETTE
    return free[zlib.crc32(name.encode()) % len(free)]


def _styles(runs: list[RunDirectory]) -> dict[Path, dict]:
    """Line colour by algorithm; runs of the same algorithm get different line styles."""
    seen: dict[str, int] = {}
    out = {}
    for run in runs:
        algorithm = _summary(run).get("algorithm") or run.path.name
        n = seen.get(algorithm, 0)
        seen[algorithm] = n + 1
        out[run.path] = {"color": algorithm_color(algorithm), "linestyle": ("-", "--", ":", "-.")[n % 4]}
    return out


def _summary(run: RunDirectory) -> dict:
    return run.read_summary() if run.summary_path.exists() else {}


def default_title(runs: list[RunDirectory]) -> str:
    """``dataset, model, system model`` of the runs (from their summaries), when they agree."""
    settings = {
        ", ".join(str(s.get(k)) for k in ("dataset", "model", "system")) for s in map(_summary, runs) if s
    }
    return settings.pop() if len(settings) == 1 else ""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise FedhetError("plotting needs matplotlib: pip install 'fedhet[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(
    paths: Sequence[str | Path],
    out_prefix: str | Path,
    x: str = "sim_time",
    title: str = "",
    deadlines: bool = True,
) -> list[Path]:
    """Write ``<out_prefix>-accuracy.png`` (test accuracy vs ``x``) and, when some run has
    deadlines, ``<out_prefix>-deadlines.png`` (deadline per round). Returns the files."""
    plt = _pyplot()
    runs = find_runs(paths)
    labels, styles = _labels(runs), _styles(runs)
    title = title or default_title(runs)
    out_prefix = Path(out_prefix)
    make_folder(out_prefix.parent, "figure folder")
    written = []

    tables = {run.path: run.read_metrics() for run in runs}
    column = score_column(runs, [row for rows in tables.values() for row in rows])
    evaluated = {path: [r for r in rows if r.get(column) is not None] for path, rows in tables.items()}
    if not any(evaluated.values()):
        names = ", ".join(str(run.metrics_path) for run in runs[:3]) + (" ..." if len(runs) > 3 else "")
        raise FedhetError(f"{names}: no evaluated round yet (no {column}); nothing to plot")
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        rows = evaluated[run.path]
        if rows:
            ax.plot(
                [r[x] for r in rows],
                [r[column] for r in rows],
                label=labels[run.path],
                **styles[run.path],
            )
    xlabel = "simulated time [s]" if x == "sim_time" else "round"
    name = column.removeprefix("test_")
    ylabel = "test RMSE" if name == "rmse" else f"test {name}"
    written.append(_save(plt, fig, ax, xlabel, ylabel, title, out_prefix, name))

    if deadlines:
        written += _deadline_figure(plt, runs, labels, styles, title, out_prefix)
    return written


def _deadline_figure(plt, runs, labels, styles, title: str, out_prefix: Path) -> list[Path]:
    """``<out_prefix>-deadlines.png``, the deadline per round, when some run has one."""
    with_deadlines = [(run, run.read_metrics()) for run in runs]
    with_deadlines = [(run, rows) for run, rows in with_deadlines if any(r.get("deadline") for r in rows)]
    if not with_deadlines:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, rows in with_deadlines:
        ax.plot([r["round"] for r in rows], [r["deadline"] for r in rows], label=labels[run.path],
                **styles[run.path])  # fmt: skip
    return [_save(plt, fig, ax, "round", "deadline [s]", title, out_prefix, "deadlines")]


def score_column(runs, rows: list[dict]) -> str:
    """The metrics column that scores a model: the task's score as the runs' summaries
    record it (``test_accuracy``, a regression's ``test_rmse``); for runs still going, the
    first test column after the loss that holds a value."""
    from fedhet.data.task import Score

    for run in runs:
        try:
            summary = run.read_summary()
        except Exception:  # noqa: BLE001  (no summary yet, or an unreadable one: the rows decide)
            continue
        if summary:
            return Score.from_summary(summary).column
    filled = [k for row in rows for k, v in row.items() if k.startswith("test_") and v is not None]
    return next((k for k in filled if k != "test_loss"), "test_accuracy")


def _save(plt, fig, ax, xlabel: str, ylabel: str, title: str, out_prefix: Path, kind: str) -> Path:
    """Label, title and write one figure as ``<out_prefix>-<kind>.png``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = out_prefix.with_name(f"{out_prefix.name}-{kind}.png")
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise FedhetError(f"{path}: cannot write the figure ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
    return path


def plot_beta_map(cells, path: str | Path, title: str = "", rows: dict | None = None) -> Path:
    """FedStale Fig. 2: a heatmap of beta_opt over (p_avg/p_min, sigma_g^2), lighter for 0 and
    darker for 1, each cell annotated with beta_opt, Delta_0 and Delta_1 (accuracy points) and,
    with several seeds, beta_opt's 95% bootstrap range.
    ``cells``: :class:`fedhet.studies.beta_map.MapCell` objects. ``rows`` (label -> cells) replaces
    the sigma_g^2 rows by named rows, e.g. known vs estimated probabilities (Fig. 5)."""
    from fedhet.studies.beta_map import bootstrap_beta_opt

    plt = _pyplot()
    if rows is None:
        sigmas = sorted({c.swap_fraction for c in cells})
        rows = {f"{s:g}": [c for c in cells if c.swap_fraction == s] for s in sigmas}
        ylabel = "data heterogeneity σ_g²"
    else:
        ylabel = ""
    ratios = sorted({c.participation_ratio for row in rows.values() for c in row})
    grid = [[None] * len(ratios) for _ in rows]
    for i, row in enumerate(rows.values()):
        for c in row:
            grid[i][ratios.index(c.participation_ratio)] = c
    values = [[c.beta_opt if c else float("nan") for c in row] for row in grid]
    fig, ax = plt.subplots(figsize=(1.6 * len(ratios) + 2.5, 1.3 * len(rows) + 1.5))
    image = ax.imshow(values, cmap="Blues", vmin=0.0, vmax=1.0, origin="lower", aspect="auto")
    for i, row in enumerate(grid):
        for j, c in enumerate(row):
            if c is None:
                continue
            text = f"β={c.beta_opt:g}\nΔ0 {_points(c.gain_over(0.0))}\nΔ1 {_points(c.gain_over(1.0))}"
            interval = bootstrap_beta_opt(c) if getattr(c, "per_seed", None) else None
            if interval is not None:  # seeds: beta_opt's 95% bootstrap range
                text += f"\n[{interval.low:g}, {interval.high:g}]"
            color = "white" if c.beta_opt > 0.6 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(len(ratios)), [f"{r:.1f}" for r in ratios])
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_xlabel("participation heterogeneity p_avg / p_min")
    ax.set_ylabel(ylabel)
    fig.colorbar(image, ax=ax, label="β_opt")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return _write(plt, fig, path)


def plot_stale_slices(cells, path: str | Path, sigma: float, ratio: float, betas=(0.0, 0.5, 1.0)) -> Path:
    """FedStale Figs. 3 and 4: accuracy against data heterogeneity at participation ratio
    ``ratio`` (left) and against participation heterogeneity at sigma_g^2 = ``sigma`` (right),
    one line per beta, with 95% t-intervals over seeds where there are several."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = {0.0: "β=0 (U-FedAvg)", 1.0: "β=1 (FedVARP)"}
    for beta in betas:
        label = names.get(beta, f"β={beta:g} (FedStale)")
        col = sorted(
            (c for c in cells if abs(c.participation_ratio - ratio) < 1e-6), key=lambda c: c.swap_fraction
        )
        pts = [(c.swap_fraction, c.accuracy[beta], _half_width(c, beta)) for c in col if beta in c.accuracy]
        if pts:
            x, y, err = zip(*pts, strict=True)
            left.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
        row = sorted(
            (c for c in cells if abs(c.swap_fraction - sigma) < 1e-9), key=lambda c: c.participation_ratio
        )
        pts = [
            (c.participation_ratio, c.accuracy[beta], _half_width(c, beta)) for c in row if beta in c.accuracy
        ]
        if pts:
            x, y, err = zip(*pts, strict=True)
            right.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
    left.set_xlabel("data heterogeneity σ_g²")
    left.set_title(f"p_avg / p_min = {ratio:.1f}")
    right.set_xlabel("participation heterogeneity p_avg / p_min")
    right.set_xscale("log")
    ratios = sorted({c.participation_ratio for c in cells if abs(c.swap_fraction - sigma) < 1e-9})
    right.set_xticks(ratios, [f"{r:.1f}" for r in ratios])
    right.minorticks_off()
    right.set_title(f"σ_g² = {sigma:g}")
    for ax in (left, right):
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return _write(plt, fig, path)


def _half_width(cell, beta: float) -> float:
    """The 95% t-interval's half-width of a cell's accuracy at ``beta`` over its seeds (0 with
    one seed)."""
    from fedhet.studies.stats import estimate

    values = list(getattr(cell, "per_seed", {}).get(beta, {}).values())
    return estimate(values, "ci95").spread if len(values) > 1 else 0.0


def _points(gain: float | None) -> str:
    return "-" if gain is None else f"{100 * gain:+.1f}"


def _write(plt, fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_distributions(
    groups: dict[str, list[float]], path: str | Path, kind: str = "box", title: str = ""
) -> Path:
    """Box (``kind="box"``) or violin plot of values per group, e.g. final accuracy over
    seeds per method (AMSFL Fig. 1)."""
    plt = _pyplot()
    labels = list(groups)
    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2, 4))
    data = [groups[k] for k in labels]
    if kind == "violin":
        ax.violinplot(data, showmedians=True)
        ax.set_xticks(range(1, len(labels) + 1))
        ax.set_xticklabels(labels, rotation=20)
    else:
        ax.boxplot(data, tick_labels=labels)
        ax.tick_params(axis="x", labelrotation=20)
    ax.set_ylabel("final test accuracy")
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return _write(plt, fig, path)
