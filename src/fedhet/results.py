"""The run directory: ``config.toml`` (resolved), ``metrics.csv`` (one row per round),
``summary.json`` and ``checkpoint.pt`` (written atomically every ``run.checkpoint_every``
seconds and when the run stops, for ``--resume``)."""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import IO, Any

import torch

from fedhet.checks import counted
from fedhet.errors import FedhetError
from fedhet.run_schema import ROUND_COLUMNS, client_metric_columns, metric_columns  # noqa: F401

METRIC_COLUMNS = tuple(n.name for n in ROUND_COLUMNS)  # metrics.csv's standard columns


def _cell(value: Any) -> str:
    """A CSV cell: blank only for "not measured" (None); NaN and infinities written as
    ``nan``, ``inf``, ``-inf`` (which ``float()`` reads back)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so that ``json.dumps`` with
    ``allow_nan=False`` writes strict JSON (no bare NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def dumps(document: Any, **kwargs) -> str:
    """Strict JSON text of ``document`` (non-finite numbers as null)."""
    return json.dumps(strict_json(document), allow_nan=False, **kwargs) + "\n"


RUN_ORDER = ".runs"  # in a folder of runs (a grid, a [compare]): the runs' names, in order
LOCK_NAME = ".lock"
REPORTS_MANIFEST = ".reports"
PLUGIN_ERROR_FILE = "plugin-error.txt"  # a plug-in's traceback when its hook failed (engine.plugin_errors)


def _same_time(old: dict, new: dict) -> bool:
    """Whether a row read from metrics.csv and a row of the run have one simulated time."""
    return old.get("sim_time") is not None and math.isclose(
        old["sim_time"], float(new["sim_time"]), rel_tol=1e-9, abs_tol=1e-9
    )


def _reason(exc: OSError) -> str:
    """An OS error in words (``No space left on device``, ``Permission denied``)."""
    return exc.strerror or str(exc)


def make_folder(path: Path, what: str) -> None:
    """Create ``path`` (and its parents) or stop with one line: a file in the way, no
    permission, a full disk."""
    if path.exists() and not path.is_dir():
        raise FedhetError(f"{path}: is a file, not a {what}; choose another --out")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FedhetError(f"{path}: cannot create the {what} ({_reason(exc)})") from None


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path`` (a ``what``); one error naming the file otherwise."""
    try:
        return path.read_bytes().decode("utf-8")
    except IsADirectoryError:
        raise FedhetError(f"{path}: is a folder, not a {what}") from None
    except OSError as exc:
        raise FedhetError(f"{path}: cannot read ({_reason(exc)})") from None
    except UnicodeDecodeError as exc:
        raise FedhetError(f"{path}: not UTF-8 text (byte {exc.start}); not a {what}") from None


def read_json_object(path: Path, what: str) -> dict:
    """A JSON object from ``path``; one error naming the file otherwise."""
    text = read_text(path, what)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FedhetError(
            f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); a truncated or damaged {what}"
        ) from None
    if not isinstance(document, dict):
        raise FedhetError(f"{path}: not a {what} (a JSON {type(document).__name__}, expected an object)")
    return document


def read_table(path: Path, required: tuple[str, ...] = ()) -> list[dict]:
    """A CSV table of numbers (blank cells as None); one error naming the file, line and
    column when the file is not such a table."""
    text = read_text(path, "fedhet table")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise FedhetError(f"{path}: not a fedhet table (no {missing[0]!r} column in its header)")
        rows = []
        for raw in reader:
            row = {}
            for key, value in raw.items():
                if key is None or value is None:
                    raise FedhetError(f"{path}: line {reader.line_num}: {len(header)} columns expected")
                try:
                    row[key] = float(value) if value != "" else None
                except ValueError:
                    raise FedhetError(
                        f"{path}: line {reader.line_num}, column {key!r}: {value[:40]!r} is not a number"
                    ) from None
            rows.append(row)
    except csv.Error as exc:
        raise FedhetError(f"{path}: line {reader.line_num}: not a CSV table ({exc})") from None
    return rows


def write_run_order(folder: Path, names: list[str]) -> None:
    """Record the order of the runs in ``folder`` (an experiment's cells, a [compare]'s
    algorithms) for the commands that list them (compare, plot, report)."""
    try:
        (folder / RUN_ORDER).write_text("\n".join(names) + "\n", encoding="utf-8")
    except OSError as exc:
        raise FedhetError(f"{folder / RUN_ORDER}: cannot write ({_reason(exc)})") from None


def run_order(folder: Path) -> list[str]:
    """The names :func:`write_run_order` recorded (empty when none or unreadable)."""
    try:
        return (folder / RUN_ORDER).read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return []


class RunLock:
    """One writer per run folder: an exclusive ``flock`` on ``<folder>/.lock`` holding the
    writer's PID. The operating system drops the lock when its process dies (kill -9
    included), so a stale lock file is simply taken over."""

    def __init__(self, path: Path):
        self.path = path
        self.handle: IO[str] | None = None

    def acquire(self) -> None:
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise FedhetError(
                    f"{self.path.parent}: in use by another fedhet run (PID {holder}); "
                    "wait for it or choose another --out"
                ) from None
            raise FedhetError(f"{self.path}: cannot lock the run folder ({_reason(exc)})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self.handle = handle

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (a run is writing the folder)."""
        if not self.path.is_file():
            return False
        try:
            with self.path.open("r") as handle:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError as exc:
                    return exc.errno in (errno.EAGAIN, errno.EACCES)
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        except OSError:
            return False
        return False


class RunDirectory:
    """Reads and writes one run's files."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._columns: tuple[str, ...] = METRIC_COLUMNS  # metrics.csv's header as last written
        self.checkpoint_round: int | None = None  # the round of the checkpoint on disk, once known

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

    def prepare(self, resume: bool, overwrite: bool) -> None:
        """Make the folder ready for a run before anything expensive happens: it must be a
        writable folder; take its lock (one writer per run folder); refuse to start over a
        run unless told to resume or overwrite; for a new start, remove the files of any
        earlier run first, so that no old summary can sit beside a new run."""
        where = self.path
        make_folder(where, "run folder")
        self._check_files()
        self._probe_writable()
        self.lock = RunLock(where / LOCK_NAME)
        self.lock.acquire()
        if self.checkpoint_path.exists() and not (resume or overwrite):
            self.lock.release()
            raise FedhetError(
                f"{where}: already holds a run; pass --resume to continue it, "
                "--overwrite to start again, or --out for another folder"
            )
        if resume and not overwrite and not self.checkpoint_path.exists():
            rows = self._rows_on_disk()
            if rows:
                self.lock.release()
                raise FedhetError(
                    f"{self.checkpoint_path}: missing, but {self.metrics_path.name} holds "
                    f"{counted(rows, 'round')}; --resume needs the checkpoint (pass --overwrite to start "
                    "again, or --out for another folder)"
                )
        if overwrite or not self.checkpoint_path.exists():
            self.clear()

    def _check_files(self) -> None:
        """Every name fedhet writes here must be a regular file if it exists (a folder or a
        device named checkpoint.pt or .lock would fail later with an OS error)."""
        names = (LOCK_NAME, "checkpoint.pt", "metrics.csv", "summary.json", "client_metrics.csv",
                 "clients.csv", "config.toml", REPORTS_MANIFEST)  # fmt: skip
        for name in names:
            path = self.path / name
            if path.exists() and not path.is_file():
                kind = "a folder" if path.is_dir() else "not a regular file"
                raise FedhetError(
                    f"{path}: is {kind} where fedhet keeps its {name} file; remove it or use another --out"
                )

    def _rows_on_disk(self) -> int:
        """Data rows of metrics.csv (0 when missing or unreadable as text)."""
        try:
            with self.metrics_path.open("rb") as fh:
                return max(0, sum(1 for line in fh if line.strip()) - 1)
        except OSError:
            return 0

    def _probe_writable(self) -> None:
        """Write and remove a small file: a read-only or full file system fails here, before
        data and model are built."""
        probe = self.path / ".write-test"
        try:
            with probe.open("wb") as fh:
                fh.write(b"\0" * 4096)
                fh.flush()
                os.fsync(fh.fileno())
            probe.unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                probe.unlink()
            raise FedhetError(f"{self.path}: cannot write in the run folder ({_reason(exc)})") from None

    def clear(self) -> None:
        """Remove an earlier run's files (summary first, so a half-removed folder never
        shows an old result)."""
        for name in ("summary.json", "checkpoint.pt", "metrics.csv", "client_metrics.csv", "clients.csv",
                     "config.toml", ".mlflow-run", PLUGIN_ERROR_FILE):  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        shutil.rmtree(self.path / "tensorboard", ignore_errors=True)  # a tracker's event files
        manifest = self.path / REPORTS_MANIFEST
        if manifest.exists():  # algorithm reports this folder's runs wrote (plan.json, ...)
            for name in manifest.read_text().split():
                with contextlib.suppress(FileNotFoundError):
                    (self.path / Path(name).name).unlink()
            manifest.unlink()

    def running(self) -> bool:
        """Whether a fedhet run is writing this folder now."""
        return RunLock(self.path / LOCK_NAME).held_elsewhere()

    def rounds_so_far(self) -> int:
        """Rows of metrics.csv on disk (a running run's progress)."""
        return self._rows_on_disk()

    def remove_summary(self) -> None:
        """A resumed run's summary (and a plug-in error's traceback) are written anew."""
        for path in (self.summary_path, self.path / PLUGIN_ERROR_FILE):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @contextlib.contextmanager
    def writing(self):
        """Turn an OS error while writing the run's files (full disk, a folder made
        read-only) into one line naming the checkpoint that stays; atomic writes leave it
        whole."""
        try:
            yield
        except OSError as exc:
            kept = self.checkpoint_round
            where = f"the checkpoint of round {kept} is kept" if kept else "no round is checkpointed yet"
            raise FedhetError(
                f"{self.path}: cannot write ({_reason(exc)}); {where}: free space or fix the folder, "
                "then --resume"
            ) from None

    def release(self) -> None:
        lock = getattr(self, "lock", None)
        if lock is not None:
            lock.release()

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
        self._columns = metric_columns(rows)
        self._write_table(self.metrics_path, self._columns, rows)

    def check_resumed_rows(self, rows: list[dict], most: int | None = None) -> list[dict]:
        """Before a resume rewrites metrics.csv from the checkpoint's ``rows``: the file's
        rows, which must be rounds 1, 2, ... agreeing with the checkpoint's as far as both
        go (more are rounds run after the last checkpoint, which the resume runs again and
        checks with :meth:`check_rerun_row`; fewer are rows still being evaluated).
        No more than ``most`` (the run's rounds). Otherwise one error, and nothing is
        rewritten: no row already on disk is lost."""
        if not self.metrics_path.exists():
            return []
        try:
            on_disk = self.read_metrics()
        except FedhetError as exc:
            raise FedhetError(
                f"{exc}; nothing rewritten: move it away to resume from the checkpoint"
            ) from None
        rounds = [r.get("round") for r in on_disk]
        if most is not None and len(on_disk) > most:
            raise FedhetError(
                f"{self.metrics_path}: holds {counted(len(on_disk), 'row')}, more than run.rounds = {most}; "
                "nothing rewritten (raise run.rounds, or move metrics.csv away to resume from the checkpoint)"
            )
        agree = rounds == [float(i) for i in range(1, len(on_disk) + 1)]
        for old, new in zip(on_disk, rows, strict=False):
            agree = agree and _same_time(old, new)
        if not agree:
            raise FedhetError(
                f"{self.metrics_path}: holds {counted(len(on_disk), 'row')} that disagree with the "
                f"checkpoint's {counted(len(rows), 'round')}; nothing rewritten (move metrics.csv away to "
                "resume from the checkpoint)"
            )
        return on_disk

    def check_rerun_row(self, old: dict, new: dict) -> None:
        """A round a resumed run ran again, whose row ``old`` was already on disk: the same
        simulated time, or one error (the file is of another run; nothing is rewritten)."""
        if not _same_time(old, new):
            raise FedhetError(
                f"{self.metrics_path}: round {int(new['round'])}'s row on disk (sim_time "
                f"{old.get('sim_time')}) disagrees with the resumed run's ({new['sim_time']}); nothing "
                "rewritten (move metrics.csv away to resume from the checkpoint)"
            )

    def append_metrics(self, row: dict, rows: list[dict] | None = None) -> None:
        """Add ``row`` to metrics.csv; a row with a column the file lacks rewrites the file
        from ``rows`` (the run's rows, up to this one) with the new column."""
        columns = self._columns
        if rows is not None and any(key not in columns for key in row):
            upto = [r for r in rows if r["round"] <= row["round"]]
            self.write_metrics(upto if upto and upto[-1] is row else [*upto, row])
            return
        with self.metrics_path.open("a", newline="") as fh:
            csv.writer(fh).writerow([_cell(row.get(c)) for c in columns])

    @property
    def client_metrics_path(self) -> Path:
        return self.path / "client_metrics.csv"

    def write_client_metrics(self, rows: list[dict]) -> None:
        """Rewrite client_metrics.csv: round, client, examples and the task's metrics, as
        the rows hold them (a classification's loss and accuracy, a regression's loss and
        rmse)."""
        self._write_table(self.client_metrics_path, client_metric_columns(rows), rows)

    def write_clients(self, rows: list[dict]) -> None:
        """Rewrite clients.csv: one row per client (its columns, in the first row's order)."""
        columns = tuple(rows[0]) if rows else ("client",)
        self._write_table(self.path / "clients.csv", columns, rows)

    def read_metrics(self) -> list[dict]:
        """metrics.csv as a list of dicts (numbers parsed, blanks as None); a file that is not
        fedhet's table (not UTF-8, no ``round`` column, a cell that is not a number) is one
        error naming the file, line and column. A header alone is an empty list."""
        return read_table(self.metrics_path, required=("round",))

    def write_summary(self, summary: dict) -> None:
        self._atomic_write("summary.json", dumps(summary, indent=2, sort_keys=True))

    def write_json(self, name: str, document: dict) -> None:
        """Write a report; its name is recorded so that a new run here can remove it."""
        manifest = self.path / REPORTS_MANIFEST
        known = manifest.read_text().split() if manifest.exists() else []
        if name not in known:
            self._atomic_write(REPORTS_MANIFEST, "\n".join([*known, name]) + "\n")
        self._atomic_write(name, dumps(document, indent=2))

    def read_summary(self) -> dict:
        """summary.json; one error naming the file when it is not a summary (unreadable,
        truncated JSON, not an object, no ``name`` key)."""
        path = self.summary_path
        document = read_json_object(path, "summary")
        if "name" not in document:
            raise FedhetError(f"{path}: not a fedhet summary (no 'name' key)")
        return document

    def save_checkpoint(self, state: dict) -> None:
        """Serialise in memory, then write a temporary file and rename it over the old
        checkpoint: a killed process or a failed write (full disk, an OSError) leaves the
        old one whole."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        tmp = self.path / ".checkpoint.pt.tmp"
        with tmp.open("wb") as fh:
            fh.write(buffer.getbuffer())
        os.replace(tmp, self.checkpoint_path)
        self.checkpoint_round = int(state.get("round", 0))

    def load_checkpoint(self, device: torch.device | str | None = None) -> dict:
        """The checkpoint, its tensors on ``device`` (the run's: a run checkpointed on a GPU
        resumes on the CPU and the other way round); as saved when None."""
        try:
            saved = torch.load(self.checkpoint_path, weights_only=False, map_location=device)
        except FileNotFoundError:
            raise FedhetError(f"{self.checkpoint_path}: no checkpoint to resume from") from None
        except Exception as exc:  # a torn or foreign file
            raise FedhetError(f"{self.checkpoint_path}: unreadable checkpoint ({exc})") from None
        if isinstance(saved, dict) and isinstance(saved.get("round"), int):
            self.checkpoint_round = saved["round"]
        return saved
