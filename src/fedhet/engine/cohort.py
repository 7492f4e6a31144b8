"""Runs as one computation: the runs of a cohort (a bench's seed runs of one tuned setting,
a grid's cells that share a shape) step in lockstep in one process, and each round the
tasks of all of them train as groups of the one local trainer.

Every run keeps its own loop, plan, system draws, random streams, client states, run folder
and checkpoint; it runs in a thread of its own. Its pool (:class:`CohortPool`, the batched
pool) hands each round's tasks to the :class:`Cohort` and waits; when every run still
going has handed in its round, the last to arrive trains them all
(:func:`fedhet.engine.batched.train_requests`: the same grouping and trainer a run alone
uses, with a bigger group; each client starts from its own run's model) and every run goes
on with its own updates. A run that ends, fails or is interrupted leaves the cohort and the
others go on without it. Results equal each run alone within float tolerance (a group's
rows are computed together; tests/test_cohort.py).

A client's error in a group shared by several runs is its own run's: recorded during the
computation (the client's state kept as it was) and raised, or counted as a fault
(``run.on_client_error``), in that run alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.engine.batched import BatchedOptions, BatchedPool, Request, train_requests
from fedhet.engine.client_errors import client_failed
from fedhet.engine.loop import RunLoop, RunResult
from fedhet.engine.pool import PoolContext
from fedhet.messages import ClientUpdate

if TYPE_CHECKING:
    from fedhet.config import Config


_BUILDING = threading.Lock()


class Cohort:
    """The lockstep of ``size`` runs: a round trains when every run still in the cohort has
    handed in its tasks (:meth:`submit`); a run that ends :meth:`leave` s."""

    def __init__(self, size: int):
        self.live = int(size)
        self.waiting: list[list[Request]] = []  # each run's requests, one list per run
        self.size = int(size)
        self.results: dict[int, list[list[ClientUpdate | None]] | BaseException] = {}
        self.rounds = 0  # computations so far (each one round of every run still going)
        self.condition = threading.Condition()
        # the turn: one run's thread computes at a time, the others sleep on this lock (threads
        # that all wanted the interpreter at once passed it between cores: a cohort on two
        # cores beside another process measured 1.27x the time of its runs one after another)
        self.turn = threading.Lock()

    def submit(self, requests: list[Request]) -> list[list[ClientUpdate | None]]:
        """Each of a run's requests' updates, once every run still going has handed in its
        own (the caller's turn given up while it waits, taken again before it goes on)."""
        self.turn.release()
        try:
            with self.condition:
                self.waiting.append(requests)
                if len(self.waiting) >= self.live:
                    self._train()
                while id(requests) not in self.results:
                    self.condition.wait()
                result = self.results.pop(id(requests))
        finally:
            self.turn.acquire()
        if isinstance(result, BaseException):
            raise result
        return result

    def leave(self) -> None:
        """A run ended (finished, failed, interrupted): the others no longer wait for it."""
        with self.condition:
            self.live -= 1
            if self.waiting and len(self.waiting) >= self.live:
                self._train()

    def _train(self) -> None:
        """Train the waiting requests as one computation (the lock held: every other run
        of the cohort is waiting for it); an error there is every waiting run's."""
        runs, self.waiting = self.waiting, []
        requests = [request for run in runs for request in run]
        try:
            outs: list = train_requests(requests)
        except BaseException as exc:  # noqa: BLE001  (handed to every run of the computation)
            outs = [exc] * len(requests)
        first = 0
        for run in runs:
            mine, first = outs[first : first + len(run)], first + len(run)
            failed = [out for out in mine if isinstance(out, BaseException)]
            self.results[id(run)] = failed[0] if failed else mine
        self.rounds += 1
        self.condition.notify_all()


class CohortPool(BatchedPool):
    """The batched pool of a run in a cohort: its rounds train with the other runs'."""

    cohort: Cohort
    _left = False

    @property
    def lockstep_runs(self) -> int:
        """The runs of its cohort (the summary's ``lockstep_runs``)."""
        return self.cohort.size

    def train_many(self, requests: list[Request]) -> list[list[ClientUpdate | None]]:
        updates = self.cohort.submit(requests)
        for request in requests:
            for task, exc in request.errors:  # this run's clients' errors, in this run
                client_failed(self, exc, task.client, task.round)
        return updates

    def close(self) -> None:
        super().close()
        self.leave()

    def leave(self) -> None:
        """Leave the cohort once."""
        if not self._left:
            self._left = True
            self.cohort.leave()


class CohortLoop(RunLoop):
    """A run loop whose pool is a :class:`CohortPool` of ``cohort`` (the batched pool's
    options from the configuration where it names the batched pool)."""

    def __init__(self, config, out_dir, cohort: Cohort, **kwargs):
        super().__init__(config, out_dir, **kwargs)
        self.cohort = cohort
        self.cohort_pool: CohortPool | None = None

    def _build_world(self):
        """Built one run at a time: a world's initial model draws from torch's global
        stream, which the cohort's threads share."""
        with _BUILDING:
            return super()._build_world()

    def _build_pool(self) -> CohortPool:
        _, options = self.config.run.plugins["pool"]
        if not isinstance(options, BatchedOptions):
            options = BatchedOptions()
        pool = CohortPool.build(options, PoolContext(self.config, None, self.engine, None))
        assert isinstance(pool, CohortPool)
        pool.cohort = self.cohort
        self.cohort_pool = pool
        return pool


@dataclass
class CohortRun:
    """One run of a cohort: its configuration, folder, and whether to resume it (else it
    starts afresh, overwriting)."""

    config: Config
    folder: str | Path
    resume: bool = False


def run_cohort(runs: list[CohortRun], group: str | None = None) -> list[RunResult | BaseException]:
    """Run ``runs`` in lockstep as one computation (see the module's docstring); each one's
    result, or the exception that ended it (the others went on)."""
    from fedhet.world import open_configured_dataset

    for config in {id(r.config): r.config for r in runs}.values():
        try:
            open_configured_dataset(config)  # decoded once, before the threads: shared by all
        except Exception:  # noqa: BLE001  (the run that needs it says why)
            pass
    cohort = Cohort(len(runs))
    results: list[RunResult | BaseException | None] = [None] * len(runs)

    def one(k: int) -> None:
        run = runs[k]
        cohort.turn.acquire()  # a run computes in its turn (Cohort.submit gives it up while waiting)
        loop = CohortLoop(run.config, run.folder, cohort, group=group)
        try:
            results[k] = loop.run(resume=run.resume, overwrite=not run.resume)
        except BaseException as exc:  # noqa: BLE001  (this run's end: the others go on)
            results[k] = exc
        finally:
            cohort.turn.release()
            if loop.cohort_pool is None:  # ended before its pool joined: leave in its place
                cohort.leave()
            else:
                loop.cohort_pool.leave()

    threads = [
        threading.Thread(target=one, args=(k,), name=f"cohort-{k}", daemon=True) for k in range(len(runs))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r if r is not None else RuntimeError("the run did not end") for r in results]
