"""Write examples/devices/synthetic-phones.csv: 100 SYNTHETIC device profiles (not
measurements) in fedhet's device-profile format.

Each column is drawn from a lognormal (seed 0) whose median and spread we chose to give
phone-like heterogeneity on fedhet's clock: compute 2 ms per training example (median),
about 10x between the 5th and 95th percentile device (sigma 0.7); upload 250 kB/s and
download 1.25 MB/s (medians), about 27x between those percentiles (sigma 1.0); a failure
hazard of 1e-3 per second of work (median, sigma 1.0). Replace the file with measured
profiles where you have them: `fedhet devices FEDSCALE.pkl --out devices.csv` converts
FedScale's device-capacity file.

    python examples/devices/make_synthetic.py
"""

from pathlib import Path

import numpy as np

from fedhet.system.devices import DeviceProfiles

COUNT = 100
rng = np.random.default_rng(0)
profiles = DeviceProfiles(
    names=tuple(f"synthetic-{i:03d}" for i in range(COUNT)),
    compute=0.002 * rng.lognormal(0.0, 0.7, COUNT),
    upload=250e3 * rng.lognormal(0.0, 1.0, COUNT),
    download=1.25e6 * rng.lognormal(0.0, 1.0, COUNT),
    hazard=1e-3 * rng.lognormal(0.0, 1.0, COUNT),
)
header = (
    "SYNTHETIC device profiles, not measurements: lognormal draws (seed 0) made by\n"
    "examples/devices/make_synthetic.py. compute: seconds per training example;\n"
    "upload, download: bytes per second; hazard: failures per second of work."
)
out = Path(__file__).with_name("synthetic-phones.csv")
out.write_text(profiles.to_text(header))
print(f"{out}: {COUNT} synthetic devices")
