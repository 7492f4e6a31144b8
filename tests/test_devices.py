"""Device profiles: per-client compute speed and upload/download bandwidth from a file;
uploads and downloads priced per client; a slow-upload client that compresses its update
meets a deadline it misses uncompressed; FedScale's device capacities convert; a bad file is
refused in one line naming the file and line."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedhet.config import from_dict
from fedhet.engine.loop import RunLoop
from fedhet.errors import DataError
from fedhet.system.devices import from_fedscale, read_device_profiles
from fedhet.system.types import Workload
from fedhet.world import build_system

SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "devices" / "synthetic-phones.csv"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_shipped_synthetic_file_reads_and_says_it_is_synthetic():
    profiles = read_device_profiles(SHIPPED)
    assert len(profiles) == 100 and profiles.hazard is not None
    assert SHIPPED.read_text().startswith("# SYNTHETIC")
    spread = np.quantile(profiles.compute, 0.95) / np.quantile(profiles.compute, 0.05)
    assert 4 < spread < 25  # the generator's sigma 0.7: about 10x


@pytest.mark.parametrize(
    "text, message",
    [
        ("device,compute,upload\nx,1,2\n", "header lacks download"),
        ("device,compute,upload,download\nx,fast,2,3\n", ":2: compute = 'fast' is not a number"),
        ("device,compute,upload,download\nx,0,2,3\n", ":2: compute = 0: must be finite and > 0"),
        ("device,compute,upload,download\nx,1,2\n", ":2: 3 fields, the header has 4"),
        ("# only a comment\n", "no header and no devices"),
        ("device,compute,upload,download,hazard\nx,1,2,3,-1\n", ":2: hazard = -1: must be finite and >= 0"),
        # a power column misspelt (ignored, [system]'s value used), doubled, or absurd
        (
            "device,compute,upload,download,compute_wats\nx,1,2,3,4\n",
            ":1: column 'compute_wats' is not one fedhet reads; did you mean 'compute_watts'",
        ),
        (
            "device,compute,upload,download,idle_watts,idle_watts\nx,1,2,3,0.1,0.2\n",
            ":1: the header names column 'idle_watts' twice",
        ),
        (
            "device,compute,upload,download,compute_watts\nx,1,2,3,5e9\n",
            ":2: compute_watts = 5e9: a power draw of at most 1e\\+06 W",
        ),
    ],
)
def test_a_bad_profile_file_is_refused_in_one_line(tmp_path, text, message):
    path = _write(tmp_path / "d.csv", text)
    with pytest.raises(DataError, match=message) as caught:
        read_device_profiles(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def _system(tmp_path, text, assignment="in-order", num_clients=3, seed=0, **system):
    path = _write(tmp_path / "devices.csv", text)
    config = from_dict({
        "run": {"seed": seed},
        "data": {"num_clients": num_clients},
        "system": {"model": "per-step", "capability_profile": "devices", "device_profiles": str(path),
                   "device_assignment": assignment, **system},
    })  # fmt: skip
    return build_system(config, num_clients, 2)


DEVICES = "device,compute,upload,download\nfast,0.001,1000,4000\nslow,0.004,100,400\n"


def test_clients_get_their_devices_speed_and_bandwidths(tmp_path):
    """In order, cycling: clients 0, 1, 2 get fast, slow, fast. A full step of batch 10 costs
    10 x compute seconds; the round's uploads and downloads cost bytes / bandwidth."""
    system = _system(tmp_path, DEVICES)
    assert system.step_time(np.full(3, 10)) == pytest.approx([0.01, 0.04, 0.01])
    work = Workload(None, np.full(3, 10), upload_bytes=np.full(3, 500.0), download_bytes=np.full(3, 800.0))
    assert system.comm_times(work) == pytest.approx([0.5 + 0.2, 5.0 + 2.0, 0.5 + 0.2])
    out = system.sample(work, np.random.default_rng(0))
    assert out.full_time == pytest.approx([0.01 + 0.7, 0.04 + 7.0, 0.01 + 0.7])


def test_random_assignment_is_the_runs_and_draws_from_the_file(tmp_path):
    one = _system(tmp_path, DEVICES, "random", num_clients=40, seed=3)
    two = _system(tmp_path, DEVICES, "random", num_clients=40, seed=3)
    other = _system(tmp_path, DEVICES, "random", num_clients=40, seed=4)
    assert np.array_equal(one.capabilities, two.capabilities)
    assert not np.array_equal(one.capabilities, other.capabilities)
    assert set(np.round(1 / one.capabilities, 6)) == {0.001, 0.004}


def test_the_hazard_column_feeds_mid_round_dropout(tmp_path):
    text = "device,compute,upload,download,hazard\na,0.001,1e9,1e9,0\nb,0.001,1e9,1e9,2.0\n"
    system = _system(tmp_path, text, num_clients=2, dropout="hazard", deadline=1.0)
    marginals = system.marginals(Workload(1.0, np.full(2, 10)))
    assert marginals.participation_prob == pytest.approx([1.0, np.exp(-2.0 * 0.01)])


def test_a_slow_uploader_that_compresses_meets_a_deadline_it_misses_uncompressed(tmp_path):
    """Client 1's upload is 100x slower than client 0's. Uncompressed (4 bytes per
    element) its update takes longer than the deadline and drop-stragglers drops it; int8
    (1 byte per element) brings it under the deadline and both clients deliver."""
    path = _write(
        tmp_path / "d.csv", "device,compute,upload,download\nquick,1e-4,4e6,1e9\nslow-up,1e-4,4e4,1e9\n"
    )
    document = {
        "run": {"name": "c", "rounds": 2, "threads": 1, "seed": 1},
        "data": {"dataset": "digits", "num_clients": 2, "fraction": 0.3},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"batch_size": 8},
        "system": {"model": "per-step", "capability_profile": "devices", "device_profiles": str(path),
                   "device_assignment": "in-order", "deadline": 0.1},
        "algorithm": {"name": "drop"},
    }  # fmt: skip
    # the update: 64*16 + 16 + 16*10 + 10 = 1210 elements: as float32, 4840 bytes take
    # 0.121 s at 4e4 B/s (past the 0.1 s deadline); as int8, 1214 bytes take 0.03 s
    plain = RunLoop(from_dict(document), tmp_path / "plain").run()
    document["train"]["postprocess"] = [{"name": "compress", "method": "int8"}]
    compressed = RunLoop(from_dict(document), tmp_path / "int8").run()
    assert [r["participants"] for r in plain.metrics] == [1, 1]
    assert [r["participants"] for r in compressed.metrics] == [2, 2]


def test_fedscale_device_capacities_convert(tmp_path):
    """computation: ms per sample (a step costs three, FedScale's augmentation factor);
    communication: kbit/s, or dl_kbps / ul_kbps where given."""
    source = tmp_path / "device_info.pkl"
    capacities = {
        1: {"computation": 20.0, "communication": 800.0},
        2: {"computation": 50.0, "communication": 1.0, "dl_kbps": 8000.0, "ul_kbps": 400.0},
    }
    source.write_bytes(pickle.dumps(capacities))
    profiles = from_fedscale(source)
    assert profiles.compute == pytest.approx([0.06, 0.15])
    assert profiles.upload == pytest.approx([100e3, 50e3])
    assert profiles.download == pytest.approx([100e3, 1e6])
    out = tmp_path / "devices.csv"
    command = [sys.executable, "-m", "fedhet", "devices", str(source), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2 devices" in done.stdout
    assert read_device_profiles(out).compute == pytest.approx([0.06, 0.15])
    source.write_bytes(b"not a pickle")
    bad = subprocess.run(command, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a pickled FedScale device-capacity file" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_devices_need_a_file_and_a_model_that_uses_them():
    from fedhet.config import ConfigError

    with pytest.raises(ConfigError, match="needs system.device_profiles"):
        from_dict({"system": {"model": "per-step", "capability_profile": "devices"}})
    with pytest.raises(ConfigError, match="set capability_profile = 'devices'"):
        from_dict({"system": {"model": "per-step", "device_profiles": "d.csv"}})
    with pytest.raises(ConfigError, match="measured times are this host's"):
        from_dict(
            {"system": {"model": "measured", "capability_profile": "devices", "device_profiles": "d.csv"}}
        )
