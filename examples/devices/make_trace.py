"""Write examples/devices/synthetic-trace.txt: a SYNTHETIC availability trace (not
measurements) for 20 clients in fedhet's trace format, repeating every 3000 simulated
seconds.

Client i is online for a share f_i of each period, f_i uniform in [0.3, 0.9], as one window
that starts at a uniform offset and wraps around the period's end (then two intervals):
availability that differs by client and by time of day, the pattern FedScale's traces show,
drawn here with seed 0. Replace it with a measured trace where you have one:
`fedhet trace FEDSCALE.pkl --out trace.txt` converts FedScale's client_behave_trace.

    python examples/devices/make_trace.py
"""

from pathlib import Path

import numpy as np

from fedhet.system.traces import AvailabilityTrace

CLIENTS, PERIOD = 20, 3000.0
rng = np.random.default_rng(0)
intervals = []
for share, start in zip(rng.uniform(0.3, 0.9, CLIENTS), rng.uniform(0.0, PERIOD, CLIENTS), strict=True):
    end = start + share * PERIOD
    spans = [(round(float(start), 1), round(float(min(end, PERIOD)), 1))]
    if end > PERIOD:
        spans.insert(0, (0.0, round(float(end - PERIOD), 1)))
    intervals.append(spans)
out = Path(__file__).with_name("synthetic-trace.txt")
header = "# SYNTHETIC availability trace, not measurements: examples/devices/make_trace.py (seed 0)\n"
out.write_text(header + AvailabilityTrace(intervals, PERIOD).to_text())
print(f"{out}: {CLIENTS} clients, period {PERIOD:g} s")
