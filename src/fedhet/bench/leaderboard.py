"""A bench's leaderboard: per scenario, each method's final test accuracy over the seeds
(mean with a 95% Student-t interval, the seed count stated), its simulated time to the
suite's target accuracy, its rank, and a paired t-test against the scenario's best method
over the seeds both ran, Holm-corrected within the scenario; across scenarios, each
method's mean rank and wins. Written as ``leaderboard.md``, ``leaderboard.csv`` and a
self-contained ``leaderboard.html`` with figures (test accuracy against simulated time per
scenario, a heat-map of the ranks).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.checks import counted
from fedhet.data.task import Score
from fedhet.studies.stats import difference_p_value, estimate, holm

CSV_COLUMNS = (
    "scenario",
    "method",
    "status",
    "rank",
    "mean_accuracy",
    "ci95",
    "seeds",
    "accuracy_by_seed",
    "time_to_target",
    "target_reached",
    "p_vs_best",
    "p_holm",
    "worse_than_best",
    "validation_value",
    "tuned",
    "lr_only",
    "reason",
    "caveats",
    "fedhet",
    "failed_trials",
)  # fmt: skip  (a classification's; another score names its own: mean_rmse, rmse_by_seed)


def csv_columns(score: Score) -> tuple[str, ...]:
    """leaderboard.csv's columns for the suite's score."""
    rename = {"mean_accuracy": f"mean_{score.metric}", "accuracy_by_seed": f"{score.metric}_by_seed"}
    return tuple(rename.get(column, column) for column in CSV_COLUMNS)


@dataclass
class Entry:
    """One method in one scenario."""

    scenario: str
    method: str
    status: str = "ok"  # ok | failed | skipped
    reason: str = ""
    lr_only: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    validation: float | None = None
    scores: dict[int, float] = field(default_factory=dict)  # seed -> final test score
    times: dict[int, float | None] = field(default_factory=dict)  # seed -> time to target
    folders: dict[int, str] = field(default_factory=dict)
    caveats: list[str] = field(default_factory=list)  # settings under which it is another rule
    builds: list[str] = field(default_factory=list)  # the fedhet builds its seed runs ran on
    failed_trials: int = 0  # tuning trials that failed (with the method's current code)
    mean: float | None = None
    ci95: float | None = None
    rank: int | None = None
    average_rank: float | None = None
    p: float | None = None
    p_holm: float | None = None
    worse: bool | None = None
    best: bool = False

    @property
    def reached(self) -> tuple[int, int]:
        return sum(1 for t in self.times.values() if t is not None), len(self.times)

    @property
    def time_to_target(self) -> float | None:
        hit = [t for t in self.times.values() if t is not None]
        return sum(hit) / len(hit) if hit else None


@dataclass
class Overall:
    """One method across the scenarios it ran in."""

    method: str
    scenarios: int
    mean_rank: float | None
    wins: int
    not_worse: int  # scenarios where it is the best or not significantly worse (Holm)


@dataclass
class Leaderboard:
    scenarios: dict[str, list[Entry]]
    overall: list[Overall]
    alpha: float
    score: Score = field(default_factory=Score)  # what ranks the methods (the task's score)


def results_score(rows: list[dict]) -> Score:
    """The score the seed runs report (their task's; accuracy when none finished)."""
    for row in rows:
        for result in row["seeds"].values():
            if "score_metric" in result:
                return Score(result["score_metric"], bool(result["higher_is_better"]))
    return Score()


def build(rows: list[dict], alpha: float = 0.05) -> Leaderboard:
    """The leaderboard of a bench's results (:meth:`fedhet.bench.runner.Bench.results`),
    ranked by the task's score in its direction (an accuracy up, an RMSE down)."""
    score = results_score(rows)
    scenarios: dict[str, list[Entry]] = {}
    for row in rows:
        entry = Entry(row["scenario"], row["method"], row["status"], row["reason"], row["lr_only"],
                      dict(row["params"]), row["validation"])  # fmt: skip
        entry.failed_trials = int(row.get("failed_trials", 0))
        for seed, result in sorted(row["seeds"].items()):
            value = result.get("score", result.get("accuracy"))  # "accuracy": results written before
            if "failed" in result or value is None:
                entry.reason = entry.reason or f"seed {seed}: {result.get('failed', f'no {score.metric}')}"
                continue
            entry.scores[int(seed)] = float(value)
            entry.times[int(seed)] = result.get("time_to_target")
            entry.folders[int(seed)] = result.get("folder", "")
            entry.caveats += [c for c in result.get("caveats", []) if c not in entry.caveats]
            if result.get("fedhet") and result["fedhet"] not in entry.builds:
                entry.builds.append(result["fedhet"])
        if entry.status == "ok" and not entry.scores:
            entry.status, entry.reason = "failed", entry.reason or "no seed finished"
        scenarios.setdefault(entry.scenario, []).append(entry)
    for entries in scenarios.values():
        rank_scenario(entries, alpha, score)
    return Leaderboard(scenarios, overall(scenarios), alpha, score)


def rank_scenario(entries: list[Entry], alpha: float, score: Score | None = None) -> None:
    """Means, 95% t-intervals and ranks (the best score first: the highest accuracy, the
    lowest RMSE; ties share the lower rank,
    and the mean-rank uses their average); the best method (rank 1, the first listed among
    ties) against each other by a paired t-test over common seeds, Holm-corrected."""
    from scipy.stats import rankdata

    ranked = [e for e in entries if e.status == "ok"]
    for entry in ranked:
        est = estimate(list(entry.scores.values()), "ci95")
        entry.mean, entry.ci95 = est.mean, (est.spread if est.n > 1 else None)
    if not ranked:
        return
    sign = -1.0 if (score or Score()).higher_is_better else 1.0
    means = [sign * (e.mean or 0.0) for e in ranked]
    for entry, low, average in zip(ranked, rankdata(means, "min"), rankdata(means, "average"), strict=True):
        entry.rank, entry.average_rank = int(low), float(average)
    best = next(e for e in ranked if e.rank == 1)
    best.best = True
    others = [e for e in ranked if e is not best]
    raw = [difference_p_value(best.scores, e.scores) for e in others]
    for entry, p, adjusted in zip(others, raw, holm(raw), strict=True):
        entry.p, entry.p_holm = p, adjusted
        entry.worse = None if adjusted is None else bool(adjusted < alpha)


def overall(scenarios: dict[str, list[Entry]]) -> list[Overall]:
    """Per method: its mean rank over the scenarios where it ran, its wins (rank 1), and the
    scenarios where it is not significantly worse than the best; best mean rank first."""
    methods: dict[str, list[Entry]] = {}
    for entries in scenarios.values():
        for entry in entries:
            methods.setdefault(entry.method, []).append(entry)
    out = []
    for method, entries in methods.items():
        ran = [e for e in entries if e.average_rank is not None]
        mean_rank = sum(e.average_rank for e in ran) / len(ran) if ran else None  # type: ignore[misc]
        out.append(Overall(method, len(ran), mean_rank, sum(1 for e in ran if e.rank == 1),
                           sum(1 for e in ran if e.best or e.worse is False)))  # fmt: skip
    order = {m: i for i, m in enumerate(methods)}
    return sorted(out, key=lambda o: (o.mean_rank is None, o.mean_rank or 0.0, order[o.method]))


# -- writing ---------------------------------------------------------------------------------
def _number(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _values(params: dict) -> str:
    return ", ".join(f"{k.split('.', 1)[-1]}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in params.items())  # fmt: skip


def csv_rows(board: Leaderboard) -> list[dict]:
    rows, metric = [], board.score.metric
    for entries in board.scenarios.values():
        for e in sorted(entries, key=_order):
            reached, seeds = e.reached
            rows.append({
                "scenario": e.scenario, "method": e.method, "status": e.status,
                "rank": "" if e.rank is None else e.rank, f"mean_{metric}": _number(e.mean, 6),
                "ci95": _number(e.ci95, 6), "seeds": len(e.scores),
                f"{metric}_by_seed": ";".join(f"{s}:{v:.6f}" for s, v in sorted(e.scores.items())),
                "time_to_target": _number(e.time_to_target, 3),
                "target_reached": f"{reached}/{seeds}" if seeds else "",
                "p_vs_best": _number(e.p, 6), "p_holm": _number(e.p_holm, 6),
                "worse_than_best": "" if e.worse is None else str(e.worse).lower(),
                "validation_value": _number(e.validation, 6),
                "tuned": json.dumps(e.params, sort_keys=True), "lr_only": str(e.lr_only).lower(),
                "reason": e.reason, "caveats": " | ".join(e.caveats), "fedhet": ";".join(sorted(e.builds)),
                "failed_trials": e.failed_trials,
            })  # fmt: skip
    return rows


def _order(entry: Entry) -> tuple:
    return (entry.rank is None, entry.rank or 0, entry.status != "ok")


def write_csv(board: Leaderboard, path: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns(board.score), lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(board))
    path.write_text(buffer.getvalue(), encoding="utf-8")
    return path


def scenario_lines(
    entries: list[Entry], target: float | None, alpha: float, metric: str = "accuracy"
) -> list[str]:
    """One scenario's table in markdown."""
    target_head = f"time to {target:g} (reached)" if target is not None else "time to target"
    lines = [
        f"| rank | method | test {metric} (95% CI, n seeds) | {target_head} | p vs best | p Holm | "
        "tuned (validation) |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    for e in sorted(entries, key=_order):
        if e.status != "ok":
            lines.append(f"| – | {e.method} | {e.status}: {e.reason} | | | | |")
            continue
        interval = f" ± {e.ci95:.4f}" if e.ci95 is not None else ""
        reached, seeds = e.reached
        time = (
            f"{e.time_to_target:.1f} s ({reached}/{seeds})"
            if e.time_to_target is not None
            else f"– (0/{seeds})"
        )
        marker = " **best**" if e.best else (" *worse*" if e.worse else "")
        marker += " ⚠" if e.caveats else ""
        note = " (lr only)" if e.lr_only else ""
        failed = f"; {counted(e.failed_trials, 'trial')} failed" if e.failed_trials else ""
        tuned = f"{_values(e.params)}{note} ({_number(e.validation)}){failed}"
        value = f"{e.mean:.4f}{interval} (n={len(e.scores)})"
        lines.append(
            f"| {e.rank} | {e.method}{marker} | {value} | {time} | {_p(e.p)} | {_p(e.p_holm)} | {tuned} |"
        )
    caveats = [(e.method, c) for e in sorted(entries, key=_order) for c in e.caveats]
    if caveats:
        lines += ["", *[f"- ⚠ {method}: {caveat}" for method, caveat in caveats]]
    return lines


def markdown(board: Leaderboard, header: dict) -> str:
    """The leaderboard page in markdown (``header``: what the bench was, see :func:`write`)."""
    lines = [f"# Leaderboard: suite {header['suite']}", ""]
    if header.get("description"):
        lines += [header["description"], ""]
    lines += [f"- {k}: {v}" for k, v in header["settings"].items()] + [""]
    lines += [
        f"Test {board.score.metric}: mean over seeds with its 95% Student-t interval (n seeds). "
        "p vs best: a paired t-test against the scenario's best method over the seeds both ran; "
        "p Holm: Holm-corrected within the scenario; "
        f"*worse*: Holm-corrected p < {board.alpha:g}. (lr only): the method "
        "declares no hyperparameters of its own and was tuned on the learning rate alone. ⚠: under "
        "this scenario's settings the method is provably another, simpler rule (the caveat says which).",
        "",
        "## Across scenarios",
        "",
        "| method | mean rank | wins | best or not significantly worse (Holm) | scenarios |",
        "|---|---:|---:|---:|---:|",
    ]
    for o in board.overall:
        mean_rank = f"{o.mean_rank:.2f}" if o.mean_rank is not None else "–"
        lines.append(f"| {o.method} | {mean_rank} | {o.wins} | {o.not_worse} | {o.scenarios} |")
    for name, entries in board.scenarios.items():
        description = header.get("scenarios", {}).get(name, "")
        lines += ["", f"## {name}", ""] + ([description, ""] if description else [])
        lines += scenario_lines(entries, header.get("target"), board.alpha, board.score.metric)
    return "\n".join(lines) + "\n"


def _curves(entries: list[Entry], column: str = "test_accuracy") -> dict[str, tuple[Any, Any]]:
    """Per method, the mean test score (``column``) over its seeds on a common
    simulated-time grid (each seed's last evaluation at or before each time)."""
    import numpy as np

    from fedhet.results import read_table

    series: dict[str, list[tuple[Any, Any]]] = {}
    horizon = 0.0
    for e in entries:
        for folder in e.folders.values():
            path = Path(folder) / "metrics.csv"
            if not path.is_file():
                continue
            rows = [r for r in read_table(path) if r.get(column) not in ("", None)]
            if rows:
                t = np.array([float(r["sim_time"]) for r in rows])
                series.setdefault(e.method, []).append((t, np.array([float(r[column]) for r in rows])))
                horizon = max(horizon, float(t[-1]))
    grid = np.linspace(0.0, horizon or 1.0, 200)
    out = {}
    for method, runs in series.items():
        values = []
        for t, acc in runs:
            index = np.searchsorted(t, grid, side="right") - 1
            values.append(np.where(index >= 0, acc[np.clip(index, 0, None)], np.nan))
        with np.errstate(all="ignore"):
            out[method] = (grid, np.nanmean(np.vstack(values), axis=0) if values else grid * np.nan)
    return out


def figures(board: Leaderboard, out: Path) -> list[Path]:
    """The score against simulated time per scenario, and the rank heat-map, as PNGs."""
    from fedhet.studies.plots import _pyplot

    plt = _pyplot()
    return [_curves_figure(plt, board, out / "leaderboard-curves.png"),
            _ranks_figure(plt, board, out / "leaderboard-ranks.png")]  # fmt: skip


def _curves_figure(plt, board: Leaderboard, path: Path) -> Path:
    """Each scenario's mean test score of every method against simulated time."""
    import warnings

    from fedhet.studies.plots import algorithm_color

    names = list(board.scenarios)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for method, (grid, mean) in _curves(board.scenarios[name], board.score.column).items():
                ax.plot(grid, mean, label=method, color=algorithm_color(method))
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(f"test {board.score.metric}")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    legend: dict[str, Any] = {}  # every method of every scenario, once
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels) or 1), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _ranks_figure(plt, board: Leaderboard, path: Path) -> Path:
    """The heat-map of every method's rank in every scenario."""
    import numpy as np

    names, methods = list(board.scenarios), [o.method for o in board.overall]
    matrix = np.full((len(methods), len(names)), np.nan)
    for j, name in enumerate(names):
        for e in board.scenarios[name]:
            if e.rank is not None:
                matrix[methods.index(e.method), j] = e.rank
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 3, 0.4 * len(methods) + 1.5))
    ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    for i in range(len(methods)):
        for j in range(len(names)):
            text = "–" if math.isnan(matrix[i, j]) else f"{int(matrix[i, j])}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white")
    ax.set_title(f"rank per scenario (1 = best mean test {board.score.metric})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def inline_html(text: str) -> str:
    """A line of the markdown page as HTML: escaped, ``**best**`` bold, ``*worse*`` in
    italics, ```code``` as code (the page shows the marks, not the asterisks)."""
    import html
    import re

    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<em>\1</em>", escaped)


def html_page(markdown_text: str, images: list[Path]) -> str:
    """The markdown page as a self-contained HTML page with the figures embedded."""
    import base64
    import html

    from fedhet.studies.report import STYLE

    body = []
    in_table = False
    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-:"):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                body.append("<table>")
                in_table = True
            body.append("<tr>" + "".join(f"<{tag}>{inline_html(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
            for image in images:
                data = base64.b64encode(image.read_bytes()).decode("ascii")
                body.append(f'<figure><img alt="{image.stem}" src="data:image/png;base64,{data}"></figure>')
        elif line.startswith("!["):
            continue  # the figures are embedded under the title
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            body.append(f"<li>{inline_html(line[2:])}</li>")
        elif line:
            body.append(f"<p>{inline_html(line)}</p>")
    if in_table:
        body.append("</table>")
    head = f"<meta charset='utf-8'><title>leaderboard</title><style>{STYLE}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>"


def write(board: Leaderboard, out: Path, header: dict, with_figures: bool = True) -> list[Path]:
    """``leaderboard.md``, ``leaderboard.csv`` and ``leaderboard.html`` (with its figures)."""
    text = markdown(board, header)
    paths = [out / "leaderboard.md", write_csv(board, out / "leaderboard.csv")]
    images = figures(board, out) if with_figures else []
    if images:
        links = (
            f"![{board.score.metric} against simulated time](leaderboard-curves.png)\n\n"
            "![ranks](leaderboard-ranks.png)\n"
        )
        text = text.replace("\n## Across scenarios", f"\n{links}\n## Across scenarios", 1)
    paths[0].write_text(text, encoding="utf-8")
    page = out / "leaderboard.html"
    page.write_text(html_page(text, images), encoding="utf-8")
    return [*paths, page, *images]
