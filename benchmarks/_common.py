"""What every benchmark prints first, and a way to time a source tree of fedhet in a child
process (this checkout or a past release extracted with ``git archive``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# SALF's Table II CNN setting (SALF Sec. IV-A with Fashion-MNIST for MNIST): TOML sections
# that end inside [system], so a benchmark can add system keys before its next section
TABLE2_CNN = """
[data]
dataset = "fmnist"
partition = "iid"
num_clients = 30

[model]
name = "cnn2"

[train]
lr = 0.1
batch_size = 16
local_steps = 1
momentum = 0.5
keep_momentum = true

[system]
model = "straggler-ratio"
deadline = 1.0
"""

QUIET_FLOWER = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def with_workers(config, workers: int, **run_keys):
    """``config`` with ``workers`` worker processes (the ``processes`` pool's ``run.workers``;
    one: the default pool) and other ``[run]`` keys, validated again."""
    from fedhet.config import apply_overrides, from_dict

    document = config.to_dict()
    document["run"].pop("workers", None)
    document["run"].update(run_keys)
    if workers > 1:
        document["run"].update(pool="processes", workers=workers)
    return from_dict(apply_overrides(document, []))


def machine_header(note: str = "") -> str:
    """One line: cores, load, torch's thread settings and version."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"machine: {os.cpu_count()} cores, load average {load:.2f}; torch {torch.__version__}, "
        f"intra-op threads {torch.get_num_threads()}, inter-op {torch.get_num_interop_threads()}"
        + (f"; {note}" if note else "")
    )


def release_tree(commit: str, into: Path) -> Path:
    """The ``src`` folder of ``commit`` of this repository, extracted under ``into``."""
    archive = into / f"{commit}.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / commit, filter="data")
    return into / commit / "src"


def run_in_child(src: Path, code: str, env: dict | None = None, timeout: float = 3600) -> dict:
    """Run ``code`` with ``src`` first on the import path; it prints one JSON object last."""
    child_env = {**os.environ, "PYTHONPATH": str(src), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"child process failed ({src}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scratch() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="fedhet-bench-")


def load_average() -> float:
    """The machine's one-minute load average (NaN where the OS does not tell)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def rotate(sides: dict, pairs: int = 5) -> tuple[dict[str, list[float]], float, float]:
    """Run every side once per pass, ``pairs`` passes, in an order that rotates (A B C,
    B C A, ...; two sides: A B, B A, ...), so that a neighbour's load or a slow drift touches
    every side alike. ``sides`` maps names to functions that run one short block and return
    its time (or any cost, lower is better). Returns each side's times, in pass order, and
    the machine's load average before and after."""
    before = load_average()
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(pairs):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(sides[name]())
    return times, before, load_average()


def ratio(first: list[float], second: list[float], load: tuple[float, float] = (float("nan"),) * 2) -> dict:
    """first/second per pass (same pass = neighbouring blocks): their median, min and max."""
    ratios = sorted(x / y for x, y in zip(first, second, strict=True))
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    return {
        "first": first,
        "second": second,
        "ratios": ratios,
        "median": median,
        "min": ratios[0],
        "max": ratios[-1],
        "load_before": load[0],
        "load_after": load[1],
    }


def alternate(first, second, pairs: int = 5) -> dict:
    """Time two sides in alternating short blocks (A B, B A, ...; at least 5 pairs for a
    reported figure) and compare them robustly on a noisy machine: the per-pair ratios
    first/second, their median with its min-max, both sides' times and the load average
    before and after (:func:`rotate`, :func:`ratio`)."""
    times, before, after = rotate({"first": first, "second": second}, pairs)
    return ratio(times["first"], times["second"], (before, after))


def describe_ratio(label: str, figures: dict, unit: str = "s") -> str:
    """One line: the median ratio, its min-max over the pairs, both sides' medians, the load."""
    import statistics

    return (
        f"{label}: {figures['median']:.2f}x (pairs {figures['min']:.2f}-{figures['max']:.2f}, "
        f"n={len(figures['ratios'])}); medians {statistics.median(figures['first']):.4g} vs "
        f"{statistics.median(figures['second']):.4g} {unit}; load {figures['load_before']:.2f} -> "
        f"{figures['load_after']:.2f}"
    )
