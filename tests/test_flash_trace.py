"""FLASH's state_traces.json (fedhet.system.flash_trace): a device is online while it is
locked, charging and on Wi-Fi; times count from its first message; a shorter device's trace
repeats within the longest one's span; devices FLASH never picks are left out and counted;
an unknown state is one line naming the device and line; a converted trace drives a run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedhet.config import from_dict
from fedhet.engine.loop import RunLoop
from fedhet.errors import DataError
from fedhet.system.flash_trace import from_flash
from fedhet.system.traces import read_trace


def _messages(start: str, events: list[tuple[int, str]]) -> str:
    """Lines ``time<TAB>state`` at ``start`` + seconds (all within one day, for the test)."""
    hour, minute = 8, 0
    lines = []
    for seconds, state in events:
        total = hour * 3600 + minute * 60 + seconds
        lines.append(f"{start} {total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}\t{state}")
    return "\n".join(lines) + "\n"


# Device 0: ready (locked + charging + wifi) over [100, 400) and [900, 1100); span 2000 s.
# Device 1: ready over [200, 300); span 1000 s: repeated once within the 2000 s period.
# Device 2: a line without a tab (FLASH cannot read it). Device 3: never ready.
# Device 10 sorts after 3 (numbers, not strings); ready from 0 to its end: the open interval
# at the last message (from 60 on) is not kept (FLASH's reading): ready over [0, 50) of 70 s.
DEVICES = {
    "0": _messages("2020-01-02", [(0, "screen_on"), (10, "battery_charged_on"), (20, "wifi"),
                                  (100, "screen_lock"), (400, "4G"), (900, "WIFI"), (1000, "screen_lock"),
                                  (1100, "battery_charged_off"), (1500, "87%"), (2000, "screen_off")]),
    "1": _messages("2020-01-03", [(0, "wifi"), (10, "battery_charged_on"), (200, "screen_lock"),
                                  (300, "screen_unlock"), (1000, "screen_on")]),
    "2": "2020-01-02 08:00:00 wifi\n2020-01-02 09:00:00\tscreen_lock\n",
    "3": _messages("2020-01-02", [(0, "wifi"), (500, "screen_lock")]),
    "10": _messages("2020-01-02", [(0, "wifi"), (0, "battery_charged_on"), (0, "screen_lock"),
                                   (50, "unknown"), (60, "wifi"), (70, "screen_off")]),
}  # fmt: skip


def _file(tmp_path, devices=DEVICES):
    path = tmp_path / "state_traces.json"
    path.write_text(json.dumps({k: {"guid": f"g{k}", "model": "Redmi Note 8", "messages": v}
                                for k, v in devices.items()}))  # fmt: skip
    return path


def test_ready_spans_repeat_within_the_longest_span_and_unpickable_devices_are_left_out(tmp_path):
    trace, skipped = from_flash(_file(tmp_path))
    assert skipped == 2 and trace.period == 2000.0
    assert trace.intervals[0] == [(100.0, 400.0), (900.0, 1100.0)]  # Wi-Fi back at 900: still locked
    assert trace.intervals[1] == [(200.0, 300.0), (1200.0, 1300.0)]
    assert trace.intervals[2][:3] == [(0.0, 50.0), (70.0, 120.0), (140.0, 190.0)]  # its 70 s span, repeated
    assert trace.share(0) == pytest.approx(500 / 2000) and trace.share(1) == pytest.approx(200 / 2000)
    first_two, _ = from_flash(_file(tmp_path), clients=2)
    assert first_two.intervals == trace.intervals[:2]


def test_an_unknown_state_is_one_line_naming_the_device_and_line(tmp_path):
    devices = {"0": DEVICES["0"], "7": _messages("2020-01-02", [(0, "wifi"), (5, "airplane")])}
    with pytest.raises(DataError, match=r"device '7' line 2: unknown device state 'airplane'"):
        from_flash(_file(tmp_path, devices))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="not JSON"):
        from_flash(tmp_path / "bad.json")
    with pytest.raises(DataError, match="2 readable devices, 5 needed"):
        from_flash(_file(tmp_path, {"0": DEVICES["0"], "1": DEVICES["1"]}), clients=5)


def test_the_converted_trace_drives_a_run(tmp_path):
    out = tmp_path / "trace.txt"
    done = subprocess.run([sys.executable, "-m", "fedhet", "trace", str(_file(tmp_path)), "--out", str(out),
                           "--clients", "3"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "3 clients, period 2000 s" in done.stdout and "2 devices FLASH never picks left out" in done.stdout
    trace = read_trace(out, 3)
    config = from_dict({
        "run": {"name": "t", "rounds": 12, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [8]},
        "system": {"model": "full", "deadline": 100.0, "availability": "trace",
                   "availability_trace": str(out)},
        "algorithm": {"name": "u-fedavg"},
    })  # fmt: skip
    result = RunLoop(config, tmp_path / "r").run()
    starts = [100.0 * r for r in range(12)]  # each round lasts its 100 s deadline
    expected = [sum(trace.online(c, t) for c in range(3)) for t in starts]
    assert [r["participants"] for r in result.metrics] == expected and sum(expected) > 0
