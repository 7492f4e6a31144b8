"""Which engine runs a configuration: ``run.engine`` names an ``engine`` plug-in
(:mod:`fedhet.registry`): ``embedded`` (this process, :class:`~fedhet.engine.loop.RunLoop`)
or ``flower`` (Flower's simulation runtime, :mod:`fedhet.engine.flower`, imported only
when used)."""

from __future__ import annotations

from pathlib import Path

from fedhet.config import Config
from fedhet.engine.loop import RunLoop, RunResult
from fedhet.registry import NoOptions, register, resolve


class Engine:
    """Base of engine plug-ins: ``run(config, out_dir, resume, overwrite, **kwargs)``."""

    name = "base"
    Options: type = NoOptions
    runs_workers = False  # whether it honours run.workers (processes on this machine)

    @classmethod
    def build(cls, options, ctx=None) -> Engine:
        return cls()

    def run(self, config: Config, out_dir, resume=False, overwrite=False, **kwargs) -> RunResult:
        raise NotImplementedError


@register("engine")
class EmbeddedEngine(Engine):
    """One process, one virtual clock, one reused working model."""

    name = "embedded"
    runs_workers = True

    def run(self, config: Config, out_dir, resume=False, overwrite=False, **kwargs) -> RunResult:
        loop_kwargs = {k: kwargs.pop(k) for k in ("on_round", "client_order", "group") if k in kwargs}
        return RunLoop(config, out_dir, **loop_kwargs).run(resume=resume, overwrite=overwrite, **kwargs)


@register("engine")
class FlowerEngine(Engine):
    """Flower's simulation runtime (Ray): one virtual SuperNode per client."""

    name = "flower"

    def run(self, config: Config, out_dir, resume=False, overwrite=False, **kwargs) -> RunResult:
        from fedhet.engine.flower import run_simulation

        return run_simulation(
            config, out_dir, resume=resume, overwrite=overwrite, on_round=kwargs.get("on_round")
        )


def run(
    config: Config, out_dir: str | Path, resume: bool = False, overwrite: bool = False, **kwargs
) -> RunResult:
    """Run ``config`` on its engine (``run.engine``)."""
    entry = resolve("engine", config.run.engine, "run.engine")
    engine = entry.cls.build(entry.cls.Options(), None)
    return engine.run(config, out_dir, resume=resume, overwrite=overwrite, **kwargs)
