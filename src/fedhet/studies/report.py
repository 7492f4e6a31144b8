"""``fedhet report``: one self-contained HTML page for a run or a folder of runs.

A run's page holds its configuration, its summary, test accuracy against rounds and against
simulated time, the deadline per round, histograms of participants and mean depth per round,
and the algorithm's reports (``plan.json``, ``participation.json``, ...). A folder of runs
(a grid or a ``[compare]``) gets a table of every run, one accuracy figure with them all and,
for up to 12 runs, each run's section. Figures are PNGs embedded as data URIs, so the page
is one file that can be mailed or archived.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.results import RunDirectory, read_json_object
from fedhet.studies.trials import rdb_storage

MAX_RUN_SECTIONS = 12
MAX_REPORT_BYTES = 200_000  # an algorithm report larger than this is shown truncated
FIXED_FILES = {"summary.json"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; }
.figures figure { margin: 0; width: 32em; }
"""


def _copied(page: Path, target: Path) -> Path:
    import shutil

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, target)
    except OSError as exc:
        raise FedhetError(f"{target}: cannot write the report ({exc.strerror or exc})") from None
    return target


def write_report(path: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the report of a run folder or a folder of runs; return the file written. A
    bench folder's report is its leaderboard page (copied to ``out`` when given)."""
    from fedhet.studies.plots import find_runs

    path = Path(path)
    if not path.is_dir():
        raise FedhetError(f"{path}: not a folder (give a run folder or a folder of runs)")
    if (path / "bench.json").exists():  # a `fedhet bench` folder: its page is the leaderboard's
        page = path / "leaderboard.html"
        if not page.is_file():
            raise FedhetError(f"{path}: a bench whose leaderboard is not written yet; run it again to finish")
        if out is None:
            return [page]
        return [_copied(page, Path(out))]
    target = Path(out) if out else path / "report.html"
    if (path / "tune.json").exists():  # a `fedhet tune` folder
        body = _tune_page(path)
    else:
        single = (path / "metrics.csv").exists()
        runs = [RunDirectory(path)] if single else find_runs([path])
        body = _run_page(runs[0], level=1) if single else _grid_page(path, runs)
    document = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fedhet report: {html.escape(path.name)}</title><style>{STYLE}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(document, encoding="utf-8")
    except OSError as exc:
        raise FedhetError(f"{target}: cannot write the report ({exc.strerror or exc})") from None
    return [target]


def _grid_page(path: Path, runs: list[RunDirectory]) -> str:
    from fedhet.studies.plots import default_title

    summaries = {run.path: _read_json(run.summary_path) for run in runs}
    parts = [f"<h1>{html.escape(path.name)}: {len(runs)} runs</h1>"]
    setting = default_title(runs)
    if setting:
        parts.append(f"<p>Setting: {html.escape(setting)}</p>")
    parts.append(_runs_table(runs, summaries))
    table = path / "table.md"
    if table.exists():
        parts.append("<h2>Experiment table</h2>" + _markdown_table(table.read_text(encoding="utf-8")))
    parts.append('<div class="figures">')
    parts.append(_figure(_accuracy_figure(runs, "sim_time"), "test accuracy against simulated time"))
    parts.append(_figure(_accuracy_figure(runs, "round"), "test accuracy against rounds"))
    parts.append(_figure(_band_figure(runs), "mean and 95% confidence band over seeds, against rounds"))
    parts.append("</div>")
    if len(runs) <= MAX_RUN_SECTIONS:
        parts += [_run_page(run, level=2) for run in runs]
    else:
        parts.append(f"<p>{len(runs)} runs: per-run sections are left out above {MAX_RUN_SECTIONS}; "
                     "run <code>fedhet report RUN</code> on one of them.</p>")  # fmt: skip
    return "\n".join(parts)


def _markdown_table(text: str) -> str:
    """A grid's table.md as an HTML table (its notes as a paragraph under it)."""
    rows, notes = [], []
    for line in text.splitlines():
        if line.startswith("|") and set(line) <= set("|-: "):
            continue  # the header's rule
        if line.startswith("|"):
            rows.append([html.escape(cell.strip()) for cell in line.strip().strip("|").split("|")])
        elif line.strip():
            notes.append(html.escape(line.strip()))
    if not rows:
        return f"<pre>{html.escape(text)}</pre>"
    head = "".join(f"<th>{cell}</th>" for cell in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows[1:])
    note = f"<p>{' '.join(notes)}</p>" if notes else ""
    return f"<table><tr>{head}</tr>{body}</table>{note}"


def _seed_groups(runs: list[RunDirectory]) -> dict[str, list[RunDirectory]]:
    """Runs whose configurations differ only in ``run.seed`` (and name), by a label."""
    import tomllib

    groups: dict[str, list[RunDirectory]] = {}
    for run in runs:
        try:
            config = tomllib.loads((run.path / "config.toml").read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        settings = {k: v for k, v in config.items() if k != "run"}
        settings["run"] = {k: v for k, v in config.get("run", {}).items() if k not in ("seed", "name")}
        key = repr(sorted((k, repr(v)) for k, v in settings.items()))
        groups.setdefault(key, []).append(run)
    return {
        f"{group[0].path.name} ({len(group)} seeds)": group for group in groups.values() if len(group) > 1
    }


def seed_band(values, metric: str):
    """Per round (a row of ``values``, one column per seed): the mean and its 95%
    t-interval, clipped to the values ``metric`` can take (an accuracy stays in [0, 1])."""
    import numpy as np
    from scipy import stats

    from fedhet.run_schema import value_range

    seeds = values.shape[1]
    mean = values.mean(1)
    half = stats.t.ppf(0.975, seeds - 1) * values.std(1, ddof=1) / np.sqrt(seeds)
    low, high = value_range(metric)
    return mean, np.clip(mean - half, low, high), np.clip(mean + half, low, high)


def _band_figure(runs: list[RunDirectory]) -> bytes | None:
    """Per group of seeds: the mean test score per round and its 95% t-interval as a band."""
    import numpy as np

    from fedhet.studies.plots import _pyplot, score_column

    groups = _seed_groups(runs)
    if not groups:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    column = "test_accuracy"
    for label, group in groups.items():
        tables = [run.read_metrics() for run in group]
        column = score_column(group, [row for rows in tables for row in rows])
        by_round: dict[int, list[float]] = {}
        for rows in tables:
            for row in rows:
                if row.get(column) is not None:
                    by_round.setdefault(int(row["round"]), []).append(float(row[column]))
        rounds = sorted(r for r, values in by_round.items() if len(values) == len(group))
        if not rounds:
            continue
        mean, lower, upper = seed_band(np.array([by_round[r] for r in rounds]), column.removeprefix("test_"))
        (line,) = ax.plot(rounds, mean, label=label)
        ax.fill_between(rounds, lower, upper, alpha=0.2, color=line.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel("test RMSE" if column == "test_rmse" else "test accuracy")
    ax.grid(alpha=0.3)
    if len(groups) <= 20:
        ax.legend(fontsize=8)
    return _png(fig)


def _runs_table(runs: list[RunDirectory], summaries: dict) -> str:
    from fedhet.data.task import Score

    scores = dict.fromkeys(Score.from_summary(s or {}).metric for s in summaries.values())
    columns = ["run", "algorithm", "rounds", "sim_time", "energy",
               *(f"{end}_test_{m}" for m in scores for end in ("final", "best")), "stopped_by"]  # fmt: skip
    head = "".join(f"<th>{c}</th>" for c in columns)
    rows = []
    for run in runs:
        summary = summaries[run.path] or {}
        cells = [run.path.name] + [summary.get(c) for c in columns[1:]]
        rows.append("<tr>" + "".join(f"<td>{_format(v)}</td>" for v in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _run_page(run: RunDirectory, level: int) -> str:
    h, h2 = f"h{level}", f"h{level + 1}"
    summary = _read_json(run.summary_path)
    metrics = run.read_metrics() if run.metrics_path.exists() else []
    state = "finished" if summary and summary.get("finished") else "not finished"
    if summary and summary.get("stopped_by") == "non_finite":
        state = "stopped: non-finite values"
    elif summary and summary.get("stopped_by") == "no_participants":
        state = f"stopped: no participants ({summary.get('empty_rounds')} empty rounds)"
    parts = [f'<section id="{html.escape(run.path.name)}"><{h}>{html.escape(run.path.name)}</{h}>']
    parts.append(f"<p>{html.escape(state)}; {len(metrics)} rounds in metrics.csv</p>")
    if summary:
        parts.append(f"<{h2}>Summary</{h2}>")
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{_format(v)}</td></tr>"
            for k, v in summary.items()
            if not isinstance(v, dict | list)
        )
        parts.append(f"<table>{rows}</table>")
    if metrics:
        parts.append(f'<{h2}>Figures</{h2}><div class="figures">')
        parts.append(_figure(_accuracy_figure([run], "round"), "test accuracy against rounds"))
        parts.append(_figure(_accuracy_figure([run], "sim_time"), "test accuracy against simulated time"))
        if any(r.get("deadline") for r in metrics):
            parts.append(_figure(_series_figure(metrics, "deadline", "deadline [s]"), "deadline per round"))
        parts.append(_figure(_histogram(metrics, "participants"), "participants per round"))
        if any(r.get("mean_depth") is not None for r in metrics):
            parts.append(
                _figure(
                    _histogram(metrics, "mean_depth"),
                    "mean depth per round: the first layer the clients' back-propagation reached "
                    "(1 = all layers; larger = less work)",
                )
            )
        parts.append(_figure(_clients_figure(run.path / "clients.csv"), CLIENTS_CAPTION))
        parts.append("</div>")
    config = run.path / "config.toml"
    if config.exists():
        parts.append(f"<{h2}>Configuration</{h2}><pre>{html.escape(config.read_text())}</pre>")
    reports = sorted(p for p in run.path.glob("*.json") if p.name not in FIXED_FILES)
    for report in reports:
        text = report.read_text()
        if len(text) > MAX_REPORT_BYTES:
            text = text[:MAX_REPORT_BYTES] + f"\n... ({len(text):,} characters, truncated)"
        parts.append(
            f"<details><summary>{html.escape(report.name)}</summary><pre>{html.escape(text)}</pre></details>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _tune_page(path: Path) -> str:
    """A ``fedhet tune`` folder: per study, the trials table, Optuna's optimisation history
    and its parameter importances (fANOVA), as figures."""
    import optuna

    from fedhet.studies.plots import _pyplot

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    document = read_json_object(path / "tune.json", "tune record")
    parts = [f"<h1>{html.escape(path.name)}: fedhet tune</h1>"]
    for entry in document.get("studies", []):
        name = entry["study"]
        study = optuna.load_study(study_name=name, storage=rdb_storage(document["storage"]))
        trials = study.get_trials(deepcopy=False)
        keys = sorted({k for t in trials for k in t.params})
        parts.append(f"<h2>{html.escape(name)}</h2>")
        if entry.get("best_trial") is None:
            parts.append(f"<p>{len(trials)} trials; {html.escape(entry.get('stopped', 'no best trial'))}</p>")
        else:
            parts.append(
                f"<p>{len(trials)} trials; best: trial {entry['best_trial']}, "
                f"value {_format(entry['value'])}; runnable configuration "
                f"<code>{html.escape(entry['best_toml'])}</code></p>"
            )
        parts.append(_trials_table(trials, keys))
        plt = _pyplot()
        parts.append('<div class="figures">')
        finished = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
        if finished:
            parts.append(_history_figure(plt, study, finished))
        if len(finished) >= 2 and keys:
            importances = optuna.importance.get_param_importances(study)
            fig, ax = plt.subplots(figsize=(5.5, 0.6 + 0.4 * len(importances)))
            names = list(importances)[::-1]
            ax.barh(names, [importances[n] for n in names])
            ax.set_xlabel("importance (fANOVA)")
            parts.append(_figure(_png(fig), "parameter importances"))
        parts.append("</div>")
    return "\n".join(parts)


def _trials_table(trials: list, keys: list[str]) -> str:
    """A study's trials as an HTML table: number, state, value, parameters, why it failed."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["trial", "state", "value", *keys, "why"])
    rows = [
        "<tr>" + "".join(f"<td>{_format(v)}</td>" for v in [t.number, t.state.name, t.value,
                                                            *[t.params.get(k) for k in keys]])
        + f"<td>{html.escape(str(t.user_attrs.get('error', '')))}</td></tr>"
        for t in trials
    ]  # fmt: skip
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _history_figure(plt, study, finished: list) -> str:
    """The finished trials' values and the best so far (in the study's direction)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot([t.number for t in finished], [t.value for t in finished], "o", label="trial")
    best: list[float] = []
    for t in finished:
        value = float(t.value or 0.0)  # finished trials have values
        better = not best or (value > best[-1] if study.direction.name == "MAXIMIZE" else value < best[-1])
        best.append(value if better else best[-1])
    ax.plot([t.number for t in finished], best, "-", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("objective")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _figure(_png(fig), "optimisation history")


def _read_json(path: Path) -> dict | None:
    """A run's summary (None when it has none yet); one error naming a damaged file."""
    if not path.exists():
        return None
    return read_json_object(path, "summary")


def _format(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _figure(png: bytes | None, caption: str) -> str:
    if png is None:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def _accuracy_figure(runs: list[RunDirectory], x: str) -> bytes | None:
    from fedhet.studies.plots import _labels, _pyplot, _styles, score_column

    plt = _pyplot()
    labels, styles = _labels(runs), _styles(runs)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    drawn = False
    tables = {run.path: run.read_metrics() for run in runs}
    column = score_column(runs, [row for rows in tables.values() for row in rows])
    for run in runs:
        rows = [r for r in tables[run.path] if r.get(column) is not None]
        if rows:
            ax.plot([r[x] for r in rows], [r[column] for r in rows], label=labels[run.path],
                    **styles[run.path])  # fmt: skip
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("simulated time [s]" if x == "sim_time" else "round")
    ax.set_ylabel("test RMSE" if column == "test_rmse" else "test accuracy")
    ax.grid(alpha=0.3)
    if len(runs) <= 20:
        ax.legend(fontsize=8)
    return _png(fig)


def _series_figure(metrics: list[dict], key: str, label: str) -> bytes:
    from fedhet.studies.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot([r["round"] for r in metrics], [r.get(key) for r in metrics])
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    return _png(fig)


# clients.csv's columns the report shows over the clients: (column, axis label, scale)
SPENT = (
    ("train_s", "training [s]", 1.0),
    ("comm_s", "communicating [s]", 1.0),
    ("idle_s", "waiting [s]", 1.0),
    ("joules", "energy [J]", 1.0),
    ("bytes_down", "received [MB]", 1e-6),
    ("bytes_up", "sent [MB]", 1e-6),
    ("train_flops", "trained [GFLOP]", 1e-9),
)
CLIENTS_CAPTION = (
    "what each client spent over the run (clients.csv): each dot a client, the box its quartiles "
    "over the clients"
)


def _clients_figure(path: Path) -> bytes | None:
    """Each clients.csv quantity of :data:`SPENT` over the clients: a box and every client."""
    import csv

    import numpy as np

    from fedhet.studies.plots import _pyplot

    if not path.exists():
        return None
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    shown = [(c, label, scale) for c, label, scale in SPENT if rows and c in rows[0]]
    if not shown:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(shown), figsize=(1.6 * len(shown) + 1, 3.2), squeeze=False)
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(rows))
    for ax, (column, label, scale) in zip(axes[0], shown, strict=True):
        values = np.array([float(r[column] or 0.0) * scale for r in rows])
        ax.boxplot(values, widths=0.5, showfliers=False)
        ax.scatter(1 + jitter, values, s=8, alpha=0.6, color="tab:blue")
        ax.set_xticks([])
        ax.set_title(label, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def _histogram(metrics: list[dict], key: str) -> bytes | None:
    from fedhet.studies.plots import _pyplot

    values = [r[key] for r in metrics if r.get(key) is not None]
    if not values:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.hist(values, bins=min(30, max(5, len(set(values)))))
    ax.set_xlabel(key.replace("_", " "))
    ax.set_ylabel("rounds")
    return _png(fig)
