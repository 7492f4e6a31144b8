"""What ``fedhet plan`` shows: the expected depth at a deadline, a deadline calibrated for a
depth share (ADEL-FL Sec. 4's way of setting T_max / R), and an algorithm's plan (ADEL-FL's
deadlines and batch scale) computed without training."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedhet.config import Config
from fedhet.errors import ConfigError
from fedhet.results import dumps
from fedhet.system import deadline_for_depth_fraction, expected_depth_fraction


def describe_plan(config: Config, depth_fraction: float | None = None, out: str | None = None) -> list[str]:
    """Lines describing the run's deadlines and its algorithm's plan (written to ``out`` as
    JSON when given). Clients answer the algorithm's probe tasks as in a run."""
    from fedhet.engine.pool import InProcessPool, WorkerSide
    from fedhet.engine.state import RunState
    from fedhet.world import build_world

    if depth_fraction is not None and not 0 < depth_fraction <= 1:
        raise ConfigError(f"--depth-fraction {depth_fraction}: must be in (0, 1]")
    world = build_world(config)
    system, rounds = world.server_system, config.run.rounds
    if depth_fraction is not None and not _exponential(system):
        raise ConfigError(
            f"--depth-fraction: system.model = {config.system.model!r} has no time law to calibrate a "
            "deadline against; use system.model = 'exponential'"
        )
    batch = np.full(world.num_clients, config.train.batch_size)
    lines = [
        f"{config.run.name}: {world.num_clients} clients, {world.flat.num_layers} layers, {rounds} rounds"
    ]
    if _exponential(system) and depth_fraction is not None:
        deadline = deadline_for_depth_fraction(system, batch, depth_fraction)
        lines.append(
            f"depth {100 * depth_fraction:g}% at batch {config.train.batch_size}: "
            f"deadline {deadline:.6g}, run.time_budget = {deadline * rounds:.6g} for {rounds} rounds"
        )
    setting = world.setting()
    probes = world.algorithm.planner.probe_tasks(setting)
    if probes:
        pool = InProcessPool(WorkerSide(world, config.run.seed))
        state = RunState(world.initial_params, world.initial_buffers)
        setting.probes = list(pool.run(probes, state.params, state.buffers))
    algorithm_state = world.algorithm.init_state(setting)
    lines += [f"warning: {note}" for note in world.algorithm.reporting.warnings(algorithm_state)]
    plan = world.algorithm.reporting.reports(algorithm_state).get("plan")
    if not plan:
        lines.append(_deadline_line(config, world, algorithm_state, batch))
    if plan:
        lines += _plan_lines(config.algorithm_name, plan)
        if out:
            Path(out).write_text(dumps(plan, indent=2))
            lines.append(f"  written to {out}")
    elif out:
        raise ConfigError(f"--out {out}: {config.algorithm_name} has no plan to write (adel-fl has)")
    elif not _exponential(system):
        lines.append(
            f"{config.algorithm_name}: no planner; system {system.name} has no time law to calibrate"
        )
    return lines


def _plan_lines(name: str, plan: dict) -> list[str]:
    """A planner's report (ADEL-FL's deadlines and batch sizes) in three lines."""
    deadlines = plan["deadlines"]
    return [
        f"{name} plan: {plan['status']} after {plan['iterations']} iterations",
        f"  objective {plan['objective']:.6g} (equal deadlines {plan['equal_deadlines_objective']:.6g}); "
        f"batch scale m = {plan['batch_scale']:.4g}; batch sizes {min(plan['batch_sizes'])}.."
        f"{max(plan['batch_sizes'])}",
        f"  deadlines: first {deadlines[0]:.4g}, middle {deadlines[len(deadlines) // 2]:.4g}, "
        f"last {deadlines[-1]:.4g}; total {plan['total_time']:.6g} of {plan['time_budget']:.6g}",
    ]


def _deadline_line(config: Config, world, algorithm_state: dict, batch: np.ndarray) -> str:
    """The deadline the run will use in its first round (as the algorithm plans it), where it
    comes from, and on the exponential model the expected depth it gives."""
    first = world.algorithm.planner.plan(0, algorithm_state, world.server_system, config.round_deadline)
    if first.deadline is None:
        return f"no deadline: {config.algorithm_name} waits for every asked client each round"
    source = (
        f"system.deadline = {config.system.deadline:g}"
        if config.system.deadline > 0
        else f"run.time_budget / run.rounds = {config.run.time_budget:g} / {config.run.rounds}"
    )
    line = f"deadline {first.deadline:.6g} per round ({source})"
    if _exponential(world.server_system):
        share = expected_depth_fraction(world.server_system, first.deadline, batch)
        line += f" at batch {config.train.batch_size}: expected depth {100 * share:.1f}% of the layers"
    return line


def _exponential(system) -> bool:
    """Whether the system model samples ADEL-FL's exponential layer times (A4)."""
    law = system.time_law()
    return law is not None and law.kind == "exponential-layers"
