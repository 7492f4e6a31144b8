"""Before training: can the first round's plan deliver anything at all?

A run whose clients can never report (a step that costs longer than the deadline, every
client a straggler under a rule that keeps only finished work, nobody ever online) would
otherwise train nothing and end with a normal table. :func:`check_first_round` prices the
first round's plan with the system model's marginals and refuses it in one line when the
expected number of updates over the whole run is below :data:`NOTHING`.

What counts as delivering follows the algorithm's declared ``partial_work``: ``"layers"``
(SALF) needs the top layer of its steps, ``"steps"`` (FedProx, FedNova) one whole step,
``"none"`` all its planned work; a rule that decides its clients' work itself (it defines
``client_task``: HeteroFL's, FjORD's and DepthFL's sub-models, AsyncFL's late updates,
TimelyFL's schedule) is not priced here. Models that learn their marginals as the run goes
(``wall_clock``) are not checked here; the run loop's empty-round stop covers them. A run
with ``run.max_empty_rounds = 0`` accepts rounds without updates and is not checked either:
a sweep over deadlines (SALF's Fig. 5) includes points where a method learns nothing.
"""

from __future__ import annotations

import numpy as np

from fedhet.algorithms.mechanisms import inert, inert_lines
from fedhet.checks import counted
from fedhet.engine.plugin_errors import Hooks
from fedhet.errors import FedhetError
from fedhet.system import Workload

NOTHING = 0.01  # expected updates over the run below which the plan is refused


def delivery_probability(partial_work: str, marginals, work: Workload, num_layers: int) -> np.ndarray:
    """Per client, P[present and delivers an update] this round (marginals of the system
    model, which include presence)."""
    if partial_work == "layers":
        return np.asarray(marginals.reach_prob, float)[:, num_layers - 1]  # the top layer, K steps
    steps = marginals.step_prob
    if steps is None:  # depth-only model without step marginals: finishing = reaching layer d0
        reach = np.asarray(marginals.reach_prob, float)
        return reach[np.arange(len(reach)), work.depth - 1]
    steps = np.asarray(steps, float)
    if partial_work == "steps":
        return steps[:, 0]
    wanted = np.clip(work.local_steps, 1, steps.shape[1]) - 1
    return steps[np.arange(len(steps)), wanted]


def least_work_time(system, work: Workload, partial_work: str, num_layers: int) -> float | None:
    """The fastest client's time for the least work it could deliver (the top layer of its
    steps, one step, or all of it, after the extra evaluations it is asked for: AMSFL's,
    FedBalancer's), with no deadline; None for models without a time law."""
    if system.time_law() is None:
        return None
    least = Workload(
        None,
        work.batch_sizes,
        np.ones_like(work.local_steps) if partial_work == "steps" else work.local_steps.copy(),
        np.full_like(work.depth, num_layers) if partial_work == "layers" else work.depth.copy(),
        work.start_time,
        work.upload_bytes,
        extra_gradients=work.extra_gradients,
    )
    outcomes = system.sample(least, np.random.default_rng(0))
    times = np.asarray(outcomes.full_time, float)
    return float(np.min(times)) if len(times) else None


NEVER = 1e-12  # a delivery probability below this: the client never delivers
MOSTLY = 0.5  # the share of clients that never deliver above which a run is caveated


def first_round(config, world, algorithm_state: dict):
    """The first round priced before it runs: (plan, workload, asked, marginals, per client
    P[delivers]); None for rules and models this cannot price (event-driven rules, models that
    learn their marginals as the run goes)."""
    from fedhet.algorithms.base import overrides

    algorithm, system = world.algorithm, world.server_system
    if system.wall_clock or getattr(algorithm, "driver", "round") != "round":
        return None
    if overrides(type(algorithm.planner), "client_task"):
        return None  # the rule decides who delivers what (sub-models, late updates): not priceable here
    hooks = Hooks(config.algorithm_name, 0)
    planned = hooks.call("plan", algorithm.planner.plan, 0, algorithm_state, system, config.round_deadline)
    plan = hooks.plan(planned, world.num_clients)
    work = plan.workload()
    asked = np.array([a.asked for a in plan.assignments], dtype=bool)
    from fedhet.engine.drivers import download_bytes, upload_bytes

    work.upload_bytes = upload_bytes(world, work.depth)
    work.download_bytes = download_bytes(world)
    model = Hooks(config.system.model, 0, "system model")
    marginals = model.marginals(model.call("marginals", system.marginals, work))
    delivering = delivery_probability(algorithm.partial_work, marginals, work, world.flat.num_layers)
    return plan, work, asked, marginals, delivering


def inert_mechanisms(config, world) -> list[str]:
    """The names of the mechanisms the run's rule declares that its settings make inert
    (:mod:`fedhet.algorithms.mechanisms`); the summary's ``inert_mechanisms``."""
    hooks = Hooks(config.algorithm_name, 0)
    timed = world.server_system.time_law() is not None
    return [m.name for m in hooks.call("mechanisms", inert, world.algorithm, timed)]


def inert_mechanism_lines(config, world) -> list[str]:
    """One line per inert mechanism of the run's rule: what it is, what it needs, which of
    its options do nothing."""
    timed = world.server_system.time_law() is not None
    return list(Hooks(config.algorithm_name, 0).call("mechanisms", inert_lines, world.algorithm,
                                                     config.algorithm_name, timed))  # fmt: skip


def run_caveats(config, world, algorithm_state: dict) -> list[str]:
    """What makes a run say little, one line each: the rule's own caveats (settings under
    which it is another rule), its declared mechanisms that the settings make inert and,
    priced with the first round's plan, most clients never
    able to deliver an update (fixed stragglers under a rule that keeps only finished work)."""
    algorithm = world.algorithm
    found = list(Hooks(config.algorithm_name, 0).call("caveats", algorithm.reporting.caveats))
    found += inert_mechanism_lines(config, world)
    found += energy_budget_caveats(config, world)
    selection = config.selection.options("rule")
    found += getattr(selection, "caveats", lambda clients: [])(world.num_clients)
    first = first_round(config, world, algorithm_state)
    if first is None:
        return found
    _, _, asked, _, per_client = first
    never = int(np.sum((per_client < NEVER) & asked))
    if asked.any() and never > MOSTLY * int(asked.sum()):
        what = {"layers": "the top layer of its steps", "steps": "one local step"}.get(
            algorithm.partial_work, "all its planned work"
        )
        found.append(
            f"{never} of {int(asked.sum())} clients can never deliver an update (algorithm "
            f"{config.algorithm_name!r} needs {what} by the deadline under system.model = "
            f"{config.system.model!r}): the run says nothing about them"
        )
    return found


def energy_budget_caveats(config, world) -> list[str]:
    """``run.energy_budget`` that can never bind: at or above what every client spends
    drawing its highest power (training, communicating or waiting) for the whole
    ``run.time_budget``, the most any run of that budget can spend."""
    run = config.run
    if not (run.energy_budget and run.time_budget) or world.power is None:
        return []
    power = world.power
    highest = float(np.maximum(np.maximum(power.train, power.upload), power.idle).sum())
    ceiling = highest * run.time_budget
    if run.energy_budget < ceiling:
        return []
    return [
        f"run.energy_budget = {run.energy_budget:g} J can never bind: {len(power.train)} clients at their "
        f"highest draws ({highest:.4g} W together) for the whole run.time_budget = {run.time_budget:g} s "
        f"spend at most {ceiling:.4g} J; the time budget ends the run"
    ]


def check_first_round(config, world, algorithm_state: dict) -> None:
    """Refuse, in one line, a run whose first round's plan cannot deliver a single update
    over the run's rounds (ADEL-FL Lemma 1's reach probabilities, or their step analogue)."""
    algorithm, system = world.algorithm, world.server_system
    first = first_round(config, world, algorithm_state)
    if first is None:
        return
    plan, work, asked, marginals, delivering = first
    layers = world.flat.num_layers
    per_client = delivering * asked
    expected = float(np.sum(per_client)) * config.run.rounds
    if expected >= NOTHING:
        return
    name, model = config.run.name, config.system.model
    present = float(np.sum(np.asarray(marginals.participation_prob, float) * asked)) * config.run.rounds
    if present < NOTHING:
        raise FedhetError(
            f"{name}: no client takes part: the expected number of present clients over "
            f"{counted(config.run.rounds, 'round')} is {present:.3g} (system.model = {model!r}, its "
            "participation or availability); nothing would be trained"
        )
    what = {"layers": "the top layer of its steps", "steps": "one local step"}.get(
        algorithm.partial_work, "all its work"
    )
    if work.extra_gradients is not None:
        what += " after its extra evaluations"
    deadline = f"{plan.deadline:g} s" if plan.deadline is not None else "none"
    fastest = least_work_time(system, work, algorithm.partial_work, layers)
    needs = (
        f"the fastest client needs {fastest:.3g} s for {what}"
        if fastest is not None
        else (f"no client can finish {what} in time")
    )
    raise FedhetError(
        f"{name}: no client can deliver an update by the deadline ({deadline}): {needs} "
        f"(system.model = {model!r}, algorithm {config.algorithm_name!r}; expected updates over the run "
        f"{expected:.3g}); raise system.deadline or lower the work per client (run.max_empty_rounds = 0 "
        "runs it anyway)"
    )
