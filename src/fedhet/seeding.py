"""One seed per run, split into independent named random streams.

Changing how one part of a run consumes randomness (say, the system model) must not
reshuffle another part (say, the data split). Each stream is a NumPy ``Generator`` built
from ``SeedSequence(seed, spawn_key=(crc32(name),))``, so streams depend only on the run
seed and their name.
"""

from __future__ import annotations

import zlib

import numpy as np

STREAMS = ("data", "system", "sampling", "training", "init")


def stream(seed: int, name: str) -> np.random.Generator:
    """The random stream called ``name`` for run seed ``seed``."""
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(key,))))


def torch_seed(seed: int, name: str = "init") -> int:
    """A 63-bit integer seed for ``torch.Generator`` derived from the named stream."""
    return int(stream(seed, name).integers(0, 2**63 - 1))
