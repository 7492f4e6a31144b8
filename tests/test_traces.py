"""Availability traces: a client takes part only while its trace has it online; its
participation probability is its share of online time; FedScale's pickles convert."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

from fedhet.config import from_dict
from fedhet.engine.loop import RunLoop
from fedhet.errors import DataError
from fedhet.system.traces import read_trace

TRACE = """# period: 10
0-5
*
-
2-4 6-8
"""


def test_a_trace_file_says_who_is_online_and_for_what_share(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TRACE)
    trace = read_trace(path, 4)
    assert [trace.online(c, 1.0) for c in range(4)] == [True, True, False, False]
    assert [trace.online(c, 13.0) for c in range(4)] == [True, True, False, True]  # repeats every 10 s
    assert [trace.share(c) for c in range(4)] == [0.5, 1.0, 0.0, 0.4]


@pytest.mark.parametrize(
    "text, words",
    [
        ("0-5\nx\n", "'x' is not an interval"),
        ("5-2\n*\n", "0 <= start < end"),
        ("0-5\n", "1 clients in the trace"),
        ("0-10 5-20\n*\n", r":1: intervals 0-10 and 5-20 overlap"),  # p_i would count twice
        ("# period: 10\n0-5 8-12\n*\n", r":2: interval 8-12 passes the period 10"),
    ],
)
def test_a_malformed_trace_is_one_line_naming_file_and_line(tmp_path, text, words):
    path = tmp_path / "t.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=words):
        read_trace(path, 2)


def test_a_run_uses_only_online_clients_and_fedstale_gets_their_shares(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TRACE)
    config = from_dict({
        "run": {"name": "t", "rounds": 12, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
        "model": {"name": "mlp", "hidden": [8]},
        "system": {"model": "full", "deadline": 1.0, "availability": "trace",
                   "availability_trace": str(path)},
        "algorithm": {"name": "u-fedavg"},
    })  # fmt: skip
    result = RunLoop(config, tmp_path / "r").run()
    # rounds start at t = 0, 1, ..., 11: online clients per the trace (period 10)
    expected = [sum(1 for spans in ([(0, 5)], [(0, 10)], [], [(2, 4), (6, 8)])
                    if any(a <= t % 10 < b for a, b in spans)) for t in range(12)]  # fmt: skip
    assert [r["participants"] for r in result.metrics] == expected
    import json

    known = json.loads((tmp_path / "r" / "participation.json").read_text())["known_prob"]
    np.testing.assert_allclose(known, [0.5, 1.0, 0.0, 0.4])


def test_fedscale_traces_convert(tmp_path):
    data = {
        0: {"active": [0, 100], "inactive": [50, 150], "finish_time": 200, "duration": 200},
        1: {"active": [10], "inactive": [200], "finish_time": 200, "duration": 200},
    }
    pkl = tmp_path / "behave.pkl"
    pkl.write_bytes(pickle.dumps(data))
    out = tmp_path / "trace.txt"
    done = subprocess.run([sys.executable, "-m", "fedhet", "trace", str(pkl), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    trace = read_trace(out, 2)
    assert trace.period == 200 and trace.intervals[0] == [(0.0, 50.0), (100.0, 150.0)]
    assert trace.share(0) == 0.5 and trace.share(1) == pytest.approx(0.95)
    pkl.write_bytes(b"not a pickle")
    bad = subprocess.run([sys.executable, "-m", "fedhet", "trace", str(pkl), "--out", str(out)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "not a pickled FedScale trace" in bad.stderr
