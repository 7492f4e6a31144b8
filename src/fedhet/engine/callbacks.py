"""Run callbacks (in the manner of pfl-research's): what happens around the rounds without
being part of them. The run loop calls, in order, every callback's

- ``on_start(run)`` once the run's state is ready (fresh or resumed);
- ``on_round_end(run, row)`` after each round, with its metrics row (a callback may fill
  it: evaluation writes the test columns before the files are written);
- ``on_budget_stop(run)`` when the next round would pass the time budget;
- ``on_end(run, summary)`` when the run stops (finished, or stopped by a fault).

Built-ins, in the order they run: ``evaluation`` (test accuracy when due, static
BatchNorm statistics, per-client evaluation), ``reports`` (the algorithm's and system
model's JSON documents), ``metrics`` (metrics.csv, client_metrics.csv, config.toml),
``checkpoint`` (an atomic checkpoint after every round), ``progress`` (the ``on_round``
function a caller passes). ``[run] callbacks = [{ name = "...", ... }]`` adds plug-ins of
kind ``callback`` (:mod:`fedhet.registry`) after them.
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

    def on_budget_stop(self, run) -> None:
        pass

    def on_end(self, run, summary: dict) -> None:
        pass


@register("callback")
class Evaluation(Callback):
    """Test loss and accuracy every ``run.eval_every`` rounds and at the last; with
    ``run.client_eval`` each client's held-out examples too."""

    name = "evaluation"

    def on_round_end(self, run, row: dict) -> None:
        if run.evaluator.due(int(row["round"])):
            self.evaluate(run, row)

    def on_budget_stop(self, run) -> None:
        last = run.state.metrics[-1] if run.state.metrics else None
        if last is not None and last.get("test_accuracy") is None:
            self.evaluate(run, last)
            with run.run_dir.writing(run.state.round):
                run.run_dir.write_metrics(run.state.metrics)

    @staticmethod
    def evaluate(run, row: dict) -> None:
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

    def on_round_end(self, run, row: dict) -> None:
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
