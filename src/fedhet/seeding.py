"""One seed per run, split into independent named random streams.

Changing how one part of a run consumes randomness (say, the system model) must not
reshuffle another part (say, the data split). Each stream is a NumPy ``Generator`` built
from ``SeedSequence(seed, spawn_key=(crc32(name), ...))``, so a stream depends only on the
run seed, its name and, for per-round streams, the round and client: a round's clients can be
run in any order, in any process, and draw the same numbers.

- :func:`stream` (seed, name): set-up streams (data split, capabilities, initial model).
- :func:`round_stream` (seed, name, round): the system model's outcomes of one round.
- :func:`client_stream` (seed, round, client): one client's local work in one round.
"""

from __future__ import annotations

import zlib

import numpy as np

STREAMS = ("data", "system", "training", "init")


def _key(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def _generator(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def stream(seed: int, name: str) -> np.random.Generator:
    """The random stream called ``name`` for run seed ``seed``."""
    return _generator(seed, _key(name))


def round_stream(seed: int, name: str, round_index: int) -> np.random.Generator:
    """The stream ``name`` of round ``round_index`` (0-based), e.g. the system model's draws."""
    return _generator(seed, _key(name), int(round_index))


def client_stream(seed: int, round_index: int, client: int, name: str = "training") -> np.random.Generator:
    """Client ``client``'s own stream for round ``round_index``: its batches and any other
    randomness of its local work. Independent of every other client and of the order in
    which a round's clients run."""
    return _generator(seed, _key(name), int(round_index), int(client))


def torch_seed(seed: int, name: str = "init") -> int:
    """A 63-bit integer seed for ``torch.Generator`` derived from the named stream."""
    return int(stream(seed, name).integers(0, 2**63 - 1))
