"""The server's memory of every client's last update (h_i of FedStale Algorithm 2, FedVARP's
y_i, MIFA's G_i): N x P numbers, the one piece of server state that grows with the
population.

:class:`ClientMemory` keeps the rows in RAM or in a memory-mapped file (``storage = "disk"``,
for populations whose N x P does not fit), as float32 or float16 (half the bytes; each stored
update rounded to 11 significant bits), and keeps the weighted sum sum_i q_i h_i of FedStale
eqs. (7) and (9) up to date as rows change, in float64, so that a round costs O(participants
x P) and never reads all N rows.

Checkpoints do not rewrite it whole: :meth:`persist` appends the rows changed since the last
checkpoint to a journal next to the checkpoint and returns a small reference (the journal's
length at this checkpoint); when the journal outgrows the rows themselves it is folded into
a new base file. :meth:`restore` rebuilds the memory from the base and the journal up to the
recorded length, so a run killed at any moment resumes with exactly its last checkpoint's
memory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedhet.errors import FedhetError

DTYPES = {"float32": np.float32, "float16": np.float16}
STORAGES = ("ram", "disk")
FOLDER = "client-memory"


class ClientMemory:
    """Rows h_1..h_N of P numbers, their weighted sum sum_i q_i h_i, and what changed."""

    def __init__(
        self,
        num_clients: int,
        num_params: int,
        client_weight: np.ndarray,
        dtype: str = "float32",
        storage: str = "ram",
        folder: str | Path | None = None,
    ):
        self.num_clients, self.num_params = int(num_clients), int(num_params)
        self.dtype, self.storage = dtype, storage
        self.client_weight = np.asarray(client_weight, dtype=np.float64)
        self._folder = Path(folder) if folder is not None else None
        self.generation = 0  # base-<generation>.bin + journal-<generation>.bin
        self.changed: set[int] = set()
        self.journal_bytes = 0  # the journal's length at the last checkpoint
        # on the host beside the rows, whatever device the run's tensors are on
        self.weighted_sum = torch.zeros(self.num_params, dtype=torch.float64, device="cpu")
        self._array = self._allocate()
        self.rows = torch.from_numpy(self._array)

    @property
    def folder(self) -> Path:
        """Where the files go: the run's ``client-memory`` folder (a temporary one if none)."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="fedhet-memory-"))
        return self._folder

    def _allocate(self) -> np.ndarray:
        shape = (self.num_clients, self.num_params)
        if self.storage == "ram":
            # zeroed now, page by page, rather than on each row's first write: the kernel's
            # first touch of a (huge) page zeroes it, which made the early rounds of a large
            # population 1.7x slower (benchmarks/scale.py); here it is one sequential pass
            rows = np.empty(shape, dtype=DTYPES[self.dtype])
            rows.fill(0)
            return rows
        live = self.folder / "live.bin"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # reserve the blocks now: a sparse file on a full disk would fail later, inside a
            # write to the mapping (SIGBUS), instead of here with a message
            with open(live, "wb") as fh:
                if self.nbytes:
                    os.posix_fallocate(fh.fileno(), 0, self.nbytes)
        except OSError as exc:
            raise FedhetError(
                f"{live}: cannot allocate the client memory on disk ({self.nbytes / 2**20:.0f} MiB: "
                f"{exc.strerror or exc}); free space, or use algorithm.memory_storage = 'ram'"
            ) from None
        return np.memmap(live, dtype=DTYPES[self.dtype], mode="r+", shape=shape)

    @property
    def nbytes(self) -> int:
        return self.num_clients * self.num_params * np.dtype(DTYPES[self.dtype]).itemsize

    def row(self, client: int) -> torch.Tensor:
        """h_client as float32, on the device the server works on (the rows stay on the host:
        :func:`fedhet.device.server_side`)."""
        return self.rows[client].float().to(torch.get_default_device())

    def stale_sum(self) -> torch.Tensor:
        """sum_i q_i h_i over all N clients (FedStale eqs. (7), (9)), as float32, on the
        device the server works on."""
        return self.weighted_sum.float().to(torch.get_default_device())

    def set(self, client: int, update: torch.Tensor) -> None:
        """h_client <- update (stored in this memory's dtype); the weighted sum follows."""
        old = self.rows[client].double()
        self.rows[client].copy_(update)
        self.weighted_sum.add_(self.rows[client].double() - old, alpha=float(self.client_weight[client]))
        self.changed.add(int(client))

    # -- checkpoints -------------------------------------------------------------------
    def _base(self, generation: int) -> Path:
        return self.folder / f"base-{generation}.bin"

    def _journal(self, generation: int) -> Path:
        return self.folder / f"journal-{generation}.bin"

    def persist(self) -> dict:
        """Write what changed since the last call; return the reference a checkpoint keeps."""
        self.folder.mkdir(parents=True, exist_ok=True)
        journal, size = self._journal(self.generation), self.journal_bytes
        changed = np.array(sorted(self.changed), dtype=np.int64)
        record = 8 + 8 * len(changed) + len(changed) * self.num_params * self._array.itemsize
        if size + record > self.nbytes:  # fold the journal into a new base
            self.generation += 1
            base = self._base(self.generation)
            with open(base.with_suffix(".tmp"), "wb") as out:
                for start in range(0, self.num_clients, 1024):
                    out.write(np.ascontiguousarray(self._array[start : start + 1024]).tobytes())
            os.replace(base.with_suffix(".tmp"), base)
            journal, size = self._journal(self.generation), 0
            journal.write_bytes(b"")
        elif len(changed):
            with open(journal, "r+b" if journal.exists() else "wb") as out:
                out.truncate(size)  # drop records of checkpoints that were never committed
                out.seek(size)
                out.write(np.int64(len(changed)).tobytes())
                out.write(changed.tobytes())
                out.write(np.ascontiguousarray(self._array[changed]).tobytes())
            size += record
        self.changed.clear()
        self.journal_bytes = size
        for old in range(
            max(0, self.generation - 3), self.generation - 1
        ):  # older than the last checkpoint's
            self._base(old).unlink(missing_ok=True)
            self._journal(old).unlink(missing_ok=True)
        return {
            "num_clients": self.num_clients,
            "num_params": self.num_params,
            "dtype": self.dtype,
            "storage": self.storage,
            "client_weight": self.client_weight,
            "generation": self.generation,
            "journal_bytes": size,
            "weighted_sum": self.weighted_sum.clone(),
        }

    @classmethod
    def restore(cls, reference: dict, folder: str | Path) -> ClientMemory:
        """The memory as it was when ``persist`` returned ``reference``."""
        memory = cls(
            reference["num_clients"],
            reference["num_params"],
            reference["client_weight"],
            reference["dtype"],
            reference["storage"],
            folder,
        )
        memory.generation = int(reference["generation"])
        base = Path(memory._base(memory.generation))
        itemsize = memory._array.itemsize
        if memory.generation > 0:
            _expect_bytes(base, memory._array.nbytes, "base copy of the client memory")
            with open(base, "rb") as source:
                for start in range(0, memory.num_clients, 1024):
                    block = memory._array[start : start + 1024]
                    block[...] = np.frombuffer(source.read(block.nbytes), dtype=block.dtype).reshape(
                        block.shape
                    )
        memory.journal_bytes = remaining = int(reference["journal_bytes"])
        if remaining == 0:
            memory.weighted_sum = reference["weighted_sum"].to("cpu", copy=True)
            return memory
        journal_path = Path(memory._journal(memory.generation))
        _expect_bytes(journal_path, remaining, "journal of the client memory")
        with open(journal_path, "rb") as journal:
            while remaining > 0:
                count = int(np.frombuffer(journal.read(8), dtype=np.int64)[0])
                record = 8 + 8 * count + count * memory.num_params * itemsize
                if not 0 < count <= memory.num_clients or record > remaining:
                    raise FedhetError(
                        f"{journal_path}: damaged journal of the client memory (a record of {count} "
                        "clients); the run cannot resume: start again with --overwrite"
                    )
                clients = np.frombuffer(journal.read(8 * count), dtype=np.int64)
                if clients.min() < 0 or clients.max() >= memory.num_clients:
                    raise FedhetError(
                        f"{journal_path}: damaged journal of the client memory (client "
                        f"{int(clients.max())} of {memory.num_clients}); start again with --overwrite"
                    )
                rows = np.frombuffer(
                    journal.read(count * memory.num_params * itemsize), dtype=memory._array.dtype
                )
                memory._array[clients] = rows.reshape(count, memory.num_params)
                remaining -= record
        memory.weighted_sum = reference["weighted_sum"].to("cpu", copy=True)
        return memory


def _expect_bytes(path: Path, wanted: int, what: str) -> None:
    """One error naming ``path`` when it is missing or shorter than ``wanted`` bytes."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FedhetError(
            f"{path}: missing ({what}, written by the checkpoint); the run cannot resume: start again "
            "with --overwrite"
        ) from None
    if not path.is_file() or size < wanted:
        raise FedhetError(
            f"{path}: truncated ({what}: {size} of {wanted} bytes); the run cannot resume: start again "
            "with --overwrite"
        )


def persisted(memory: ClientMemory) -> dict:
    """A memory in an algorithm's checkpointed state: it writes what changed since the last
    checkpoint into its files (the run folder's ``client-memory``) and is kept as the
    reference it returns, named with the class that reads it back."""
    kind = f"{type(memory).__module__}:{type(memory).__qualname__}"
    return {"__persisted__": kind, "reference": memory.persist()}


def restored(saved: dict, work_dir: Path | None, who: str) -> ClientMemory:
    """The memory :func:`persisted` saved, rebuilt from its files as they were then."""
    if work_dir is None:
        raise ValueError(f"{who}'s client memory is restored from its run folder")
    return ClientMemory.restore(saved["reference"], work_dir / FOLDER)
