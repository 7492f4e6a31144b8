"""The run folder's schema: each number a run writes, the file it is in, what it means and
which way is better.

Everything that writes or reads these numbers takes its columns and directions from here:
``metrics.csv`` (:func:`metric_columns`), ``client_metrics.csv``
(:func:`client_metric_columns`), ``summary.json``'s numbers (:data:`SUMMARY_NUMBERS` and the
task's :func:`task_numbers`), a grid's ``cells.csv`` (:func:`cell_columns`), report tables
and grid values (:func:`report_values`), and the direction of a tune or bench objective
(:func:`higher_is_better`). A dataset's task (:class:`fedhet.data.task.Task`) brings its
metrics: ``test_<m>`` columns and ``final_test_<m>`` / ``best_test_<m>`` numbers, judged in
the direction the task declares for each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from fedhet.data.task import Classification, Regression


@dataclass(frozen=True)
class Number:
    """One number of the run folder: its ``name``, what it means, and whether a higher value
    is a better run (``None``: not a measure of a run's quality or cost)."""

    name: str
    meaning: str
    higher_is_better: bool | None = None


# metrics.csv, one row per round: these, with the task's test_<m> columns before the last
ROUND_COLUMNS = (
    Number("round", "the round, counted from 1"),
    Number("sim_time", "simulated seconds when the round ended", False),
    Number("round_time", "the round's simulated duration", False),
    Number("deadline", "the round's deadline (blank: waits for all)"),
    Number("participants", "clients whose update was aggregated", True),
    Number("skipped", "updates left out as non-finite", False),
    Number("mean_depth", "mean first layer reached by back-propagation (1: every layer)", False),
    Number("mean_steps", "mean local steps done", True),
    Number("lr", "the clients' learning rate"),
    Number("train_loss", "mean training loss of the delivered updates", False),
    Number("energy", "the clients' joules this round", False),
    Number("energy_total", "the clients' joules since the run started", False),
    Number("faults", "updates lost to a machine's fault", False),
)

# client_metrics.csv: these keys, then the task's metrics
CLIENT_KEYS = ("round", "client", "examples")

# summary.json's numbers besides the task's final_test_<m> / best_test_<m>
SUMMARY_NUMBERS = (
    Number("best_round", "the round of the best evaluation of the score", False),
    Number("rounds", "rounds run", False),
    Number("sim_time", "simulated seconds run", False),
    Number("mean_round_time", "simulated seconds per round", False),
    Number("energy", "the clients' joules, all rounds", False),
    Number("energy_in_flight", "joules of work started after the last server step (in no row)", False),
    Number("wall_time", "host seconds", False),
)

# a grid's cells.csv: after the cell's name and values, its seed, the task's numbers, these
CELL_NUMBERS = ("rounds", "sim_time")
CELL_TEXT = ("stopped_by", "caveats", "fedhet")

TASK_NUMBER = re.compile(r"(final|best)_test_([a-z][a-z0-9_]*)")


def metric_columns(rows: list[dict]) -> tuple[str, ...]:
    """metrics.csv's columns: :data:`ROUND_COLUMNS` with the task's test columns
    (``test_loss``, ``test_accuracy``; a regression's ``test_rmse``) before ``faults`` (always
    the last of them), then every column a rule or a callback added, in the order they first
    appear."""
    standard = tuple(n.name for n in ROUND_COLUMNS)
    tests: dict[str, None] = {}
    extra: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key.startswith("test_"):
                tests.setdefault(key, None)
            elif key not in standard:
                extra.setdefault(key, None)
    return standard[:-1] + tuple(tests) + standard[-1:] + tuple(extra)


def client_metric_columns(rows: list[dict]) -> tuple[str, ...]:
    """client_metrics.csv's columns: :data:`CLIENT_KEYS`, then the task's metrics as the
    rows hold them (a classification's loss and accuracy, a regression's loss and rmse)."""
    return (*CLIENT_KEYS, *dict.fromkeys(k for row in rows for k in row if k not in CLIENT_KEYS))


def task_numbers(task: Any) -> tuple[Number, ...]:
    """The summary numbers a task brings: ``final_test_<m>`` and ``best_test_<m>`` for each
    of its metrics, better in the direction the task declares."""
    return tuple(
        Number(
            f"{end}_test_{metric}",
            f"the test {metric} at the {end} evaluation",
            task.higher_is_better_for(metric),
        )
        for metric in task.metric_names()
        for end in ("final", "best")
    )


def builtin_directions() -> dict[str, bool]:
    """Each metric of the built-in tasks, and whether it grows as a model improves: what a
    number is judged by when its run's task is not known."""
    out: dict[str, bool] = {}
    for task in (Classification(), Regression()):
        for metric in task.metric_names():
            higher = task.higher_is_better_for(metric)
            out.setdefault(metric, bool(higher))
    return out


def value_range(metric: str, task: Any = None) -> tuple[float, float]:
    """The values a task metric can take: the run's ``task`` says; without one, the first
    built-in task that reports it (accuracy in [0, 1], a loss or RMSE not below 0)."""
    tasks = [task] if task is not None else [Classification(), Regression()]
    for candidate in tasks:
        if metric in candidate.metric_names():
            return candidate.value_range(metric)
    return (-math.inf, math.inf)


def higher_is_better(name: str, task: Any = None) -> bool:
    """Whether a higher value of the summary number ``name`` is a better run: the run's
    ``task`` says for its metrics (``final_test_<m>``, ``best_test_<m>``); without one, the
    built-in tasks' metrics; times, rounds, energy and anything else: lower."""
    found = TASK_NUMBER.fullmatch(name)
    if found is None:
        declared = {n.name: n.higher_is_better for n in SUMMARY_NUMBERS}
        return bool(declared.get(name))
    metric = found.group(2)
    higher = task.higher_is_better_for(metric) if task is not None else None
    return builtin_directions().get(metric, False) if higher is None else bool(higher)


def objective_direction(objective: str, task: Any = None) -> str:
    """The natural direction of a summary number used as an objective (``final_test_<m>``,
    ``best_test_<m>``, ``sim_time``, ``rounds``, ``time_to:X``): ``"maximize"`` where a
    higher value is a better run (:func:`higher_is_better`), else ``"minimize"``."""
    return "maximize" if higher_is_better(objective, task) else "minimize"


def report_values() -> tuple[str, ...]:
    """The summary numbers a report or a grid may show whatever its task: the plain ones (a
    task's ``final_test_<m>`` / ``best_test_<m>`` are checked against the cells' task)."""
    return tuple(n.name for n in SUMMARY_NUMBERS)


def cell_columns(summaries: list[dict]) -> tuple[str, ...]:
    """cells.csv's numbers for these runs' summaries: the seed; per task, its score's final
    and best value and each other metric's final value; :data:`CELL_NUMBERS`; then
    :data:`CELL_TEXT`. A classification grid's: seed, final_test_accuracy,
    best_test_accuracy, final_test_loss, rounds, sim_time, stopped_by, caveats, fedhet."""
    task_columns: dict[str, None] = {}
    for summary in summaries:
        score = (summary.get("score") or {}).get("metric", "accuracy")
        metrics = [
            m.group(2)
            for k, value in summary.items()
            if (m := TASK_NUMBER.fullmatch(k)) and m.group(1) == "final" and value is not None
        ]
        others = [m for m in dict.fromkeys(metrics) if m != score]
        for key in (f"final_test_{score}", f"best_test_{score}", *(f"final_test_{m}" for m in others)):
            task_columns.setdefault(key, None)
    if not task_columns:
        task_columns = dict.fromkeys(("final_test_accuracy", "best_test_accuracy", "final_test_loss"))
    return ("seed", *task_columns, *CELL_NUMBERS, *CELL_TEXT)
