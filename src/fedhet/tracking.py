"""Run tracking in the tools researchers already use, as run callbacks
(``run.track = ["mlflow", "tensorboard"]``, or ``run.callbacks = [{ name = "mlflow" }]``).

- ``mlflow``: one MLflow run per fedhet run in the tracking store of its ``uri`` option
  (``run.track = [{ name = "mlflow", uri = "..." }]``; default: a SQLite store
  ``mlruns.db`` in the run folder, or in the folder of the grid, ``[compare]`` or study the
  run belongs to, never the current directory; its artifacts in ``mlartifacts/`` beside
  it): the flattened
  configuration as parameters, every metrics row as metrics at step = round (the simulated
  time is the ``sim_time`` metric), the summary's numbers, and the run's ``config.toml``,
  ``summary.json`` and HTML report as artifacts. The runs of a grid or a ``[compare]`` are
  nested under one parent run named after it. A resumed fedhet run continues the same
  MLflow run (its id is kept in the run folder, ``.mlflow-run``).
- ``tensorboard``: event files in ``<run folder>/tensorboard``, two TensorBoard runs with
  the same tags (the metrics.csv columns): ``round`` (step = round; each point's wall time is
  the real time it was written) and ``sim_time`` (step = simulated milliseconds, TensorBoard's
  steps being integers; each point's wall time is its simulated time, so TensorBoard's
  "relative" axis reads simulated seconds there).

Tracking never stops training: a tracker that fails (an unreachable server, a full disk, a
missing package) writes one warning line and is switched off for the rest of the run. The
libraries are optional extras (``pip install 'fedhet[track]'``), imported only when used.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.engine.callbacks import Callback
from fedhet.errors import ConfigError
from fedhet.registry import register

log = logging.getLogger("fedhet")

STORE = "mlruns.db"  # the default store
RUN_ID_FILE = ".mlflow-run"
PARENT_FILE = ".mlflow-parent"
TENSORBOARD_FOLDER = "tensorboard"


class Tracker(Callback):
    """A callback whose failures are one warning line: the tracker stops, the run goes on.
    ``package``: the package it imports (``run.track`` refuses it in one line when missing)."""

    enabled = True
    package: str | None = None

    def _safely(self, state, method, *args) -> None:
        if not self.enabled:
            return
        try:
            method(state, *args)
        except Exception as exc:  # any failure of the tracking library or its store
            self.enabled = False
            log.warning(
                "%s: %s tracking failed (%s: %s); the run goes on without it",
                self.context.config.run.name,
                self.name,
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
            )

    def on_start(self, state) -> None:
        self._safely(state, self.start)

    def on_round_end(self, state, row: dict) -> None:
        self._safely(state, self.round_end, row)

    def on_closed(self, state, summary: dict) -> None:
        self._safely(state, self.close, summary)

    def start(self, state) -> None:
        raise NotImplementedError

    def round_end(self, state, row: dict) -> None:
        raise NotImplementedError

    def close(self, state, summary: dict) -> None:
        raise NotImplementedError


def numbers(row: dict, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The finite numeric values of a metrics row or summary."""
    out = {}
    for key, value in row.items():
        if key in skip or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": "0.1"}`` (lists and tables of plug-ins as
    JSON), as MLflow parameters."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


@dataclass
class MLflowOptions:
    """``uri``: the tracking store (default ``""``: ``mlruns.db`` in the run's folder, or its
    group's, artifacts beside it in ``mlartifacts/``); ``experiment``: the MLflow experiment
    the runs go to."""

    uri: str = ""
    experiment: str = "fedhet"

    def validate(self) -> None:
        if self.uri and not self.uri.strip():
            raise ConfigError(
                f"mlflow tracker: uri = {self.uri!r}: expected a tracking URI, e.g. sqlite:///mlruns.db"
            )
        if not self.experiment.strip():
            raise ConfigError("mlflow tracker: experiment = '': expected an MLflow experiment name")


def default_store(folder: Path, group: str | None) -> str:
    """The MLflow store of a run whose tracker names none: ``mlruns.db`` in its group's
    folder (a grid's, a ``[compare]``'s or a study's runs share one store) or its own."""
    home = folder.parent if group else folder
    return f"sqlite:///{(home / STORE).resolve()}"


@register("callback")
class MLflowTracking(Tracker):
    """One MLflow run per fedhet run (see the module's docstring)."""

    name = "mlflow"
    package = "mlflow"
    Options = MLflowOptions

    @classmethod
    def build(cls, options: MLflowOptions, ctx=None) -> MLflowTracking:
        return cls(options.uri, options.experiment)

    def __init__(self, uri: str, experiment: str = "fedhet"):
        self.uri, self.experiment = uri, experiment
        self.client: Any = None  # mlflow.MlflowClient, once the run starts
        self.run_id: str | None = None
        self.parent_id: str | None = None

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):  # artifacts beside the database, not in the cwd
            location = (Path(self.uri[len("sqlite:///") :]).resolve().parent / "mlartifacts").as_uri()
        try:
            return self.client.create_experiment(self.experiment, artifact_location=location)
        except Exception:  # created meanwhile by a parallel cell
            return self.client.get_experiment_by_name(self.experiment).experiment_id

    def start(self, state) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # a dead server: seconds, not minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        for name in ("mlflow", "alembic"):  # their start-up lines (creating the store's tables)
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow import MlflowClient

        context = self.context
        folder = context.folder
        self.uri = self.uri or default_store(folder, context.group)
        self.client = MlflowClient(tracking_uri=self.uri)
        kept = _read_json(folder / RUN_ID_FILE)
        if state.round > 0 and kept.get("uri") == self.uri and kept.get("run_id"):
            self.run_id = kept["run_id"]  # a resume: the same MLflow run goes on
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self._experiment_id()
        tags = {"fedhet.run_folder": str(folder.resolve())}
        group = context.group
        if group:
            self.parent_id = tags["mlflow.parentRunId"] = self._parent(folder.parent, group, experiment)
        created = self.client.create_run(experiment, run_name=context.config.run.name, tags=tags)
        self.run_id = created.info.run_id
        _write_json(folder / RUN_ID_FILE, {"uri": self.uri, "run_id": self.run_id})
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in flatten(context.config.to_dict()).items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def _parent(self, group_folder: Path, group: str, experiment: str) -> str:
        """The parent run of a grid's or [compare]'s runs: created once (under a lock, as the
        cells may run in parallel processes), its id kept in the group's folder."""
        with open(group_folder / f"{PARENT_FILE}.lock", "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            kept = _read_json(group_folder / PARENT_FILE)
            if kept.get("uri") == self.uri and kept.get("run_id"):
                return kept["run_id"]
            parent = self.client.create_run(experiment, run_name=group, tags={"fedhet.group": group})
            _write_json(group_folder / PARENT_FILE, {"uri": self.uri, "run_id": parent.info.run_id})
            return parent.info.run_id

    def round_end(self, state, row: dict) -> None:
        from mlflow.entities import Metric

        step, stamp = int(row["round"]), int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, step) for k, v in numbers(row, skip=("round",)).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, state, summary: dict) -> None:
        from mlflow.entities import Metric, RunTag

        stamp, rounds = int(time.time() * 1000), int(summary.get("rounds") or 0)
        metrics = [Metric(f"summary.{k}", v, stamp, rounds) for k, v in numbers(summary).items()]
        tags = [RunTag(f"fedhet.{k}", str(summary.get(k))) for k in ("stopped_by", "finished", "algorithm")]
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
        folder = self.context.folder
        with tempfile.TemporaryDirectory(prefix="fedhet-mlflow-") as tmp:
            page = Path(tmp) / "report.html"
            from fedhet.studies.report import write_report

            written = write_report(folder, page) if (folder / "metrics.csv").exists() else []
            for path in [folder / "config.toml", folder / "summary.json", *written]:
                if path.is_file():
                    self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED" if summary.get("finished") else "KILLED")
        if self.parent_id:  # the group's run ends with its last cell (a later cell reopens nothing)
            self.client.set_terminated(self.parent_id, "FINISHED")


@register("callback")
class TensorBoardTracking(Tracker):
    """Event files in the run folder (see the module's docstring)."""

    name = "tensorboard"
    package = "tensorboard"

    def __init__(self):
        self.writers: dict = {}

    def start(self, state) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = self.context.folder / TENSORBOARD_FOLDER
        resumed = state.round > 0  # points a kill left beyond the checkpoint are dropped
        self.writers = {
            "round": SummaryWriter(str(folder / "round"), purge_step=state.round + 1 if resumed else None),
            "sim_time": SummaryWriter(
                str(folder / "sim_time"), purge_step=_milliseconds(state.sim_time) + 1 if resumed else None
            ),
        }

    def round_end(self, state, row: dict) -> None:
        sim_time = float(row.get("sim_time") or 0.0)
        steps = {"round": int(row["round"]), "sim_time": _milliseconds(sim_time)}
        walls = {"round": time.time(), "sim_time": sim_time}  # round: the real clock; sim_time: simulated
        for key, value in numbers(row, skip=("round",)).items():
            for axis, writer in self.writers.items():
                writer.add_scalar(key, value, global_step=steps[axis], walltime=walls[axis])

    def close(self, state, summary: dict) -> None:
        text = f"```\n{json.dumps(summary, indent=2, default=str)}\n```"
        self.writers["round"].add_text("summary", text, global_step=int(summary.get("rounds") or 0))
        for writer in self.writers.values():
            writer.close()


def _milliseconds(seconds: float) -> int:
    return int(round(seconds * 1000))


def _read_json(path: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        document = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(document, dict):
            return document
    return {}


def _write_json(path: Path, document: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document), encoding="utf-8")
    os.replace(tmp, path)
