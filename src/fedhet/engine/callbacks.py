"""Run callbacks, in the manner of pfl-research's: what happens around the rounds without
being part of them. A callback gets narrow arguments: the run's state
(:class:`~fedhet.engine.state.RunState`: round, simulated time, model, metrics rows, ...)
and a row or the summary; what is fixed for the run (configuration, folder, group,
engine) is its :class:`RunContext`, given to ``build`` and kept as ``self.context``.

The run loop calls, in order, every callback's

- ``on_start(state)`` once the run's state is ready (fresh or resumed);
- ``after_round(state, row)`` with each round's metrics row once it is evaluated (right
  after its round, or a few rounds later when the evaluation runs in a pool worker while
  the next rounds train), in round order, before the row is written (every callback's
  ``after_round`` runs before any ``on_round_end``): it may return
  ``(stop, metrics)`` (pfl's ``after_central_iteration`` shape): ``metrics``, a dict of
  numbers, become columns of the row (metrics.csv, reports, trackers), and later callbacks
  see them; ``stop = True`` ends the run after this round (``stopped_by = "callback"``, the
  summary names the callback);
- ``on_round_end(state, row)`` with the complete row once it is on disk (trackers,
  progress);
- ``on_round_saved(state)`` once after every round, the rows done (the checkpoint is
  written here when due);
- ``on_budget_stop(state)`` when the next round would pass the time budget;
- ``on_end(state, summary)`` when the run stops (finished, or stopped by a fault);
- ``on_closed(state, summary)`` last, once the summary is on disk (when the run wrote one):
  what reads the finished run folder (trackers' artifacts) goes here.

Built-ins, in the order they run: ``reports`` (the algorithm's and system model's JSON
documents), ``metrics`` (metrics.csv, client_metrics.csv, config.toml), ``checkpoint``
(an atomic checkpoint every ``run.checkpoint_every`` seconds and when the run stops);
then ``[run] callbacks = [{ name = "...", ... }]`` (plug-ins of kind ``callback``,
:mod:`fedhet.registry`), the trackers of ``run.track``, the callbacks a caller passes (a
tune's pruning), and progress. Evaluation is not a
callback: it is a service of the run loop (:class:`EvaluationService`), which completes
each row before any callback sees it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet.engine.state import to_checkpoint
from fedhet.errors import FedhetError
from fedhet.registry import NoOptions

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fedhet.engine.pool import EvaluationHandle


@dataclass(frozen=True)
class RunContext:
    """What a callback knows of its run beside the state; fixed for the run."""

    config: Any  # fedhet.config.Config
    folder: Path  # the run folder
    group: str | None = None  # the grid, [compare] or study the run belongs to
    engine: str = "embedded"  # the engine running it
    score: Any = None  # the task's score (fedhet.data.task.Score): what "better" means


class Callback:
    """Base: every hook does nothing. ``context`` is the run's :class:`RunContext`, set by
    the run loop before ``on_start``."""

    name = "base"
    Options: type = NoOptions
    context: RunContext  # set by the run loop before on_start (no class default)

    @classmethod
    def build(cls, options, ctx: RunContext | None = None) -> Callback:
        """The callback for a run: its ``Options`` (the table that lists it) and the run's
        :class:`RunContext`."""
        return cls()

    def on_start(self, state) -> None:
        """Before the first round to run (also when a run resumes); ``state`` is the
        :class:`~fedhet.engine.state.RunState`."""

    def after_round(self, state, row: dict) -> tuple[bool, dict] | None:
        """After each round's metrics row ``row`` is complete: return ``None``, or pfl's
        pair ``(stop, metrics)``: ``stop`` ends the run after this round (its summary says
        ``stopped_by = "callback"`` and names this callback), ``metrics`` become extra
        columns of this row (metrics.csv, reports, trackers and later callbacks)."""
        return None

    def on_round_end(self, state, row: dict) -> None:
        """With the complete row once it is on disk (trackers, progress)."""

    def on_round_saved(self, state) -> None:
        """Once after every round, its rows done (the built-in checkpoint is written here)."""

    def on_budget_stop(self, state) -> None:
        """When the next round would pass ``run.time_budget`` of simulated time."""

    def on_end(self, state, summary: dict) -> None:
        """When the run stops (finished, or stopped by a fault), with its ``summary``."""

    def on_closed(self, state, summary: dict) -> None:
        """Last, once the summary is on disk (when the run wrote one): what reads the
        finished run folder (trackers' artifacts) goes here."""


def callback_result(callback, result) -> tuple[bool, dict]:
    """``(stop, metrics)`` from what ``after_round`` returned (None, or pfl's pair); anything
    else is one line naming the callback."""
    label = f"run callback {getattr(callback, 'name', type(callback).__name__)!r}"
    if result is None:
        return False, {}
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool)):
        raise FedhetError(f"{label}: after_round returned {result!r:.80}; expected None or (stop, metrics)")
    stop, metrics = result
    if metrics is None:
        return stop, {}
    if not isinstance(metrics, dict):
        raise FedhetError(f"{label}: after_round's metrics must be a dict, got {type(metrics).__name__}")
    for key, value in metrics.items():
        if not isinstance(key, str) or not key or "," in key or "\n" in key:
            raise FedhetError(f"{label}: metric name {key!r} must be a non-empty string without commas")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise FedhetError(f"{label}: metric {key} = {value!r:.40}: must be a number or None")
    return stop, dict(metrics)


class EvaluationService:
    """Test loss and accuracy every ``run.eval_every`` rounds (or ``run.eval_interval``
    simulated seconds) and at the last; with
    ``run.client_eval`` each client's held-out examples too. The run loop asks it, after
    each round (:meth:`after_round`), which rows are complete.

    Where the pool evaluates elsewhere (worker processes), round ``t``'s model is evaluated
    while the next rounds train: its row, and the rows after it, complete when the result
    arrives (at the latest when the next evaluation is due, one at a time, or when the run
    stops). The evaluation handle is shaped like a ``concurrent.futures.Future``
    (``done()``, ``result()``). The run's state keeps the model under evaluation
    (``RunState.evaluating``: its round, parameters and buffers), so a resume evaluates it
    from the checkpoint: none is lost or done twice. Static BatchNorm statistics are
    recomputed here first, since the next round trains with them."""

    def __init__(self, evaluator, pool, world, run_dir, client_eval: bool) -> None:
        self.evaluator = evaluator
        self.pool = pool
        self.world = world
        self.run_dir = run_dir
        self.client_eval = client_eval
        self.current: tuple[dict, EvaluationHandle] | None = None  # (row, the pool's handle)
        self.waiting: list[dict] = []  # rows after it, complete but held to keep the order

    def after_round(self, state, row: dict) -> list[dict]:
        """The rows complete after ``row``'s round, in round order."""
        ready = self._collect(state, block=False)
        round_number = int(row["round"])
        previous = state.metrics[-2]["sim_time"] if len(state.metrics) > 1 else 0.0
        if not self.evaluator.due(round_number, float(row["sim_time"]), float(previous)):
            if self.current is None:
                return [*ready, row]
            self.waiting.append(row)
            return ready
        ready += self._collect(state, block=True)  # one evaluation at a time
        state.buffers = self.evaluator.refresh_buffers(state.params, state.buffers, round_number)
        handle = None
        if not self.client_eval:  # per-client evaluation stays in this process
            handle = self.pool.submit_evaluation(state.params, state.buffers)
        if handle is None:
            self.evaluate(state, row)
            return [*ready, row]
        self.current = (row, handle)
        state.evaluating = {
            "round": round_number,
            "params": state.params.detach().clone(),
            "buffers": state.buffers.detach().clone(),
        }
        return ready

    def wait(self, state) -> list[dict]:
        """Every row held back, complete once the evaluation under way has finished."""
        return self._collect(state, block=True)

    def _collect(self, state, block: bool) -> list[dict]:
        if self.current is None:
            return []
        row, handle = self.current
        if not block and not handle.done():
            return []
        row.update(handle.result())
        done, self.waiting, self.current = [row, *self.waiting], [], None
        state.evaluating = None
        return done

    def finish_interrupted(self, state) -> None:
        """A resumed run that stopped while a round's model was being evaluated: evaluate
        that model (kept in the checkpoint) now."""
        if not state.evaluating:
            return
        pending = state.evaluating
        row = next(r for r in state.metrics if int(r["round"]) == pending["round"])
        row.update(self.evaluator(pending["params"], pending["buffers"]))
        state.evaluating = None

    def last_row(self, state) -> dict | None:
        """At a budget stop: the last row, evaluated now if it was not (metrics.csv is
        rewritten with it), or None when it already was."""
        last = state.metrics[-1] if state.metrics else None
        if last is None or last.get("test_loss") is not None:
            return None
        self.evaluate(state, last)
        with self.run_dir.writing():
            self.run_dir.write_metrics(state.metrics)
        return last

    def evaluate(self, state, row: dict) -> None:
        """Evaluate the run's current model into ``row``, here and now."""
        evaluator, world = self.evaluator, self.world
        state.buffers = evaluator.refresh_buffers(state.params, state.buffers, int(row["round"]))
        row.update(evaluator(state.params, state.buffers))
        if self.client_eval:
            for entry in evaluator.clients(
                state.params, state.buffers, world.dataset.x_train, world.train_labels, world.client_holdout
            ):
                state.client_metrics.append({"round": row["round"], **entry})
            with self.run_dir.writing():
                self.run_dir.write_client_metrics(state.client_metrics)


class Reports(Callback):
    """The system model's and the algorithm's documents, ``<name>.json`` in the run folder."""

    name = "reports"

    def __init__(self, world, run_dir) -> None:
        self.world, self.run_dir = world, run_dir

    def write(self, state) -> None:
        from fedhet.engine.plugin_errors import guarded, plugin_label

        world = self.world
        system = guarded(plugin_label("system model", world.config.system.model), "reports", state.round,
                         world.system.reports)  # fmt: skip
        own = guarded(plugin_label("algorithm", world.config.algorithm_name), "reports", state.round,
                      world.algorithm.reporting.reports, state.algorithm)  # fmt: skip
        reports = {**system, **own}
        with self.run_dir.writing():
            for name, document in reports.items():
                self.run_dir.write_json(f"{name}.json", document)

    def on_start(self, state) -> None:
        self.write(state)

    def on_end(self, state, summary: dict) -> None:
        self.write(state)


class ClientTable(Callback):
    """``clients.csv``: one row per client, its data size, device and power draw, the
    seconds and joules it spent over the run (:mod:`fedhet.system.energy`), and the bytes it
    received and sent and the FLOPs it trained (:mod:`fedhet.engine.traffic`), written when
    the run stops."""

    name = "clients"

    def __init__(self, world, run_dir, privacy=None) -> None:
        self.world, self.run_dir, self.privacy = world, run_dir, privacy

    def on_end(self, state, summary: dict) -> None:
        world = self.world
        if world.power is None:
            return
        from fedhet.engine.traffic import traffic_columns

        rows = [{**row, **traffic_columns(state.energy, row["client"])}
                for row in world.power.table(state.energy, world.client_sizes)]  # fmt: skip
        if self.privacy is not None:  # each client's epsilon from its own participations
            for row, epsilon, taken in zip(rows, self.privacy.client_epsilons(),
                                           self.privacy.state["participations"], strict=True):  # fmt: skip
                row.update(releases=int(taken), epsilon=epsilon)
        with self.run_dir.writing():
            self.run_dir.write_clients(rows)


class Metrics(Callback):
    """config.toml and metrics.csv (one row per round, appended as rounds finish; a column
    a callback or the algorithm adds rewrites the file with it). A resumed run whose file
    runs ahead of its checkpoint (rounds after the last checkpoint, before a kill) checks
    each round it runs again against the row on disk instead of writing it twice."""

    name = "metrics"

    def __init__(self, run_dir, config_toml: str, rounds: int | None = None) -> None:
        self.run_dir, self.config_toml, self.rounds = run_dir, config_toml, rounds
        self.ahead: dict[int, dict] = {}  # round -> its row on disk, past the checkpoint

    def on_start(self, state) -> None:
        if state.round:  # a resume: the file's rows must agree with the checkpoint's
            on_disk = self.run_dir.check_resumed_rows(state.metrics, self.rounds)
            self.ahead = {int(r["round"]): r for r in on_disk[len(state.metrics) :]}
        with self.run_dir.writing():
            self.run_dir.write_config(self.config_toml)
            if not self.ahead:
                self.run_dir.write_metrics(state.metrics)
            if state.client_metrics:
                self.run_dir.write_client_metrics(state.client_metrics)

    def on_round_end(self, state, row: dict) -> None:
        old = self.ahead.pop(int(row["round"]), None)
        if old is not None:
            self.run_dir.check_rerun_row(old, row)
            return
        with self.run_dir.writing():
            self.run_dir.append_metrics(row, state.metrics)

    def on_end(self, state, summary: dict) -> None:
        if not self.ahead:
            return
        # rows on disk past where this run stopped (a resume changed a budget): the file
        # ends with the run's own rows
        log.warning("%s: rounds %d-%d of metrics.csv lie past where the resumed run stopped; dropped",
                    self.run_dir.path, min(self.ahead), max(self.ahead))  # fmt: skip
        self.ahead = {}
        with self.run_dir.writing():
            self.run_dir.write_metrics(state.metrics)


class Checkpoint(Callback):
    """An atomic checkpoint every ``run.checkpoint_every`` seconds of wall time (0: after
    every round) and whenever the run stops (its last round, a budget, a callback): a
    killed run resumes from its last checkpoint, runs the rounds since again, and ends with
    the metrics of an uninterrupted one; a run stopped by a fault keeps the last checkpoint
    before it."""

    name = "checkpoint"

    def __init__(self, run_dir, config_dict: dict, pool, algorithm, every: float = 0.0):
        self.run_dir, self.config_dict, self.pool, self.algorithm = run_dir, config_dict, pool, algorithm
        self.every = every
        self.saved_round, self.saved_at, self.saved_evaluating = 0, time.perf_counter(), False

    def on_start(self, state) -> None:
        self.saved_round, self.saved_at = state.round, time.perf_counter()
        self.saved_evaluating = state.evaluating is not None

    def save(self, state, rounds_done: int) -> None:
        state.clients = self.pool.states
        with self.run_dir.writing():
            checkpoint = to_checkpoint(state, self.config_dict, self.algorithm, self.run_dir.path)
            self.run_dir.save_checkpoint(checkpoint)
        self.saved_round, self.saved_at = state.round, time.perf_counter()
        self.saved_evaluating = state.evaluating is not None

    def unsaved(self, state) -> bool:
        """Whether the state moved on since the last checkpoint: rounds, or the evaluation
        that checkpoint held finished."""
        return self.saved_round != state.round or (self.saved_evaluating and state.evaluating is None)

    def on_round_saved(self, state) -> None:
        elapsed = time.perf_counter() - self.saved_at
        due = (
            not self.saved_round or elapsed >= self.every or state.stopped_by is not None
        )  # the first at once
        if due and self.unsaved(state):
            self.save(state, self.saved_round)

    def on_budget_stop(self, state) -> None:
        self.save(state, state.round)

    def on_end(self, state, summary: dict) -> None:
        faulted = summary.get("stopped_by") in ("non_finite", "plugin_error")
        if not faulted and self.unsaved(state):
            # the rounds since the last checkpoint; a stop for want of participants is not
            # kept in it, so that a resume with a larger run.max_empty_rounds goes on
            stopped = state.stopped_by
            state.stopped_by = None if stopped == "no_participants" else stopped
            try:
                self.save(state, self.saved_round)
            finally:
                state.stopped_by = stopped


class Progress(Callback):
    """Calls a function with each round's complete row (the command line's progress
    display); a function with a ``tell_score`` method is told the task's score first."""

    name = "progress"

    def __init__(self, on_round: Callable[[dict], None]):
        self.on_round = on_round

    def on_start(self, state) -> None:
        tell = getattr(self.on_round, "tell_score", None)
        if tell is not None and self.context.score is not None:
            tell(self.context.score)

    def on_round_end(self, state, row: dict) -> None:
        self.on_round(row)
