"""What commands print: per-round progress (a live bar on a terminal, plain lines
elsewhere) and the table of run summaries."""

from __future__ import annotations

import time


def progress_printer(config, label: str, every: float = 5.0):
    """A per-round callback: a live progress bar on a terminal; otherwise (CI logs, files)
    one plain line at each evaluation, at the last round, and at least every ``every``
    seconds of wall time. With a time budget, progress is simulated time spent of it."""
    from rich.console import Console

    console = Console(stderr=True)
    if console.is_terminal:
        return _live_printer(console, label, config.run.rounds, config.run.time_budget)
    return _plain_printer(console, label, config.run.rounds, config.run.time_budget, every)


def _live_printer(console, label: str, total_rounds: int, budget: float):
    """A rich progress bar: rounds (or simulated time of the budget), the last score."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn(f"[bold]{label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task(label, total=budget or total_rounds, info="")
    state: dict[str, tuple[str, float] | None] = {"acc": None}
    reader = ScoreReader()

    def on_round(row: dict) -> None:
        if not progress.live.is_started:
            progress.start()
        score = reader.read(row)
        if score is not None:
            state["acc"] = score
        acc = "" if state["acc"] is None else f" {state['acc'][0]} {state['acc'][1]:.3f}"
        done = row["sim_time"] if budget else row["round"]
        info = f"round {int(row['round'])} sim {row['sim_time']:.4g}s{acc}"
        progress.update(task, completed=done, info=info)
        if row["round"] >= total_rounds:
            progress.stop()

    on_round.tell_score = reader.tell  # type: ignore[attr-defined]
    return on_round


def _plain_printer(console, label: str, total_rounds: int, budget: float, every: float):
    """One plain line at each evaluation, the last round, and every ``every`` seconds."""
    last = {"time": time.monotonic()}
    reader = ScoreReader()

    def on_round_plain(row: dict) -> None:
        now = time.monotonic()
        score = reader.read(row)
        if not (score or row["round"] >= total_rounds or now - last["time"] >= every):
            return
        last["time"] = now
        acc = f" test_{score[0]} {score[1]:.4f}" if score else ""
        rounds = f"round {int(row['round'])}" + ("" if budget else f"/{total_rounds}")
        clock = f"sim_time {row['sim_time']:.4g}" + (f"/{budget:g}" if budget else "")
        console.print(f"{label} {rounds} {clock}{acc}", highlight=False)

    on_round_plain.tell_score = reader.tell  # type: ignore[attr-defined]
    return on_round_plain


class ScoreReader:
    """A row's score, (name, value), as the run told it (the task's score: accuracy, a
    regression's RMSE, a plug-in task's own); None in a round without evaluation. Before
    the run tells it: the row's first test column after the loss, else the loss."""

    def __init__(self) -> None:
        self.metric: str | None = None

    def tell(self, score) -> None:
        """The run's :class:`~fedhet.data.task.Score` (the progress callback's on_start)."""
        self.metric = score.metric

    def read(self, row: dict) -> tuple[str, float] | None:
        if self.metric is not None:
            value = row.get(f"test_{self.metric}")
            return None if value is None else (self.metric, value)
        tests = [
            (k.removeprefix("test_"), v) for k, v in row.items() if k.startswith("test_") and v is not None
        ]
        return next((t for t in tests if t[0] != "loss"), tests[0] if tests else None)


def summary_table(summaries: list[dict], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    targets = sorted(
        {t for s in summaries if isinstance(s.get("targets"), dict) for t in s["targets"]}, key=_as_number
    )
    from fedhet.data.task import Score

    scores = list(dict.fromkeys(Score.from_summary(s).metric for s in summaries))  # each run's task's
    short = {"accuracy": "acc"}
    columns = ["run", "algorithm", "rounds", "sim_time", "energy J"]
    for metric in scores:
        columns += [f"final {short.get(metric, metric)}", f"best {short.get(metric, metric)}"]
    columns += [f"time to {t}" for t in targets] + ["wall s"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("run", "algorithm") else "right")

    def fmt(v, spec):
        return format(v, spec) if isinstance(v, int | float) and not isinstance(v, bool) else "-"

    for s in summaries:
        table.add_row(
            str(s.get("name", "")),
            str(s.get("algorithm", "-")),
            str(s.get("rounds", "-")),
            fmt(s.get("sim_time"), ".4g"),
            fmt(s.get("energy"), ".4g"),
            *[
                fmt(s.get(f"{end}_test_{metric}"), ".4f" if metric == "accuracy" else ".4g")
                for metric in scores
                for end in ("final", "best")
            ],  # fmt: skip
            *[reached(s["targets"].get(t) if isinstance(s.get("targets"), dict) else None) for t in targets],
            fmt(s.get("wall_time"), ".1f"),
        )
    table_console().print(table)


PIPED_WIDTH = 240  # columns of a table written to a pipe or a file (rich's default there: 80)


def table_console():
    """A console for tables on standard output: the terminal's width on a terminal; on a
    pipe or in a log file wide enough that no column is cut."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=PIPED_WIDTH)


def reached(hit: dict | None) -> str:
    """``sim_time (round)`` of a target's first hit, ``-`` if never reached."""
    if not isinstance(hit, dict) or not isinstance(hit.get("sim_time"), int | float):
        return "-"
    return f"{hit['sim_time']:.4g} (r{hit.get('round', '?')})"


def _as_number(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("inf")
