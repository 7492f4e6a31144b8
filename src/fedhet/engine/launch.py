"""Which engine runs a configuration, and the one door every command goes through.

``run.engine`` names an ``engine`` plug-in (:mod:`fedhet.registry`): ``embedded`` (this
process, :class:`~fedhet.engine.loop.RunLoop`, client tasks in-process or in worker
processes with ``run.workers``) or ``flower`` (Flower's simulation runtime,
:mod:`fedhet.engine.flower`, imported only when used). An engine's options are keys of
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

from fedhet.checks import in_range, resumable
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


@dataclass
class FlowerOptions:
    """The Flower engine's keys of ``[run]``."""

    # wall-clock seconds to wait for the replies of a round (0 = no limit)
    round_timeout: float = resumable(0.0)
    flower_cpus_per_client: float = resumable(1.0)  # simulation: CPUs Ray reserves per client
    # simulation: the GPU share Ray reserves per client (0.1: 10 per GPU)
    flower_gpus_per_client: float = resumable(0.0)

    def validate(self) -> None:

        if self.round_timeout < 0:
            raise ConfigError(f"run.round_timeout = {self.round_timeout}: must be >= 0 (0 = no limit)")
        in_range("run.flower_cpus_per_client", self.flower_cpus_per_client, 0.0, 1024.0, low_open=True)
        in_range("run.flower_gpus_per_client", self.flower_gpus_per_client, 0.0, 1.0)
        if self.flower_gpus_per_client > 0:
            import torch

            if not torch.cuda.is_available():  # Ray would wait for a GPU forever
                raise ConfigError(
                    f"run.flower_gpus_per_client = {self.flower_gpus_per_client:g}: torch sees no GPU "
                    "here; set it to 0"
                )


@register("engine")
class FlowerEngine(Engine):
    """Flower's simulation runtime (Ray): one virtual SuperNode per client. A Flower
    simulation starts its own Ray on this machine, so a study runs its Flower runs one at a
    time and never as tasks of another Ray cluster."""

    name = "flower"
    Options = FlowerOptions
    placement = Placement(parallel=False, ray_task=False)

    def check(self, config: Config) -> None:
        from fedhet.engine.flower import require_flower

        super().check(config)
        require_flower()

    def pool_refusal(self, pool: str, engine: str) -> str:
        return (
            f"run.pool = {pool!r}: the flower engine sends each task to the client's node (its own "
            "pool); leave run.pool unset"
        )

    def run(self, config: Config, out_dir: str | Path, launch: Launch) -> RunResult:
        from fedhet.engine.flower import run_simulation

        if launch.client_order is not None or launch.stop_after is not None:
            raise ConfigError("run.engine = 'flower': client_order and stop_after are embedded-engine hooks")
        return run_simulation(
            config,
            out_dir,
            resume=launch.resume,
            overwrite=launch.overwrite,
            on_round=launch.on_round,
            group=launch.group,
            callbacks=launch.callbacks,
            engine=self.name,
        )


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
