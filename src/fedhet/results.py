"""The run directory: ``config.toml`` (resolved), ``metrics.csv`` (one row per round),
``summary.json`` and ``checkpoint.pt`` (written atomically every round, for ``--resume``)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from fedhet.errors import FedhetError

METRIC_COLUMNS = (
    "round",
    "sim_time",
    "round_time",
    "deadline",
    "participants",
    "mean_depth",
    "mean_steps",
    "lr",
    "train_loss",
    "test_loss",
    "test_accuracy",
)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


class RunDirectory:
    """Reads and writes one run's files."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def _atomic_write(self, name: str, text: str) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.path / name)

    def write_config(self, toml_text: str) -> None:
        self._atomic_write("config.toml", toml_text)

    def _write_table(self, path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
        """Write a CSV table atomically (a temporary file, then a rename)."""
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(columns)
            for row in rows:
                writer.writerow([_cell(row.get(c)) for c in columns])
        os.replace(tmp, path)

    def write_metrics(self, rows: list[dict]) -> None:
        """Rewrite metrics.csv from ``rows`` (used at start and on resume)."""
        self._write_table(self.metrics_path, METRIC_COLUMNS, rows)

    def append_metrics(self, row: dict) -> None:
        with self.metrics_path.open("a", newline="") as fh:
            csv.writer(fh).writerow([_cell(row.get(c)) for c in METRIC_COLUMNS])

    @property
    def client_metrics_path(self) -> Path:
        return self.path / "client_metrics.csv"

    def write_client_metrics(self, rows: list[dict]) -> None:
        """Rewrite client_metrics.csv (round, client, examples, loss, accuracy)."""
        self._write_table(self.client_metrics_path, ("round", "client", "examples", "loss", "accuracy"), rows)

    def read_metrics(self) -> list[dict]:
        """metrics.csv as a list of dicts (numbers parsed, blanks as None)."""
        with self.metrics_path.open() as fh:
            rows = []
            for raw in csv.DictReader(fh):
                rows.append({k: (float(v) if v not in ("", None) else None) for k, v in raw.items()})
            return rows

    def write_summary(self, summary: dict) -> None:
        self._atomic_write("summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def write_json(self, name: str, document: dict) -> None:
        self._atomic_write(name, json.dumps(document, indent=2) + "\n")

    def read_summary(self) -> dict:
        return json.loads(self.summary_path.read_text())

    def save_checkpoint(self, state: dict) -> None:
        tmp = self.path / ".checkpoint.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)

    def load_checkpoint(self) -> dict:
        try:
            return torch.load(self.checkpoint_path, weights_only=False)
        except FileNotFoundError:
            raise FedhetError(f"{self.checkpoint_path}: no checkpoint to resume from") from None
        except Exception as exc:  # a torn or foreign file
            raise FedhetError(f"{self.checkpoint_path}: unreadable checkpoint ({exc})") from None
