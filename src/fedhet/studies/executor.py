"""The one executor of fedhet's studies: ``fedhet reproduce`` (grid cells), ``fedhet tune``
(trial workers) and ``fedhet bench`` (studies and seed runs) submit their tasks here, to
worker processes on this machine or to a Ray cluster.

Local workers end as soon as the process that started them is gone (kill -9 included), so
no orphan keeps writing into a run folder; where processes start by fork, this process
holds one torch thread from then on (a forked worker would wait forever on the parent's
OpenMP threads). A task runs with a core budget (:func:`fedhet.threads.set_core_budget`):
its share of the free cores here, one core as a Ray task. Ray is imported only for
``ray`` (``"local"`` or a cluster address); on a cluster, run folders must lie on a file
system every node sees.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fedhet.errors import FedhetError


def watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Run in each worker: end the worker as soon as the process that started it is gone
    (killed by any signal, kill -9 included), so no orphan keeps writing into a cell."""
    import threading

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(interval)

    threading.Thread(target=watch, name="fedhet-parent-watch", daemon=True).start()


def start_ray(address: str, jobs: int) -> tuple[Any, bool]:
    """Ray, connected: a local Ray of ``jobs`` CPUs (``address = "local"``) or the cluster
    at ``address``, unless this process is connected already; and whether it connected here
    (then it is the caller's to shut down). One line for a missing Ray or a failed connection."""
    try:
        import ray
    except ImportError:
        raise FedhetError("--ray needs Ray: pip install 'fedhet[flower]' (it brings ray)") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if ray.is_initialized():
        return ray, False
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address == "local":
        ray.init(num_cpus=max(1, jobs), **options)
    else:
        check_listening(address, "--ray")  # ray.init waits minutes for an address nothing serves
        check_speaks_grpc(address, "--ray")  # ... and for ever at one that never answers
        connect_ray(ray, address, options)
    return ray, True


RAY_CONNECT_TIMEOUT = 30.0  # seconds a Ray cluster has to accept this process as a driver


def connect_ray(ray: Any, address: str, options: dict) -> None:
    """``ray.init(address=...)`` within :data:`RAY_CONNECT_TIMEOUT` seconds (a port that
    accepts connections but is no Ray head makes Ray retry for ever); one line otherwise."""
    import logging

    from fedhet.studies.trials import answer_within

    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # Ray's retry notices, every 5 s
    ray_log = logging.getLogger("ray")
    level = ray_log.level
    ray_log.setLevel(logging.ERROR)  # "SIGTERM handler is not set": the call runs in a thread
    try:
        answer_within(RAY_CONNECT_TIMEOUT, lambda: ray.init(address=address, **options))
    except TimeoutError:
        raise FedhetError(
            f"--ray {address}: no Ray answered there within {RAY_CONNECT_TIMEOUT:g} s (is it the address "
            "`ray start --head` printed?)"
        ) from None
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise FedhetError(f"--ray {address}: cannot connect ({str(exc).splitlines()[0]})") from None
    finally:
        ray_log.setLevel(level)


def check_listening(address: str, flag: str, timeout: float = 5.0) -> None:
    """One line when nothing accepts a connection at ``address``'s host and port (``host:port``
    or ``ray://host:port``; other forms, such as ``auto``, are left to Ray)."""
    import socket

    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FedhetError(
            f"{flag} {address}: nothing answers there ({reason}); start the cluster (ray start --head) "
            "or give its address"
        ) from None


def _with_budget(core_budget: int | None, function: Callable, args: tuple) -> Any:
    """A task as a worker runs it: within its core budget."""
    from fedhet.threads import set_core_budget

    set_core_budget(core_budget)
    return function(*args)


class Executor:
    """``jobs`` tasks at once, in worker processes here (``ray`` None) or as Ray tasks of
    one CPU each. ``core_budget``: a local task's cores (default: the free cores shared
    between the jobs; ``0``: no cap, the task's run decides). Use as a context manager."""

    def __init__(self, jobs: int, ray: str | None = None, core_budget: int | None = None):
        self.jobs, self.ray_address, self.started_ray = max(1, jobs), ray, False
        if ray is not None:
            self.ray, self.started_ray = start_ray(ray, self.jobs)
            self.core_budget: int | None = 1
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from fedhet.threads import free_cores

        if multiprocessing.get_start_method(allow_none=False) == "fork":
            import torch

            torch.set_num_threads(1)  # a forking process must not hold OpenMP threads
        if core_budget is None:
            core_budget = max(1, free_cores() // self.jobs)  # the jobs' threads do not fight
        self.core_budget = core_budget or None
        self.pool = ProcessPoolExecutor(
            max_workers=self.jobs, initializer=watch_parent, initargs=(os.getpid(),)
        )

    @property
    def remote(self) -> bool:
        """Whether tasks run as Ray tasks (whose futures do not say when they start)."""
        return self.ray_address is not None

    def submit(self, function: Callable, *args: Any) -> Future:
        """Run ``function(*args)`` as a task; its future (a Ray task's, converted)."""
        if self.ray_address is None:
            return self.pool.submit(_with_budget, self.core_budget, function, args)
        return self.ray.remote(num_cpus=1)(_with_budget).remote(self.core_budget, function, args).future()

    def close(self) -> None:
        """Wait for running tasks, cancel queued ones; shut down a Ray this executor started."""
        if self.ray_address is None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        elif self.started_ray:
            self.ray.shutdown()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def task_error(exc: BaseException) -> BaseException:
    """The error a task raised (a Ray task wraps it in a ``RayTaskError``)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


# HTTP/2's client connection preface and an empty SETTINGS frame
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_speaks_grpc(address: str, flag: str, timeout: float = 5.0) -> None:
    """One line when the server at ``address``'s host and port does not answer an HTTP/2
    connection preface with a SETTINGS frame within ``timeout`` seconds, as a Ray head's
    GCS (a gRPC server) does (``host:port`` only; other forms are left to Ray)."""
    import socket

    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout) as link:
            link.sendall(HTTP2_PREFACE)
            answer = link.recv(9)
    except TimeoutError:
        answer, reason = b"", f"no answer within {timeout:g} s"
    except OSError as exc:
        answer, reason = b"", exc.strerror or type(exc).__name__
    else:
        reason = "it closed the connection" if not answer else "it answered, but not as a gRPC server"
    if len(answer) < 4 or answer[3] != 4:
        raise FedhetError(
            f"{flag} {address}: no Ray head answers there ({reason}); give the address that "
            "`ray start --head` printed"
        )
