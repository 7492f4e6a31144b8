"""Failure semantics, the same in every client pool.

- A **fault** is the machine's: a worker process that dies, a Flower node that is lost or
  does not answer in time. The client's update is not delivered; the round and the run go
  on (the row's ``faults`` column counts them, a warning line names each).
- A **client error** is the code's: an exception raised by a rule's or plug-in's client
  code (a hook of the algorithm, the local optimizer, a postprocessor, the model, the
  dataset). It is a bug: the run stops with one line naming the hook (the class and method
  where it was raised) and the client, round and exception, unless the configuration asks
  to treat client errors as faults (``run.on_client_error = "skip"``, what a real
  deployment wants), and the run's last checkpoint is kept.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass

from fedhet.errors import FedhetError

log = logging.getLogger("fedhet")

ON_CLIENT_ERROR = ("stop", "skip")


class ClientError(FedhetError):
    """A client's code raised: one line naming the hook, the client and the round."""


@dataclass
class Fault:
    """A client whose update was not delivered, and why (round 1-based)."""

    round: int
    client: int
    why: str


def hook_of(exc: BaseException) -> str:
    """Where ``exc`` was raised, as ``Class.method (file:line)`` of the innermost frame that
    is a method of an object (a rule's or plug-in's hook), else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    tb, found = exc.__traceback__, []
    while tb is not None:
        found.append(tb.tb_frame)
        tb = tb.tb_next
    for frame, summary in zip(reversed(found), reversed(frames), strict=False):
        owner = frame.f_locals.get("self")
        if owner is not None and not type(owner).__module__.startswith(("torch", "numpy")):
            where = f"{summary.filename.rsplit('/', 1)[-1]}:{summary.lineno}"
            return f"{type(owner).__qualname__}.{summary.name} ({where})"
    if frames:
        last = frames[-1]
        return f"{last.name} ({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
    return "unknown"


def client_error_detail(exc: BaseException, hook: str | None = None) -> str:
    """``Class.hook (file:line) raised Type: message`` for a client's exception."""
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{hook or hook_of(exc)} raised {type(exc).__name__}" + (f": {text}" if text else "")


class FaultLog:
    """A pool's record of the faults of the round under way (taken by the driver)."""

    def __init__(self) -> None:
        self.pending: list[Fault] = []

    def add(self, round_index: int, client: int, why: str) -> None:
        self.pending.append(Fault(round_index + 1, client, why))
        log.warning("round %d: client %d absent: %s", round_index + 1, client, why)

    def take(self) -> list[Fault]:
        out, self.pending = self.pending, []
        return out


def client_failed(
    pool, exc: BaseException | None, client: int, round_index: int, detail: str | None = None
) -> None:
    """Handle a client error in ``pool`` (``detail``: already described where it was raised,
    e.g. on a Flower node): a fault when ``pool.on_client_error`` is "skip", else the run
    stops with :class:`ClientError`, one line naming the hook."""
    if detail is None:
        detail = client_error_detail(exc) if exc is not None else "failed"
    if getattr(pool, "on_client_error", "stop") == "skip":
        pool.faults.add(round_index, client, f"client error: {detail}")
        return
    raise ClientError(
        f"round {round_index + 1}, client {client}: {detail} (a bug in that code; "
        'run.on_client_error = "skip" treats such clients as absent)'
    )
