"""A pool of worker processes on this machine (``run.workers``): every core in one run.

:class:`ProcessPool` starts ``N`` worker processes once per run: fresh interpreters
(``python -c``), so a worker never inherits a parent's OpenMP thread pool (a forked one would
wait on it forever) and the caller's script is never imported again (no ``if __name__ ==
"__main__"`` needed). Each worker builds the run's clients once
(:func:`~fedhet.world.build_world` with ``client_side=True``: no system model, a worker only
trains) with one torch thread, then answers tasks until told to stop.

What travels:

- the dataset by shared memory, once per run (one copy for every worker);
- the global model by shared memory: one block of ``P + B`` float32 values that the run
  writes once per round (:meth:`ProcessPool.run`) and the workers read in place; a second
  block holds a model to evaluate, so that round ``t``'s model is evaluated while the next
  rounds train (:meth:`ProcessPool.submit_evaluation`);
- tasks, updates and the client's own state (momentum, SCAFFOLD's c_i, ...) as the existing
  message types, pickled (tensors as NumPy arrays) through a socket per worker. The
  client-state store stays here, in the pool (:attr:`ProcessPool.states`), and is
  checkpointed as with one process.

Tasks go to whichever worker is free (at most :data:`IN_FLIGHT` per worker, so a worker
never waits for its next task; none to a worker that is evaluating, so that no task of the
round waits behind an evaluation); updates come out in task order, so a streaming aggregation
adds them in the same order as one process does and the run's results are bit-identical to
``run.workers = 1`` (each task has its own random stream: :mod:`fedhet.seeding`).

A worker that dies (killed, out of memory) is replaced; the task it was running (each worker
writes the job under way into a shared slot) is a fault: that client is not delivered this
round (the ``faults`` column and a warning line), and the tasks queued behind it go to the
other workers with their own random streams. After :data:`MAX_RESTARTS` replacements the run
stops with one line; the checkpoint of the last finished round is intact and ``--resume``
continues. The workers end with the run, and on their own when the run's process is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pickle
import signal
import socket
import subprocess
import sys
import tomllib
import traceback
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import connection, resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedhet.checks import at_least, at_most, resumable
from fedhet.client import ClientStates
from fedhet.client.evaluate import shards
from fedhet.data.task import default_task
from fedhet.engine.client_errors import FaultLog, client_failed
from fedhet.engine.evaluation import test_metrics
from fedhet.engine.pool import WorkerDied
from fedhet.errors import ConfigError, FedhetError
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.registry import register

if TYPE_CHECKING:
    from fedhet.config import Config

START_TIMEOUT = 600.0  # seconds a worker may take to build the run's clients


class _Pickler(pickle.Pickler):
    """Pickles tensors as NumPy arrays: torch's own reduction serialises a storage the slow
    way (0.4 ms for a 6,000-element update), and multiprocessing's pickler would move every
    tensor into a new shared-memory segment."""

    def reducer_override(self, obj):
        if type(obj) is torch.Tensor and obj.dtype in _NUMPY_DTYPES:
            return torch.from_numpy, (obj.detach().cpu().numpy(),)
        return NotImplemented


_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int8,
                 torch.uint8, torch.bool}  # fmt: skip


def _send(conn, message) -> None:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    conn.send_bytes(buffer.getbuffer())


def _receive(conn):
    return pickle.loads(conn.recv_bytes())


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the process that started it ends."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _attach(name: str) -> SharedMemory:
    block = SharedMemory(name=name)
    # the run owns the block (it unlinks it); a worker only reads it
    with contextlib.suppress(Exception):
        resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]  # noqa: SLF001
    return block


def serve(fd: int) -> None:
    """A worker's life (the entry point of ``python -c``): read the run's configuration from
    the pipe ``fd``, build the clients, say ready, answer messages until "stop"."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle
    torch.set_num_threads(1)
    conn = connection.Connection(fd)
    blocks = []
    try:
        from fedhet.config import from_dict
        from fedhet.engine.evaluation import make_evaluator
        from fedhet.engine.pool import WorkerSide
        from fedhet.world import build_world

        _, config_toml, shared_dataset, names, sizes, status_name, index = _receive(conn)
        dataset, dataset_blocks = _attach_dataset(shared_dataset)
        blocks.extend(dataset_blocks)
        config = from_dict(tomllib.loads(config_toml))
        side = WorkerSide(build_world(config, client_side=True, dataset=dataset), config.run.seed)
        evaluator = make_evaluator(side.world)
        num_params, num_buffers = sizes
        models = []
        for name in names:
            block = _attach(name)
            blocks.append(block)
            flat = torch.frombuffer(block.buf, dtype=torch.float32, count=num_params + num_buffers)
            models.append((flat[:num_params], flat[num_params:]))
        status_block = _attach(status_name)
        blocks.append(status_block)
        running = np.ndarray((1,), np.int64, buffer=status_block.buf, offset=8 * index)  # the job under way
        _send(conn, ("ready", os.getpid()))
    except BaseException as exc:  # noqa: BLE001  (reported to the run, which stops)
        with contextlib.suppress(OSError):
            _send(conn, ("failed", -1, _describe(exc)))
        return
    _answer(conn, side, evaluator, models, running)


def _answer(conn, side, evaluator, models: list, running) -> None:
    """A worker's loop: answer each message (tasks with their clients' states, or shards of
    the test set to evaluate) until "stop" or until the run is gone."""
    from fedhet.engine.client_errors import client_error_detail

    (params, buffers), (eval_params, eval_buffers) = models
    while True:
        try:
            message = _receive(conn)
        except (EOFError, OSError):
            return  # the run is gone
        kind = message[0]
        if kind == "stop":
            return
        jobs: list[tuple[int, Any, Any]] = message[1] if kind == "tasks" else [(message[1], *message[2:])]
        for job, first, second in jobs:  # a task and its client's state, or a shard's start and stop
            running[0] = job  # read by the run if this process dies: that job is the one lost
            reply: tuple
            try:
                if kind == "tasks":
                    update = side.execute(first, params, buffers, second)
                    reply = ("done", job, update, second)
                else:  # "evaluate": one shard of the test set, its per-batch sums
                    reply = ("evaluated", job, evaluator.batch_sums(eval_params, eval_buffers, first, second))
            except BaseException as exc:  # noqa: BLE001  (the run decides: stop, or skip the client)
                reply = ("failed", job, _describe(exc), client_error_detail(exc))
            running[0] = 0
            try:
                _send(conn, reply)
            except OSError:
                return


def _share_dataset(dataset) -> tuple[dict, list[SharedMemory]]:
    """``dataset``'s tensors copied into shared-memory blocks: (a description the workers
    rebuild it from, the blocks)."""
    description, blocks = {}, []
    for field in dataclasses.fields(dataset):
        value = getattr(dataset, field.name)
        if isinstance(value, torch.Tensor):
            array = value.detach().cpu().contiguous().numpy()
            block = SharedMemory(create=True, size=max(array.nbytes, 1))
            np.ndarray(array.shape, array.dtype, buffer=block.buf)[...] = array
            blocks.append(block)
            value = _SharedArray(block.name, array.shape, array.dtype.str)
        description[field.name] = value
    return {"class": type(dataset), "fields": description}, blocks


def _attach_dataset(description: dict):
    """The dataset described by :func:`_share_dataset`, its tensors reading the shared blocks."""
    fields, blocks = {}, []
    for name, value in description["fields"].items():
        if isinstance(value, _SharedArray):
            block = _attach(value.name)
            blocks.append(block)
            array = np.ndarray(value.shape, np.dtype(value.dtype), buffer=block.buf)
            array.flags.writeable = False  # shared by every worker: nobody writes it
            with warnings.catch_warnings():  # torch warns about read-only arrays
                warnings.simplefilter("ignore")
                value = torch.from_numpy(array)
        fields[name] = value
    return description["class"](**fields), blocks


@dataclass
class _SharedArray:
    name: str
    shape: tuple
    dtype: str


def _describe(exc: BaseException):
    """The exception itself when it pickles (a FedhetError keeps its one line), else its text."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError("".join(traceback.format_exception(exc)).strip())


def _death(process) -> str:
    try:
        code = process.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return "its pipe closed"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


class EvaluationHandle:
    """An evaluation running in the workers, one shard of the test set each, shaped like a
    ``concurrent.futures.Future``: :meth:`done` says whether every shard finished,
    :meth:`result` waits for them and adds their per-batch sums up in batch order (the
    numbers of one pass)."""

    def __init__(self, pool: ProcessPool, jobs: list[int]):
        self.pool = pool
        self.jobs = jobs

    def done(self) -> bool:
        """Whether every shard's result has arrived (takes the replies there, waits for none)."""
        return all(self.pool._arrived(job) for job in self.jobs)  # noqa: SLF001

    def result(self) -> dict[str, float]:
        """The metrics-row columns of the evaluated model (waits for every shard)."""
        batches = [found for job in self.jobs for found in self.pool._wait_for(job)]  # noqa: SLF001
        return self.pool.test_metrics(batches)


IN_FLIGHT = 4  # tasks sent ahead to each worker: it never waits for this process to hand it one
MAX_RESTARTS = 10  # worker processes started again in one run before the run gives up


@dataclass
class ProcessOptions:
    """The process pool's keys of ``[run]``."""

    # processes running client tasks: a count, or "auto" (the free cores)
    workers: Any = resumable(1)

    def validate(self) -> None:
        from fedhet.config import MAX_THREADS

        if self.workers != "auto":
            if isinstance(self.workers, bool) or not isinstance(self.workers, int):
                raise ConfigError(f'run.workers = {self.workers!r}: expected "auto" or a count of processes')
            at_least("run.workers", self.workers, 1)
            at_most("run.workers", self.workers, MAX_THREADS)


class ProcessPool:
    """``workers`` processes running one run's client tasks (see the module's docstring).

    Tasks go to whichever worker is least loaded, at most :data:`IN_FLIGHT` ahead (dealing a
    round's tasks up front, one message per worker, measured slower on SALF's Table II
    workload: the workers wait while this process pickles every task). A worker that dies
    mid-round is a fault for the task it was running:
    that client is not delivered, the tasks queued behind it go to the other workers (and
    the worker's replacement), a new worker takes its place, and the run goes on."""

    name = "processes"
    Options = ProcessOptions

    @classmethod
    def build(cls, options: ProcessOptions, ctx) -> ProcessPool:
        from fedhet.threads import pool_workers

        pool = cls(max(1, pool_workers(options.workers)), ctx.config.run.on_client_error)
        pool.config = ctx.config
        return pool

    def attach(self, world) -> None:
        """Hand the workers the run: they build its clients from the shared dataset."""
        from fedhet.world import open_configured_dataset

        torch.set_num_threads(1)  # this process plans and aggregates; the workers train
        config = self.config
        if config is None:
            raise RuntimeError("a process pool is attached once built from its configuration")
        dataset = open_configured_dataset(config)
        self.test_count, self.task = len(world.dataset.y_test), world.dataset.task  # what workers evaluate
        self.start(config.to_toml(), dataset, world.flat.params.numel(), world.flat.buffers.numel())

    def __init__(self, workers: int, on_client_error: str = "stop"):
        """Start ``workers`` processes; they import what they need while this process builds
        the run's world, then wait for :meth:`start`."""
        self.states = ClientStates()
        self.faults = FaultLog()
        self.on_client_error = on_client_error
        self.blocks: list[SharedMemory] = []
        self.config: Config | None = None  # set by build(): the run's configuration
        self.model = torch.zeros(0)  # the global model, in shared memory once started
        self.eval_model = torch.zeros(0)  # the model being evaluated, likewise
        self.processes: list[subprocess.Popen] = []
        self.conns: list[connection.Connection] = []
        self._closed = False
        self._job = 0
        self._results: dict[int, tuple] = {}
        self._pending: list[deque] = [deque() for _ in range(workers)]  # jobs sent, in order
        self._messages: dict[int, tuple] = {}  # job -> what it was (to send it again)
        self._alias: dict[int, int] = {}  # a job sent again -> its new number
        self._weight: dict[int, int] = {}  # job -> its share of its worker's load (evaluations)
        self._restarts = 0
        self._start_message: tuple = ()
        self.test_count, self.task = 0, default_task()  # the test set's size and task (attach)
        self._running: np.ndarray = np.zeros(0, np.int64)  # per worker, the job under way
        try:
            for _ in range(workers):
                process, conn = self._spawn()
                self.processes.append(process)
                self.conns.append(conn)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _spawn() -> tuple[subprocess.Popen, connection.Connection]:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        mine, theirs = socket.socketpair()
        # os._exit: nothing to flush, and no interpreter teardown to wait for
        code = f"import os, fedhet.engine.processes as p; p.serve({theirs.fileno()}); os._exit(0)"
        process = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
        )
        theirs.close()
        return process, connection.Connection(mine.detach())

    def start(self, config_toml: str, dataset, num_params: int, num_buffers: int) -> None:
        """Hand the workers the run: its configuration, its dataset as opened (before any
        subsampling; by shared memory, one copy for all) and the model's size; wait until
        every worker has built its clients."""
        try:
            self.sizes = (int(num_params), int(num_buffers))
            shared_dataset, self.blocks = _share_dataset(dataset)
            size = max(4 * sum(self.sizes), 4)
            models = [SharedMemory(create=True, size=size) for _ in range(2)]
            self.blocks += models
            self.model, self.eval_model = (
                torch.frombuffer(block.buf, dtype=torch.float32, count=sum(self.sizes)) for block in models
            )
            names = tuple(block.name for block in models)
            status = SharedMemory(create=True, size=8 * len(self.conns))
            self.blocks.append(status)
            self._running = np.ndarray((len(self.conns),), np.int64, buffer=status.buf)
            self._running[:] = 0
            self._start_message = ("start", config_toml, shared_dataset, names, self.sizes, status.name)
            for index, conn in enumerate(self.conns):
                _send(conn, (*self._start_message, index))
            for index in range(len(self.conns)):
                self._wait_ready(index)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [p.pid for p in self.processes]

    def _wait_ready(self, index: int) -> None:
        conn, process = self.conns[index], self.processes[index]
        if not connection.wait([conn], timeout=START_TIMEOUT):
            raise FedhetError(f"worker {index} did not start within {START_TIMEOUT:.0f} s")
        try:
            message = _receive(conn)
        except (EOFError, OSError):
            raise WorkerDied(f"worker {index} died while starting ({_death(process)})") from None
        if message[0] == "failed":
            raise message[2]

    # -- the ClientPool protocol ---------------------------------------------------------
    def run(
        self, tasks: list[ClientTask], params: torch.Tensor, buffers: torch.Tensor
    ) -> Iterator[ClientUpdate]:
        """The updates of ``tasks`` in task order; the tasks run on every worker at once."""
        tasks = list(tasks)
        if not tasks:
            return
        num_params = self.sizes[0]
        self.model[:num_params].copy_(params)
        self.model[num_params:].copy_(buffers)
        waiting = deque(range(len(tasks)))  # positions not yet sent
        jobs: dict[int, int] = {}  # position -> job
        following = 0
        try:
            while following < len(tasks):
                while waiting and min(self._loads()) < IN_FLIGHT:  # a worker never waits for a task
                    position = waiting.popleft()
                    jobs[position] = self._send_task(tasks[position])
                if following not in jobs:  # every worker is busy with an evaluation shard
                    self._receive_one()
                    continue
                job = self._current(jobs[following])
                if job not in self._results:
                    self._receive_one()
                    continue
                reply = self._results.pop(job)
                task = tasks[following]
                del jobs[following]
                following += 1
                if reply[0] == "done":
                    _, update, state = reply
                    self.states.of(update.client).clear()
                    self.states.of(update.client).update(state)
                    yield update
                elif reply[0] == "lost":
                    self.faults.add(task.round, task.client, reply[1])
                else:  # "error": the client's code raised
                    client_failed(self, None, task.client, task.round, reply[2])
        finally:  # a caller that stops early (a fault): let the tasks sent finish, drop them
            for job in jobs.values():
                if not self._closed:
                    with contextlib.suppress(FedhetError):
                        self._wait_for(job)

    def _loads(self) -> list[int]:
        """Each worker's jobs under way, an evaluation counting :data:`IN_FLIGHT` (no task
        of the round waits behind it)."""
        return [sum(self._weight.get(job, 1) for job in pending) for pending in self._pending]

    def _send_task(self, task: ClientTask) -> int:
        """Send one task, with the client's state, to the least loaded worker."""
        state = self.states.of(task.client)
        job = self._new_job(("task", task, state))
        loads = self._loads()
        worker = min(range(len(loads)), key=loads.__getitem__)
        self._send_to(worker, ("tasks", [(job, task, state)]), [job])
        return job

    def submit_evaluation(self, params: torch.Tensor, buffers: torch.Tensor) -> EvaluationHandle:
        """Evaluate ``(params, buffers)`` in the workers while the run goes on, one shard of
        the test set each (one evaluation at a time: the previous one's result must have
        been taken)."""
        num_params = self.sizes[0]
        self.eval_model[:num_params].copy_(params)
        self.eval_model[num_params:].copy_(buffers)
        jobs = []
        for start, stop in shards(self.test_count, len(self.conns)):
            job = self._new_job(("evaluate", start, stop))
            self._weight[job] = IN_FLIGHT  # no task waits behind a shard
            loads = self._loads()
            worker = min(range(len(loads)), key=loads.__getitem__)
            self._send_to(worker, ("evaluate", job, start, stop), [job])
            jobs.append(job)
        return EvaluationHandle(self, jobs)

    def test_metrics(self, batches: list[dict]) -> dict[str, float]:
        """The metrics-row columns from the shards' per-batch sums, in batch order."""
        return test_metrics(batches, self.test_count, self.task)

    def state_dict(self) -> dict:
        return self.states.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.states.load_state_dict(saved)

    # -- messages ------------------------------------------------------------------------
    def _new_job(self, what: tuple) -> int:
        self._job += 1
        self._messages[self._job] = what
        return self._job

    def _send_to(self, worker: int, message: tuple, jobs: list[int]) -> None:
        self._pending[worker].extend(jobs)
        try:
            _send(self.conns[worker], message)
        except (BrokenPipeError, OSError):
            self._worker_died(worker)

    def _current(self, job: int) -> int:
        """The number a job goes by now (a job sent again after its worker died is renumbered)."""
        while job in self._alias:
            job = self._alias[job]
        return job

    def _wait_for(self, job: int):
        job = self._current(job)
        while job not in self._results:
            self._receive_one()
            job = self._current(job)
        reply = self._results.pop(job)
        if reply[0] == "evaluated":
            return reply[1]
        if reply[0] == "error":
            raise FedhetError(f"evaluation in a worker: {reply[2]}")
        return reply

    def _arrived(self, job: int) -> bool:
        while self._current(job) not in self._results and self._receive_one(timeout=0.0):
            pass
        return self._current(job) in self._results

    def _receive_one(self, timeout: float | None = None) -> bool:
        """Take one reply (waiting up to ``timeout`` seconds, None = as long as it takes);
        whether one came. A dead worker is replaced (see :meth:`_worker_died`)."""
        ready = connection.wait(self.conns, timeout)
        if not ready:
            return False
        for worker, conn in enumerate(self.conns):
            if conn not in ready:
                continue
            try:
                message = _receive(conn)
            except (EOFError, OSError):
                self._worker_died(worker)
                return True
            kind, job = message[0], message[1]
            if self._pending[worker] and self._pending[worker][0] == job:
                self._pending[worker].popleft()
            self._messages.pop(job, None)
            self._weight.pop(job, None)
            if kind == "failed":
                if isinstance(message[2], FedhetError):
                    self._results[job] = ("fatal", message[2])  # nobody waits for it any more
                    raise message[2]  # one line already (a data file, a configuration)
                self._results[job] = ("error", message[2], message[3])
            elif kind == "evaluated":
                self._results[job] = ("evaluated", message[2])
            else:
                self._results[job] = ("done", message[2], message[3])
            return True
        return False

    def _worker_died(self, worker: int) -> None:
        """A fault: the job the worker was running (it says which in shared memory) is lost
        (its client not delivered; an evaluation is sent again), the jobs queued behind it
        are sent again, and a new worker takes its place. A worker that died idle loses
        nothing."""
        process = self.processes[worker]
        how = f"worker {worker} (pid {process.pid}) died ({_death(process)})"
        self._restarts += 1
        if self._restarts > MAX_RESTARTS or not self._start_message:
            self.close()
            raise WorkerDied(f"{how}; {self._restarts - 1} workers were replaced already, the run stops")
        running = int(self._running[worker])  # the job it had started, 0 when idle
        with contextlib.suppress(OSError):
            self.conns[worker].close()
        self._running[worker] = 0
        self.processes[worker], self.conns[worker] = self._spawn()
        _send(self.conns[worker], (*self._start_message, worker))
        self._wait_ready(worker)
        lost, self._pending[worker] = list(self._pending[worker]), deque()
        for job in lost:
            what = self._messages.pop(job)
            if job == running and what[0] == "task":
                self._results[job] = ("lost", how)
                continue
            renumbered = self._alias[job] = self._new_job(what)
            target = min(range(len(self.conns)), key=lambda w: len(self._pending[w]))
            if what[0] == "task":
                _, task, state = what
                self._send_to(target, ("tasks", [(renumbered, task, state)]), [renumbered])
            else:
                self._weight[renumbered] = self._weight.pop(job, IN_FLIGHT)
                self._send_to(target, ("evaluate", renumbered, *what[1:]), [renumbered])

    def close(self) -> None:
        """Stop the workers (politely, then by force) and free the shared memory."""
        if self._closed:
            return
        self._closed = True
        for conn in self.conns:
            with contextlib.suppress(OSError):
                _send(conn, ("stop",))
        for process in self.processes:
            try:
                process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5.0)
        for conn in self.conns:
            conn.close()
        self.model = self.eval_model = torch.zeros(0)  # views of the blocks closed below
        for block in self.blocks:
            with contextlib.suppress(Exception):
                block.close()
            with contextlib.suppress(FileNotFoundError):
                block.unlink()


register("pool")(ProcessPool)
