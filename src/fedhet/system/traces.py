"""Availability traces: when each client is online, from a file, wrapping any system model.

Trace file format (plain text, UTF-8): one line per client, client 0 first. A line lists
the intervals during which the client is online, in simulated seconds, as ``start-end``
pairs separated by spaces (``0-120.5 300-450``); ``*`` means always online and an empty
line (or ``-``) never. Lines starting with ``#`` are comments, except a header
``# period: P``: the trace then repeats every P seconds (default: the latest interval end).

A client takes part in a round if it is online when the round starts (on fedhet's virtual
clock); a present client can still be a straggler of the wrapped model. For the unbiased
rules (FedStale's 1/p_i) the participation probability of client i is the share of the
period it is online.

``fedhet trace FEDSCALE.pkl --out trace.txt`` converts FedScale's pickled
``client_behave_trace`` dict ({client: {"active": [...], "inactive": [...], "finish_time":
..., ...}}: the times the client comes online and goes offline) into this format.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet.checks import path_option
from fedhet.errors import ConfigError, DataError, read_fedscale_dict, read_user_text
from fedhet.registry import register
from fedhet.system.base import SystemContext, SystemModel
from fedhet.system.participation import PresenceWrapper
from fedhet.system.types import Workload


@dataclass
class AvailabilityTrace:
    """Per client, its online intervals [start, end); the trace repeats every ``period``."""

    intervals: list[list[tuple[float, float]]]
    period: float

    def online(self, client: int, time: float) -> bool:
        t = time % self.period if self.period > 0 else time
        return any(start <= t < end for start, end in self.intervals[client])

    def share(self, client: int) -> float:
        """The share of the period the client is online."""
        if self.period <= 0:
            return 0.0
        covered = sum(
            min(end, self.period) - start for start, end in self.intervals[client] if start < self.period
        )
        return min(1.0, covered / self.period)

    def to_text(self) -> str:
        lines = [f"# period: {self.period!r}"]
        for spans in self.intervals:
            lines.append(" ".join(f"{a!r}-{b!r}" for a, b in spans) or "-")
        return "\n".join(lines) + "\n"


def _spans(line: str, where: str) -> list[tuple[float, float]]:
    """One client's line: its online intervals ``start-end`` in order ("" or "-": none);
    refused in one line naming ``where`` (file:line) when malformed or overlapping."""
    spans = []
    for item in line.split() if line not in ("", "-") else []:
        start, sep, end = item.partition("-")
        try:
            a, b = float(start), float(end)
        except ValueError:
            raise DataError(f"{where}: {item!r} is not an interval start-end") from None
        if not sep or not (np.isfinite(a) and np.isfinite(b)) or a < 0 or b <= a:
            raise DataError(f"{where}: {item!r} is not an interval with 0 <= start < end")
        spans.append((a, b))
    spans = sorted(spans)
    for (a0, b0), (a1, b1) in zip(spans, spans[1:], strict=False):
        if a1 < b0:
            raise DataError(
                f"{where}: intervals {a0:g}-{b0:g} and {a1:g}-{b1:g} overlap (the share of "
                "time online would count twice)"
            )
    return spans


def read_trace(
    path: str | Path, num_clients: int, key: str = "system.availability_trace"
) -> AvailabilityTrace:
    """Parse a trace file; one-line errors name the file and line, and a missing file the
    configuration ``key`` that named it."""
    path = Path(path)
    text = read_user_text(path, f"availability trace ({key})")
    period = None
    always: list[int] = []
    rows: list = []
    lines: list = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#"):
            if line[1:].strip().startswith("period:"):
                try:
                    period = float(line.split(":", 1)[1])
                except ValueError:
                    raise DataError(f"{path}:{number}: period is not a number") from None
                if not period > 0 or not np.isfinite(period):
                    raise DataError(f"{path}:{number}: period must be a positive number")
            continue
        if line == "*":
            always.append(len(rows))
        rows.append(_spans(line if line != "*" else "", f"{path}:{number}"))
        lines.append(number)
    if len(rows) != num_clients:
        raise DataError(f"{path}: {len(rows)} clients in the trace, the run has {num_clients}")
    ends = [b for spans in rows for _, b in spans]
    if period is not None:
        for spans, number in zip(rows, lines, strict=True):
            if spans and spans[-1][1] > period:
                a, b = spans[-1]
                raise DataError(f"{path}:{number}: interval {a:g}-{b:g} passes the period {period:g}")
    period = period or (max(ends) if ends else 1.0)
    for client in always:
        rows[client] = [(0.0, period)]
    return AvailabilityTrace(rows, period)


def from_fedscale(path: str | Path) -> AvailabilityTrace:
    """FedScale's pickled ``client_behave_trace``: per client the times it becomes active
    and inactive (seconds) and its ``finish_time`` (taken as the period, the longest one)."""
    path = Path(path)
    data = read_fedscale_dict(path, "trace (client_behave_trace)")
    rows, finish = [], []
    for key in sorted(data, key=lambda k: (str(type(k)), str(k))):
        entry = data[key]
        try:
            active, inactive = list(entry["active"]), list(entry["inactive"])
            times = [float(t) for t in active + inactive]
        except (TypeError, KeyError, ValueError):
            raise DataError(f"{path}: client {key!r} lacks active/inactive lists of times") from None
        if not all(np.isfinite(t) and t >= 0 for t in times):
            raise DataError(f"{path}: client {key!r}: an active/inactive time that is negative or not finite")
        given = entry.get("finish_time", max(inactive, default=0.0)) if isinstance(entry, dict) else None
        try:
            end = float(given)  # type: ignore[arg-type]  # None raises TypeError: the message below
        except (TypeError, ValueError):
            raise DataError(f"{path}: client {key!r}: finish_time = {given!r} is not a number") from None
        if not (np.isfinite(end) and end > 0):
            raise DataError(f"{path}: client {key!r}: finish_time = {given!r} must be a positive finite time")
        finish.append(end)
        rows.append(
            [(float(a), float(b)) for a, b in zip(active, inactive, strict=False) if float(b) > float(a)]
        )
    period = max(finish)
    return AvailabilityTrace([_merged(spans, period) for spans in rows], period)


def _merged(spans: list[tuple[float, float]], period: float) -> list[tuple[float, float]]:
    """Intervals clipped to [0, period) and merged where they overlap or touch: what
    :func:`read_trace` accepts."""
    out: list[tuple[float, float]] = []
    for a, b in sorted((a, min(b, period)) for a, b in spans if a < period):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@dataclass
class TraceOptions:
    """``availability_trace``: the trace file (format above)."""

    availability_trace: str = path_option()

    def validate(self) -> None:
        if not self.availability_trace:
            raise ConfigError("system.availability = 'trace' needs system.availability_trace (a trace file)")


@register("availability", "trace")
class TraceAvailability(PresenceWrapper):
    """Wraps a system model: client i takes part in a round only if the trace has it online
    when the round starts; participation_prob_i = its share of online time."""

    Options = TraceOptions

    @classmethod
    def build(cls, options: TraceOptions, ctx: SystemContext) -> SystemModel:
        return cls(ctx.wrapped, read_trace(options.availability_trace, ctx.num_clients))

    def __init__(self, base: SystemModel, trace: AvailabilityTrace):
        super().__init__(base)
        if len(trace.intervals) != base.num_clients:
            raise ConfigError(f"availability trace: {len(trace.intervals)} clients for {base.num_clients}")
        self.trace = trace
        self.participation_prob = np.array([trace.share(c) for c in range(base.num_clients)])
        self.name = f"{base.name}+trace"

    def present(self, work: Workload, rng) -> np.ndarray:
        return np.array([self.trace.online(c, work.start_time) for c in range(self.num_clients)])
