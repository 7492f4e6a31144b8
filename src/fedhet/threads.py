"""How many threads torch gets: ``run.threads = "auto"`` (the default) decides from the size
of the run's work and the cores actually free.

Small models gain nothing from a second thread (an MLP step on 16 examples is *slower* with
two), and torch's OpenMP threads spin while they wait for each other: when another process
holds one of this machine's two cores, a run with two threads was measured 30x slower than
with one. So "auto" gives one thread to work below :data:`PARALLEL_STEP_FLOPS` per training
step, and otherwise as many threads as cores are free (idle when the run starts), capped by
the core budget of a grid's job (:func:`set_core_budget`).

``run.threads = 0`` keeps torch's own default (one thread per core, within the core budget
when one is set); a positive number is
used as given.
"""

from __future__ import annotations

import os
import time

# Below this many FLOPs per training step a second thread does not pay: measured on a 2-core
# CPU, cnn2 on 16 examples (12 MFLOP) ran 1.15x faster with two threads, MLPs not at all,
# and cnn2 on 128 examples (93 MFLOP) 1.8x faster.
PARALLEL_STEP_FLOPS = 50e6

_core_budget: int | None = None


def set_core_budget(cores: int | None) -> None:
    """Cap "auto" at ``cores`` threads in this process (a grid's worker: cores / jobs)."""
    global _core_budget
    _core_budget = None if cores is None else max(1, int(cores))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def free_cores(sample_seconds: float = 0.2) -> int:
    """The cores not busy with other work: the available cores less the busy time of the
    whole machine over ``sample_seconds`` (Linux ``/proc/stat``), rounded; on systems without
    it, the available cores."""
    cores = available_cores()
    first = _cpu_times()
    if first is None:
        return cores
    time.sleep(sample_seconds)
    second = _cpu_times()
    if second is None:
        return cores
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return cores
    machine = os.cpu_count() or cores
    busy_cores = machine * busy / total
    return max(1, min(cores, int(round(machine - busy_cores))))


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, or None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def auto_threads(step_flops: float, cores: int | None = None) -> int:
    """Threads for work of ``step_flops`` FLOPs per training step: 1 below
    :data:`PARALLEL_STEP_FLOPS`, else the free cores (or ``cores``), within the core budget."""
    if step_flops < PARALLEL_STEP_FLOPS:
        return 1
    cores = free_cores() if cores is None else max(1, int(cores))
    if _core_budget is not None:
        cores = min(cores, _core_budget)
    return cores


def choose_threads(setting: int | str, step_flops: float) -> int:
    """The thread count for ``run.threads = setting`` and work of ``step_flops`` FLOPs per
    step; sets torch's intra-op threads and returns the count in use. ``"auto"``: see
    :func:`auto_threads`; a positive count: that many; 0: torch's default (one per core),
    capped at the process's core budget when it has one (a grid's worker, a Flower
    client), everywhere the same."""
    import torch

    if setting == "auto":
        torch.set_num_threads(auto_threads(step_flops))
    elif int(setting) > 0:
        torch.set_num_threads(int(setting))
    elif _core_budget is not None:
        torch.set_num_threads(min(available_cores(), _core_budget))
    return torch.get_num_threads()


def pool_workers(setting: int | str) -> int:
    """The worker processes for ``run.workers = setting``: ``"auto"``: the free cores; a
    count: that many. Both within the core budget (a grid's job gets its share of the cores,
    so jobs x workers never exceeds them)."""
    workers = free_cores() if setting == "auto" else max(1, int(setting))
    if _core_budget is not None:
        workers = min(workers, _core_budget)
    return workers
