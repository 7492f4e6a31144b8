"""Which engine runs a configuration, and the one door every command goes through.

``run.engine`` names an ``engine`` plug-in (:mod:`fedhet.registry`): ``embedded`` (this
process, :class:`~fedhet.engine.loop.RunLoop`, client tasks in-process or in worker
processes with ``run.workers``) or ``flower`` (Flower's simulation runtime: the whole
engine, its options and its pool live in :mod:`fedhet.engine.flower`; Flower itself is
imported only when used). An engine's options are keys of
``[run]`` validated by its ``Options`` (``run.round_timeout`` and
``run.flower_cpus_per_client`` are Flower's), like a system model's keys in ``[system]``.

``fedhet run``, ``reproduce`` (local jobs and ``--ray``) and ``tune`` all call :func:`run`
(or :func:`check` first for a whole grid or study), so a grid cell or a trial runs on the
engine its configuration names, and a combination the engine cannot honour is refused in
one line before anything runs. The summary's ``engine`` is written by the engine that ran.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedhet.config import Config
from fedhet.engine.loop import RunLoop, RunResult
from fedhet.errors import ConfigError
from fedhet.registry import NoOptions, register


@dataclass
class Launch:
    """What a caller asks of an engine beside the configuration and the run folder.

    ``callbacks``: extra callback objects for this run only (a tune's pruning), after the
    configured ones; ``on_round``: a function of each complete metrics row (progress);
    ``group``: the grid, ``[compare]`` or study the run belongs to (trackers nest it);
    ``stop_after`` ends the run after that many rounds, as an interruption would (tests);
    ``client_order`` reorders each round's tasks in the in-process pool (tests)."""

    resume: bool = False
    overwrite: bool = False
    on_round: Callable[[dict], None] | None = None
    group: str | None = None
    callbacks: Sequence = field(default_factory=tuple)
    stop_after: int | None = None
    client_order: Callable | None = None


@dataclass(frozen=True)
class Placement:
    """How a study may place an engine's runs: ``parallel``: several at once in local worker
    processes; ``ray_task``: as a task of a Ray cluster (``reproduce --ray``)."""

    parallel: bool = True
    ray_task: bool = True


class Engine:
    """Base of engine plug-ins.

    A subclass sets ``name``, its ``Options`` (keys of ``[run]``), ``placement`` and
    implements :meth:`run`; :meth:`check` refuses, before anything runs, what it cannot
    honour. ``runs_workers``: whether it honours ``run.workers`` (processes on this
    machine). The summary it returns names it under ``"engine"``."""

    name = "base"
    Options: type = NoOptions
    runs_workers = False
    placement = Placement()

    def __init__(self, options=None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def build(cls, options, ctx=None) -> Engine:
        return cls(options)

    def check(self, config: Config) -> None:
        """Raise a one-line :class:`~fedhet.errors.ConfigError` for a configuration this
        engine cannot run as configured (never run it elsewhere instead): by default, a pool
        that declares another engine (a pool's ``engine``; None: any engine's)."""
        pool = config.run.plugins["pool"][0].cls
        drives = getattr(pool, "engine", "embedded")  # a pool that declares none: the embedded engine's
        if drives is not None and drives != self.name:
            raise ConfigError(self.pool_refusal(config.run.pool, drives))

    def pool_refusal(self, pool: str, engine: str) -> str:
        """The one line refusing ``run.pool = pool``, a pool of ``engine``."""
        return f"run.pool = {pool!r}: a pool of the {engine} engine (run.engine = {engine!r})"

    def run(self, config: Config, out_dir: str | Path, launch: Launch) -> RunResult:
        raise NotImplementedError


@register("engine")
class EmbeddedEngine(Engine):
    """One process, one virtual clock, one reused working model; client tasks in this
    process or in ``run.workers`` worker processes."""

    name = "embedded"
    runs_workers = True

    def pool_refusal(self, pool: str, engine: str) -> str:
        if engine == "flower":
            return "run.pool = 'flower': Flower's pool runs on the flower engine (run.engine = 'flower')"
        return super().pool_refusal(pool, engine)

    def run(self, config: Config, out_dir: str | Path, launch: Launch) -> RunResult:
        loop = RunLoop(
            config,
            out_dir,
            on_round=launch.on_round,
            client_order=launch.client_order,
            group=launch.group,
            callbacks=launch.callbacks,
            engine=self.name,
        )
        return loop.run(resume=launch.resume, overwrite=launch.overwrite, stop_after=launch.stop_after)


def engine_for(config: Config) -> Engine:
    """The engine ``run.engine`` names, built with its options from ``[run]``."""
    entry, options = config.run.plugins["engine"]
    return entry.cls.build(options, None)


def check(config: Config, where: str = "") -> Engine:
    """The configuration's engine, after it accepted the configuration; ``where`` prefixes
    a refusal (``"cell NAME: "``)."""
    engine = engine_for(config)
    try:
        engine.check(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    return engine


def check_placement(configs: Sequence[tuple[str, Config]], parallel: bool, ray: bool, command: str) -> None:
    """Refuse, before anything runs, a study whose engines cannot be placed as asked:
    ``ray``: every run a Ray task; ``parallel``: several runs at once in local processes
    (``command`` names the option, for the message)."""
    for name, config in configs:
        engine = check(config, f"{name}: ")
        if ray and not engine.placement.ray_task:
            raise ConfigError(
                f"{name}: run.engine = {config.run.engine!r} cannot run as a Ray task (it starts its "
                f"own runtime); run {command} without --ray"
            )
        if parallel and not engine.placement.parallel:
            raise ConfigError(
                f"{name}: run.engine = {config.run.engine!r} runs one run at a time on this machine; "
                f"run {command} with --jobs 1"
            )


def run(
    config: Config, out_dir: str | Path, resume: bool = False, overwrite: bool = False, **kwargs
) -> RunResult:
    """Run ``config`` on its engine (``run.engine``); ``kwargs`` are :class:`Launch`'s."""
    engine = check(config)
    return engine.run(config, out_dir, Launch(resume=resume, overwrite=overwrite, **kwargs))


def runs_in_lockstep(config: Config) -> str | None:
    """Why ``config`` cannot run in lockstep with others (:func:`run_together`); None: it can
    (the embedded engine, its clients in this process, times not measured on this host)."""
    if config.run.engine != "embedded":
        return f"run.engine = {config.run.engine!r}"
    if config.run.pool not in ("auto", "in-process", "batched"):
        return f"run.pool = {config.run.pool!r}"
    if config.system.model == "wall-clock":
        return "system.model = 'wall-clock' times each task on this host, one at a time"
    return None


def run_together(runs: Sequence, group: str | None = None) -> list:
    """Run several configurations (:class:`~fedhet.engine.cohort.CohortRun`: configuration,
    folder, resume) of one method and shape: in lockstep as one computation
    (:mod:`fedhet.engine.cohort`) where every one allows it (:func:`runs_in_lockstep`),
    else one after another. Each one's :class:`RunResult`, or the exception that ended it:
    one run's failure does not stop the others."""
    from fedhet.engine.cohort import run_cohort

    out: list = [None] * len(runs)
    ready = []
    for k, one in enumerate(runs):
        try:
            check(one.config)
            ready.append(k)
        except Exception as exc:  # noqa: BLE001  (this run's, in its place)
            out[k] = exc
    if len(ready) > 1 and all(runs_in_lockstep(runs[k].config) is None for k in ready):
        for k, result in zip(ready, run_cohort([runs[k] for k in ready], group), strict=True):
            out[k] = result
        return out
    for k in ready:
        one = runs[k]
        try:
            out[k] = run(one.config, one.folder, resume=one.resume, overwrite=not one.resume, group=group)
        except Exception as exc:  # noqa: BLE001  (this run's, in its place)
            out[k] = exc
    return out
