"""The run loop's narrow contracts: a callback gets (state, row) and may return pfl's
(stop, metrics) pair; its metrics and an algorithm's round metrics become columns of the
row (metrics.csv, the run's result, later callbacks); a stop ends the run after that
round with a summary naming the callback; a malformed answer is one line naming it."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

import pytest

from fedhet.algorithms.fedavg import FedAvg
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.errors import FedhetError

BASE = {
    "run": {"name": "contract", "seed": 1, "rounds": 4, "threads": 1, "eval_every": 2},
    "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "full"},
    "algorithm": {"name": "fedavg"},
}


class ModelNorm:
    """Adds the global model's norm to every row; stops after ``stop_at`` rounds (0: never)."""

    name = "model-norm"

    @dataclass
    class Options:
        stop_at: int = 0

    @classmethod
    def build(cls, options, ctx=None):
        callback = cls()
        callback.stop_at = options.stop_at
        return callback

    def after_round(self, state, row):
        return self.stop_at == int(row["round"]), {"model_norm": float(state.params.norm())}


class SeesNorm:
    """A later callback: it sees the columns the earlier one added."""

    name = "sees-norm"
    Options = ModelNorm.Options
    seen: list = []

    @classmethod
    def build(cls, options, ctx=None):
        return cls()

    def on_round_end(self, state, row):
        SeesNorm.seen.append(row.get("model_norm"))


class Malformed(ModelNorm):
    name = "malformed"

    def after_round(self, state, row):
        return {"model_norm": "large"}


class CountingFedAvg(FedAvg):
    """FedAvg that reports how many updates it has aggregated so far, as a metrics column."""

    name = "counting-fedavg"

    def init_state(self, setting):
        return {**super().init_state(setting), "aggregated": 0}

    def aggregate(self, params, buffers, updates, state, context, layout):
        state["aggregated"] += len(updates)
        return super().aggregate(params, buffers, updates, state, context, layout)

    def round_metrics(self, state):
        return {"aggregated_updates": state["aggregated"]}


def _config(**run):
    document = {k: dict(v) for k, v in BASE.items()}
    document["run"].update(run)
    return from_dict(document)


def _csv(path):
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_a_callbacks_metrics_become_columns_that_later_callbacks_see(tmp_path):
    SeesNorm.seen.clear()
    callbacks = [{"name": "test_run_contracts:ModelNorm"}, {"name": "test_run_contracts:SeesNorm"}]
    result = run(_config(callbacks=callbacks), tmp_path / "r")
    rows = _csv(tmp_path / "r" / "metrics.csv")
    assert [float(r["model_norm"]) for r in rows] == [m["model_norm"] for m in result.metrics]
    assert SeesNorm.seen == [m["model_norm"] for m in result.metrics] and all(v > 0 for v in SeesNorm.seen)
    assert list(rows[0])[-1] == "model_norm" and rows[-1]["test_accuracy"]  # the standard columns stay


def test_an_algorithms_round_metrics_become_a_column(tmp_path):
    document = {k: dict(v) for k, v in BASE.items()}
    document["algorithm"] = {"name": "test_run_contracts:CountingFedAvg"}
    run(from_dict(document), tmp_path / "r")
    rows = _csv(tmp_path / "r" / "metrics.csv")
    assert [int(r["aggregated_updates"]) for r in rows] == [3, 6, 9, 12]  # 3 clients a round


def test_a_callback_stop_ends_the_run_after_that_round_and_says_which(tmp_path):
    config = _config(callbacks=[{"name": "test_run_contracts:ModelNorm", "stop_at": 2}])
    result = run(config, tmp_path / "r")
    assert result.summary["rounds"] == 2 and not result.summary["finished"]
    written = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert written["stopped_by"] == "callback" and written["stopped_by_callback"] == "model-norm"
    assert len(_csv(tmp_path / "r" / "metrics.csv")) == 2


def test_a_malformed_callback_answer_is_one_line_naming_it(tmp_path):
    config = _config(callbacks=[{"name": "test_run_contracts:Malformed"}])
    with pytest.raises(FedhetError, match="run callback 'malformed': after_round returned") as err:
        run(config, tmp_path / "r")
    assert "\n" not in str(err.value)


class CountsDeliveries(FedAvg):
    """Keeps a Python object (a Counter of deliveries per client) in its server state and
    converts it in its own state_dict / load_state_dict."""

    def init_state(self, setting):
        from collections import Counter

        return {"delivered": Counter()}

    def aggregate(self, params, buffers, updates, state, context, layout):
        state["delivered"].update(u.client for u in updates)
        return super().aggregate(params, buffers, updates, state, context, layout)

    def round_metrics(self, state):
        return {"deliveries": float(sum(state["delivered"].values()))}

    def state_dict(self, state, work_dir=None):
        return {"delivered": sorted(state["delivered"].items())}

    def load_state_dict(self, saved, work_dir=None):
        from collections import Counter

        return {"delivered": Counter(dict(saved["delivered"]))}


def test_an_algorithm_checkpoints_its_server_state_through_its_own_state_dict(tmp_path):
    """The checkpoint holds what state_dict returned; a resumed run, rebuilt through
    load_state_dict, ends with the metrics of the uninterrupted one."""
    import torch

    from fedhet.engine.loop import RunLoop

    config = from_dict({**BASE, "algorithm": {"name": "test_run_contracts:CountsDeliveries"}})
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=2)
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["algorithm"]
    assert isinstance(saved["delivered"], list) and sum(n for _, n in saved["delivered"]) > 0
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert [row["deliveries"] for row in whole.metrics] == sorted(row["deliveries"] for row in whole.metrics)
