"""FLASH's device-state trace (``state_traces.json``) as an availability trace.

FLASH (Yang et al., "Characterizing Impacts of Heterogeneity in Federated Learning upon
Large-Scale Smartphone Data", WWW 2021) ships ``data/state_traces.json``, a 1,000-device
sample of a trace of 136k smartphones. It is one JSON object keyed by device number
(``"0"``, ``"1"``, ...); each device has ``"guid"``, ``"model"`` (the phone model) and
``"messages"``: one state change per line, ``YYYY-mm-dd HH:MM:SS<TAB>state``, with states
``battery_charged_on``/``_off``, ``screen_on``/``_off``, ``screen_lock``/``_unlock``, a
network (``wifi``; ``2g``..``5g`` or ``unknown`` = not on Wi-Fi) and a battery level
(``87%``).

As in FLASH, following Google's production FL system ("Towards Federated Learning at Scale:
System Design", arXiv 1902.01046), a device is available for training while it is idle
(screen locked), charging and on Wi-Fi at once. Its online intervals are the spans during
which the three hold, in seconds from its first message; an interval still open at its last
message is not kept (FLASH's reading); overlapping intervals are merged. A device's trace
repeats with the span from its first to its last message (FLASH's ``ready``): fedhet's trace
has one period for all clients, the longest device's span, and a shorter device's intervals
are repeated to fill it (the last repetition cut at the period).

A device FLASH never picks is left out here too, and counted: one whose messages it cannot
read (a line without a time and a state, a time not in the format, a battery level that is
not a number), whose first and last messages are at the same time, or that is never
available. A state FLASH does not know stops the import with one line
naming the device and line (FLASH stops on it too).

The real file is in FLASH's repository (github.com/PKU-Chengxu/FLASH, ``data/``); fedhet
ships none. ``fedhet trace state_traces.json --out trace.txt --clients N`` converts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fedhet.errors import DataError, read_user_text
from fedhet.system.traces import AvailabilityTrace, _merged

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
NETWORKS_OFF_WIFI = ("unknown", "2g", "3g", "4g", "5g")


class _Unreadable(Exception):
    """A device's messages FLASH cannot read: the device is never available."""


@dataclass
class _DeviceState:
    """What the messages so far say: locked, on Wi-Fi, charging."""

    locked: bool = False
    wifi: bool = False
    charging: bool = False

    def apply(self, state: str, where: str) -> None:
        """One state change (lower case), as FLASH reads it."""
        flags = {
            "battery_charged_on": ("charging", True),
            "battery_charged_off": ("charging", False),
            "wifi": ("wifi", True),
            "screen_lock": ("locked", True),
            "screen_unlock": ("locked", False),
        }
        if state in flags:
            setattr(self, *flags[state])
        elif state in NETWORKS_OFF_WIFI:
            self.wifi = False
        elif state.endswith("%"):
            try:
                float(state[:-1])
            except ValueError:
                raise _Unreadable from None  # FLASH cannot read the battery level: it gives up on the device
        elif state not in ("screen_on", "screen_off"):  # the screen's light does not decide
            raise DataError(f"{where}: unknown device state {state!r}")

    @property
    def ready(self) -> bool:
        return self.locked and self.wifi and self.charging


def device_intervals(messages: str, where: str) -> tuple[list[tuple[float, float]], float]:
    """One device's online intervals (seconds from its first message) and its span, from its
    ``messages``; raises :class:`_Unreadable` where FLASH would give up on the device."""
    state, spans, opened, first, last = _DeviceState(), [], None, None, None
    for number, raw in enumerate(messages.split("\n"), start=1):
        if not raw.strip():
            continue
        parts = raw.strip().split("\t")
        if len(parts) != 2:
            raise _Unreadable
        try:
            moment = datetime.strptime(parts[0].strip(), TIME_FORMAT)
        except ValueError:
            raise _Unreadable from None
        first = first or moment
        last = moment
        seconds = (moment - first).total_seconds()
        state.apply(parts[1].strip().lower(), f"{where} line {number}")
        if state.ready and opened is None:
            opened = seconds
        elif not state.ready and opened is not None:
            spans.append((opened, seconds))
            opened = None
    span = (last - first).total_seconds() if first is not None and last is not None else 0.0
    spans = [(a, b) for a, b in spans if b > a]
    if span <= 0 or not spans:
        raise _Unreadable  # FLASH never picks a device without a span or a ready interval
    return spans, span


def _tiled(spans: list[tuple[float, float]], span: float, period: float) -> list[tuple[float, float]]:
    """A device's intervals repeated every ``span`` seconds up to ``period``."""
    out: list[tuple[float, float]] = []
    start = 0.0
    while start < period:
        out.extend((start + a, start + b) for a, b in spans)
        start += span
    return _merged(out, period)


def from_flash(path: str | Path, clients: int | None = None) -> tuple[AvailabilityTrace, int]:
    """FLASH's ``state_traces.json`` as an :class:`AvailabilityTrace` of its readable devices
    in the order of their numbers (the first ``clients`` of them, when given), and the
    number of devices left out as unreadable."""
    path = Path(path)
    try:
        data = json.loads(read_user_text(path, "FLASH state trace"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or not data:
        raise DataError(f"{path}: not a FLASH state trace (a JSON object of devices)")
    devices, skipped = [], 0
    for key in sorted(data, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k)):
        entry = data[key]
        if not isinstance(entry, dict) or not isinstance(entry.get("messages"), str):
            raise DataError(f'{path}: device {key!r} has no "messages" text')
        try:
            devices.append(device_intervals(entry["messages"], f"{path}: device {key!r}"))
        except _Unreadable:
            skipped += 1
        if clients is not None and len(devices) == clients:
            break
    if not devices or (clients is not None and len(devices) < clients):
        needed = clients or 1
        raise DataError(f"{path}: {len(devices)} readable devices, {needed} needed ({skipped} left out)")
    period = max(span for _, span in devices)
    return AvailabilityTrace([_tiled(spans, span, period) for spans, span in devices], period), skipped
