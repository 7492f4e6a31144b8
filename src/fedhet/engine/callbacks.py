"""Run callbacks (in the manner of pfl-research's): what happens around the rounds without
being part of them. The run loop calls, in order, every callback's

- ``on_start(run)`` once the run's state is ready (fresh or resumed);
- ``on_round_end(run, row)`` with each round's metrics row once it is complete (evaluated
  when due: right after its round, or a few rounds later when the evaluation runs in a pool
  worker while the next rounds train), in round order;
- ``on_round_saved(run)`` once after every round, the rows done: ``run.state`` is the state
  after that round (the checkpoint is written here);
- ``on_budget_stop(run)`` when the next round would pass the time budget;
- ``on_end(run, summary)`` when the run stops (finished, or stopped by a fault);
- ``on_closed(run, summary)`` last, once the summary is on disk (when the run wrote one):
  what reads the finished run folder (trackers' artifacts) goes here.

Built-ins, in the order they run: ``evaluation`` (test accuracy when due, static
BatchNorm statistics, per-client evaluation; asked first which rows are complete),
``reports`` (the algorithm's and system model's JSON documents), ``metrics``
(metrics.csv, client_metrics.csv, config.toml), ``checkpoint`` (an atomic checkpoint after
every round), ``progress`` (the ``on_round`` function a caller passes).
``[run] callbacks = [{ name = "...", ... }]`` adds plug-ins of kind ``callback``
(:mod:`fedhet.registry`) after them.
"""

from __future__ import annotations

from collections.abc import Callable

from fedhet.engine.state import to_checkpoint
from fedhet.registry import NoOptions, register


class Callback:
    """Base: every hook does nothing."""

    name = "base"
    Options: type = NoOptions

    @classmethod
    def build(cls, options, ctx=None) -> Callback:
        return cls()

    def on_start(self, run) -> None:
        pass

    def on_round_end(self, run, row: dict) -> None:
        pass

    def on_round_saved(self, run) -> None:
        pass

    def on_budget_stop(self, run) -> None:
        pass

    def on_end(self, run, summary: dict) -> None:
        pass

    def on_closed(self, run, summary: dict) -> None:
        pass


@register("callback")
class Evaluation(Callback):
    """Test loss and accuracy every ``run.eval_every`` rounds and at the last; with
    ``run.client_eval`` each client's held-out examples too.

    The run loop asks it first, after each round (:meth:`after_round`), which rows are
    complete. Where the pool evaluates elsewhere (worker processes), round ``t``'s model is
    evaluated while the next rounds train: its row, and the rows after it, complete when the
    result arrives (at the latest when the next evaluation is due, one at a time, or when the
    run stops). The run's state keeps the model under evaluation (``RunState.evaluating``:
    its round, parameters and buffers), so a resume evaluates it from the checkpoint: none
    is lost or done twice. Static BatchNorm statistics are recomputed here first, since the
    next round trains with them."""

    name = "evaluation"

    def __init__(self) -> None:
        self.current: tuple[dict, object] | None = None  # (row, the pool's handle)
        self.waiting: list[dict] = []  # rows after it, complete but held to keep the order

    def after_round(self, run, row: dict) -> list[dict]:
        """The rows complete after ``row``'s round, in round order."""
        ready = self._collect(run, block=False)
        round_number = int(row["round"])
        if not run.evaluator.due(round_number):
            if self.current is None:
                return [*ready, row]
            self.waiting.append(row)
            return ready
        ready += self._collect(run, block=True)  # one evaluation at a time
        state = run.state
        state.buffers = run.evaluator.refresh_buffers(state.params, state.buffers, round_number)
        handle = None
        if not run.config.run.client_eval:  # per-client evaluation stays in this process
            handle = run.pool.submit_evaluation(state.params, state.buffers)
        if handle is None:
            self.evaluate(run, row)
            return [*ready, row]
        self.current = (row, handle)
        state.evaluating = {
            "round": round_number,
            "params": state.params.detach().clone(),
            "buffers": state.buffers.detach().clone(),
        }
        return ready

    def wait(self, run) -> list[dict]:
        """Every row held back, complete once the evaluation under way has finished."""
        return self._collect(run, block=True)

    def _collect(self, run, block: bool) -> list[dict]:
        if self.current is None:
            return []
        row, handle = self.current
        if not block and not handle.done():
            return []
        row["test_loss"], row["test_accuracy"] = handle.result()
        done, self.waiting, self.current = [row, *self.waiting], [], None
        run.state.evaluating = None
        return done

    def finish_interrupted(self, run) -> None:
        """A resumed run that stopped while a round's model was being evaluated: evaluate
        that model (kept in the checkpoint) now."""
        state = run.state
        if not state.evaluating:
            return
        pending = state.evaluating
        row = next(r for r in state.metrics if int(r["round"]) == pending["round"])
        row["test_loss"], row["test_accuracy"] = run.evaluator(pending["params"], pending["buffers"])
        state.evaluating = None

    def on_budget_stop(self, run) -> None:
        last = run.state.metrics[-1] if run.state.metrics else None
        if last is not None and last.get("test_accuracy") is None:
            self.evaluate(run, last)
            with run.run_dir.writing(run.state.round):
                run.run_dir.write_metrics(run.state.metrics)

    @staticmethod
    def evaluate(run, row: dict) -> None:
        """Evaluate the run's current model into ``row``, here and now."""
        state, world, evaluator = run.state, run.world, run.evaluator
        state.buffers = evaluator.refresh_buffers(state.params, state.buffers, int(row["round"]))
        row["test_loss"], row["test_accuracy"] = evaluator(state.params, state.buffers)
        if run.config.run.client_eval:
            for entry in evaluator.clients(
                state.params, state.buffers, world.dataset.x_train, world.train_labels, world.client_holdout
            ):
                state.client_metrics.append({"round": row["round"], **entry})
            with run.run_dir.writing(state.round):
                run.run_dir.write_client_metrics(state.client_metrics)


@register("callback")
class Reports(Callback):
    """The system model's and the algorithm's documents, ``<name>.json`` in the run folder."""

    name = "reports"

    def write(self, run) -> None:
        reports = {**run.world.system.reports(), **run.world.algorithm.reports(run.state.algorithm)}
        with run.run_dir.writing(run.state.round):
            for name, document in reports.items():
                run.run_dir.write_json(f"{name}.json", document)

    def on_start(self, run) -> None:
        self.write(run)

    def on_end(self, run, summary: dict) -> None:
        self.write(run)


@register("callback")
class Metrics(Callback):
    """config.toml and metrics.csv (one row per round, appended as rounds finish)."""

    name = "metrics"

    def on_start(self, run) -> None:
        if run.state.round:  # a resume: the file's rows must agree with the checkpoint's
            run.run_dir.check_resumed_rows(run.state.metrics)
        with run.run_dir.writing(run.state.round):
            run.run_dir.write_config(run.config.to_toml())
            run.run_dir.write_metrics(run.state.metrics)
            if run.state.client_metrics:
                run.run_dir.write_client_metrics(run.state.client_metrics)

    def on_round_end(self, run, row: dict) -> None:
        with run.run_dir.writing(run.state.round - 1):
            run.run_dir.append_metrics(row)


@register("callback")
class Checkpoint(Callback):
    """An atomic checkpoint after every round (and at the budget stop): an interrupted run
    resumes from its last finished round and ends with the metrics of an uninterrupted one."""

    name = "checkpoint"

    def save(self, run, rounds_done: int) -> None:
        run.state.clients = run.pool.states
        with run.run_dir.writing(rounds_done):
            run.run_dir.save_checkpoint(to_checkpoint(run.state, run.config.to_dict()))

    def on_round_saved(self, run) -> None:
        self.save(run, run.state.round - 1)

    def on_budget_stop(self, run) -> None:
        self.save(run, run.state.round)


class Progress(Callback):
    """Calls a function with each round's row (the command line's progress display)."""

    name = "progress"

    def __init__(self, on_round: Callable[[dict], None]):
        self.on_round = on_round

    def on_round_end(self, run, row: dict) -> None:
        self.on_round(row)


BUILT_IN = (Evaluation, Reports, Metrics, Checkpoint)
