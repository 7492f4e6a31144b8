"""Where a run's tensors live: ``run.device = "auto" | "cpu" | "cuda" | "cuda:N"``.

``"auto"`` (the default) takes the first GPU torch sees, else the CPU. On a GPU the working
model, the dataset's tensors, the client batches, the global model, evaluation and the
aggregators' sums live on the device; what grows with the population stays on the host
(the server's memory of every client's last update: :class:`~fedhet.algorithms.memory.ClientMemory`,
in RAM or on disk). A run on the CPU is the same, bit for bit, whatever this module says.

On CUDA, :func:`make_deterministic` asks torch for deterministic kernels (cuDNN's
deterministic convolutions, no cuDNN benchmark, cuBLAS's fixed workspace); the ops that have
no deterministic CUDA kernel are listed in :data:`NON_DETERMINISTIC_CUDA` and warn rather
than stop (``torch.use_deterministic_algorithms(True, warn_only=True)``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from fedhet.errors import ConfigError

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

# The ops fedhet uses whose CUDA kernels torch documents as non-deterministic (warned, not
# stopped, under warn_only): index_add_/scatter_add_ in the backward of advanced indexing with
# requires_grad inputs (not used on a training batch: examples are indexed without a graph).
NON_DETERMINISTIC_CUDA = ("index_add_ (backward of indexing a tensor that requires grad)",)


def check_device(value: object) -> str:
    """``run.device``'s value, checked: one line naming the problem otherwise."""
    if not isinstance(value, str) or not DEVICE_PATTERN.match(value):
        raise ConfigError(f'run.device = {value!r}: expected "auto", "cpu", "cuda" or "cuda:N"')
    if value.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"run.device = {value!r}: torch sees no GPU here (torch {torch.__version__}, "
                'torch.cuda.is_available() is False); use "cpu" or "auto"'
            )
        index = int(value.split(":")[1]) if ":" in value else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"run.device = {value!r}: torch sees {torch.cuda.device_count()} GPU(s) (cuda:0 .. "
                f"cuda:{torch.cuda.device_count() - 1})"
            )
    return value


def resolve_device(value: str, workers: object = 1) -> torch.device:
    """The torch device of ``run.device``: ``"auto"`` is ``cuda:0`` when torch sees a GPU and
    the clients run in this process (``run.workers = 1``), else the CPU; ``"cuda"`` is
    ``cuda:0``."""
    if value == "auto":
        gpu = torch.cuda.is_available() and workers == 1
        return torch.device("cuda:0") if gpu else torch.device("cpu")
    if value == "cuda":
        return torch.device("cuda:0")
    return torch.device(value)


def make_deterministic(device: torch.device) -> None:
    """Deterministic kernels on a CUDA device (same run, same numbers, where torch allows);
    nothing on the CPU, whose kernels already are."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's reproducible mode
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products as on the CPU, not tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def device_name(device: torch.device) -> str:
    """What the summary says: ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU (itself when it is already there: no copy)."""
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


_serving: torch.device | None = None  # the device of the run this process serves (None: the CPU)


@contextmanager
def serving_on(device: torch.device) -> Iterator[None]:
    """While a run on ``device`` goes on in this process: the server's hooks called through
    :func:`server_side` create their tensors there."""
    global _serving
    before = _serving
    _serving = device if device.type != "cpu" else None
    try:
        yield
    finally:
        _serving = before


def server_side() -> AbstractContextManager:
    """The context a server hook of the run (``init_state``, ``plan``, ``aggregate``, a
    streaming aggregator's ``add``/``result``, a server optimizer's step) runs in: tensors it
    creates without naming a device (``torch.zeros(n)``) go to the run's device, so that a
    rule written for the CPU runs unchanged on a GPU. Nothing on the CPU. The client's
    training never runs under it (the default-device mode costs every torch call a little)."""
    return torch.device(_serving) if _serving is not None else nullcontext()
