"""Device profiles: per-client compute speed, upload and download bandwidth (and optionally a
failure hazard) from a file, as FedScale draws clients' devices from measured capacities.

File format (CSV, UTF-8; lines starting with ``#`` are comments): a header naming the
columns, then one device per line::

    device,compute,upload,download,hazard
    phone-low,0.0031,120000,900000,0.002
    phone-mid,0.0012,450000,3000000,0.001

- ``device``: a name (any text without commas);
- ``compute``: seconds per training example (its forward and backward pass) on this device,
  for the model the run trains; the models with a time law scale it by their
  ``time_per_sample_step`` / ``time_per_sample_layer`` (1 = the file's seconds as they are);
- ``upload``, ``download``: bytes per second;
- ``hazard`` (optional column): failures per second of work, read by ``[system] dropout =
  "hazard"`` when no ``dropout_hazards`` are given;
- ``compute_watts``, ``upload_watts``, ``idle_watts`` (optional columns): the device's power
  draw while training, while communicating and while waiting for the round to close; a
  missing column takes ``[system]``'s value of the same name (:mod:`fedhet.system.energy`).

Every client gets one device: ``device_assignment = "random"`` draws them with replacement
from the file (the run's setup stream: a population of devices in the file's proportions),
``"in-order"`` gives client i line i (cycling when there are fewer lines than clients).

``fedhet devices FEDSCALE.pkl --out devices.csv`` converts FedScale's pickled device
capacity dict ({client: {"computation": ms per sample, "communication": kbit/s, and
optionally "dl_kbps", "ul_kbps"}}) into this format: compute = ms / 1000 times 3 (FedScale
charges a step three times its per-sample inference time, its ``augmentation_factor``),
bandwidths = kbit/s * 125 bytes.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedhet.errors import ConfigError, DataError, read_fedscale_dict, read_user_text

DEVICE_ASSIGNMENTS = ("random", "in-order")
COLUMNS = ("device", "compute", "upload", "download")
POWER_COLUMNS = ("compute_watts", "upload_watts", "idle_watts")  # optional: watts per device
FEDSCALE_STEP_FACTOR = 3.0  # FedScale's augmentation_factor: a training step costs 3 inferences


@dataclass(frozen=True)
class DeviceProfiles:
    """Devices, one entry per line of a profile file (or per client once assigned)."""

    names: tuple[str, ...]
    compute: np.ndarray  # seconds per training example
    upload: np.ndarray  # bytes per second
    download: np.ndarray  # bytes per second
    hazard: np.ndarray | None = None  # failures per second of work
    power: dict[str, np.ndarray] = field(default_factory=dict)  # POWER_COLUMNS the file gives

    def __len__(self) -> int:
        return len(self.names)

    def take(self, rows: np.ndarray) -> DeviceProfiles:
        """The devices at ``rows`` (one per client)."""
        rows = np.asarray(rows, dtype=int)
        return DeviceProfiles(
            tuple(self.names[r] for r in rows),
            self.compute[rows],
            self.upload[rows],
            self.download[rows],
            None if self.hazard is None else self.hazard[rows],
            {column: watts[rows] for column, watts in self.power.items()},
        )

    def assign(self, num_clients: int, assignment: str, rng: np.random.Generator) -> DeviceProfiles:
        """One device per client: drawn with replacement (``random``) or line i for client
        i, cycling (``in-order``)."""
        if assignment == "in-order":
            return self.take(np.arange(num_clients) % len(self))
        if assignment == "random":
            return self.take(rng.integers(0, len(self), size=num_clients))
        raise ConfigError(
            f"system.device_assignment = {assignment!r}: unknown (known: {', '.join(DEVICE_ASSIGNMENTS)})"
        )

    def to_text(self, comment: str = "") -> str:
        out = io.StringIO()
        for line in comment.splitlines():
            out.write(f"# {line}\n")
        extra = {"hazard": self.hazard} if self.hazard is not None else {}
        extra.update(self.power)
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*COLUMNS, *extra])
        for i, name in enumerate(self.names):
            _check_writable(name)
            numbers = [self.compute[i], self.upload[i], self.download[i], *(v[i] for v in extra.values())]
            writer.writerow([name, *(f"{v:.6g}" for v in numbers)])
        return out.getvalue()


def _check_writable(name: str) -> None:
    """A device name the file format reads back as written: one line, not a comment, not
    blank (a name with a comma is quoted)."""
    problem = (
        "has a line break" if "\n" in name or "\r" in name
        else "starts with '#', which the file reads as a comment" if name.lstrip().startswith("#")
        else "is blank" if not name.strip()
        else ""
    )  # fmt: skip
    if problem:
        raise DataError(f"device {name!r}: its name {problem}; a device-profile file cannot hold it")


def read_device_profiles(path: str | Path) -> DeviceProfiles:
    """Parse a device-profile file; a bad file is refused in one line naming the file and
    line."""
    path = Path(path)
    text = read_user_text(path, "device profiles (system.device_profiles)")
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    lines = [(n, line) for n, line in lines if not line.lstrip().startswith("#")]
    if not lines:
        raise DataError(f"{path}: no header and no devices")
    number, header_line = lines[0]
    header = [h.strip() for h in next(csv.reader([header_line]))]
    _check_header(path, number, header)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise DataError(
            f"{path}:{number}: the header lacks {', '.join(missing)} "
            f"(columns: {', '.join(COLUMNS)}[, hazard, {', '.join(POWER_COLUMNS)}])"
        )
    numeric = [*COLUMNS[1:], *(c for c in ("hazard", *POWER_COLUMNS) if c in header)]
    names: list[str] = []
    values: list[list[float]] = []
    for number, line in lines[1:]:
        row = [v.strip() for v in next(csv.reader([line]))]
        if len(row) != len(header):
            raise DataError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
        record = dict(zip(header, row, strict=True))
        names.append(record["device"])
        values.append([_device_number(path, number, column, record[column]) for column in numeric])
    if not values:
        raise DataError(f"{path}: a header and no devices")
    table = dict(zip(numeric, np.array(values, dtype=float).T, strict=True))
    power = {column: table[column] for column in POWER_COLUMNS if column in table}
    return DeviceProfiles(
        tuple(names), table["compute"], table["upload"], table["download"], table.get("hazard"), power
    )


def _check_header(path: Path, line: int, header: list[str]) -> None:
    """A column named twice, or a name one letter or two from a column fedhet reads (a
    misspelt power column would be ignored and ``[system]``'s value used), is one line."""
    import difflib

    doubled = sorted({name for name in header if header.count(name) > 1})
    if doubled:
        raise DataError(f"{path}:{line}: the header names column {doubled[0]!r} twice")
    known = [*COLUMNS, "hazard", *POWER_COLUMNS]
    for name in header:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if name not in known and close:
            raise DataError(
                f"{path}:{line}: column {name!r} is not one fedhet reads; did you mean {close[0]!r}?"
            )


def _device_number(path: Path, line: int, column: str, text: str) -> float:
    """One numeric cell of a device-profile file: finite, > 0 (>= 0 for a hazard or a power
    draw; a power draw at most :data:`~fedhet.system.energy.MAX_WATTS`), else one line
    naming the file, line and column."""
    from fedhet.system.energy import MAX_WATTS

    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{path}:{line}: {column} = {text!r} is not a number") from None
    positive = column in COLUMNS
    if not np.isfinite(value) or value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise DataError(f"{path}:{line}: {column} = {text}: must be finite and {need}")
    if column in POWER_COLUMNS and value > MAX_WATTS:
        raise DataError(f"{path}:{line}: {column} = {text}: a power draw of at most {MAX_WATTS:g} W (watts)")
    return value


def from_fedscale(path: str | Path) -> DeviceProfiles:
    """FedScale's pickled device capacities ({client: {"computation": ms per sample,
    "communication": kbit/s[, "dl_kbps", "ul_kbps"]}}) as device profiles."""
    path = Path(path)
    data = read_fedscale_dict(path, "device-capacity file")
    names, compute, upload, download = [], [], [], []
    for key in sorted(data, key=lambda k: (str(type(k)), str(k))):
        entry = data[key]
        try:
            ms = float(entry["computation"])
            both = float(entry["communication"])
            down = float(entry.get("dl_kbps", both))
            up = float(entry.get("ul_kbps", both))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise DataError(f"{path}: client {key!r} lacks numeric computation and communication") from None
        if not all(np.isfinite(v) and v > 0 for v in (ms, up, down)):
            raise DataError(f"{path}: client {key!r}: computation and bandwidths must be positive and finite")
        names.append(str(key))
        compute.append(ms / 1000.0 * FEDSCALE_STEP_FACTOR)
        upload.append(up * 125.0)
        download.append(down * 125.0)
    return DeviceProfiles(tuple(names), np.array(compute), np.array(upload), np.array(download))


def per_client(value, num_clients: int) -> np.ndarray:
    """A scalar or a per-client array as an array over clients (0 = free)."""
    return np.broadcast_to(np.asarray(value, dtype=float), (num_clients,)).copy()


def communication_seconds(
    comm_time: float | np.ndarray, upload_bandwidth: np.ndarray, download_bandwidth: np.ndarray, work
) -> np.ndarray:
    """Per client, seconds of communication in a round: ``comm_time`` plus the upload of
    ``work.upload_bytes`` at its upload bandwidth and the download of
    ``work.download_bytes`` at its download bandwidth (bytes per second; 0 = that leg is
    free, as is a leg whose bytes the workload does not give)."""
    comm = per_client(comm_time, len(upload_bandwidth))  # a scalar, or one per client
    if work is None:
        return comm
    for size, rate in ((work.upload_bytes, upload_bandwidth), (work.download_bytes, download_bandwidth)):
        if size is not None and rate.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                comm = comm + np.where(rate > 0, np.asarray(size, float) / np.where(rate > 0, rate, 1.0), 0.0)
    return comm
