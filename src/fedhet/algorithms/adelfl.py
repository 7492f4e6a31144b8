"""ADEL-FL (ADEL-FL Algorithm 1): deadlines and batch sizes planned once against the time
budget, then SALF's layer-wise aggregation every round.

Before round 1 the server solves Problem 2 (:mod:`fedhet.algorithms.deadline_planner`) for
deadlines T_1..T_R and batch scale m; client u uses the batch S_u = ceil(m P_u) in every
round. Each round has deadline T_t, clients back-propagate under the exponential model
(A4), and the server applies eq. (5) with p_l(T_t, m) taken from the system model's
marginals for the batch sizes actually used (Lemma 1, exact for the rounded S_u).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.algorithms.base import ClientAssignment, RoundPlan, RunSetting, register
from fedhet.algorithms.deadline_planner import (
    BoundConstants,
    DeadlinePlan,
    DeadlineProblem,
    batch_sizes,
    equal_plan,
    solve,
)
from fedhet.algorithms.parts import Planner, Reporting
from fedhet.algorithms.salf import SALF, SALFOptions
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask
from fedhet.system.base import LayerTimeLaw


@dataclass
class ADELFLOptions(SALFOptions):
    """Constants of Theorem 1 and the planner's settings (defaults are ours: the paper gives
    none).

    - ``rho_c`` (strong convexity, weights rounds by prod(1 - eta rho_c); needs
      eta_t rho_c < 1), ``rho_s`` (smoothness; only checked against eta_1 <= 1/(4 rho_s)),
      ``grad_bound`` G (A3), ``grad_variance`` sigma^2 (A2, per sample, all clients),
      ``heterogeneity_gap`` Gamma, ``initial_distance`` Delta_1. Gamma and Delta_1 add
      constants to the bound and do not change the plan.
    - ``estimate_constants``: replace G and sigma_u^2 by estimates from a warm-up round at
      the initial model: every client answers a probe task with ``warmup_batches`` minibatch
      gradients of ``train.batch_size``; G^2 = the largest client mean squared gradient
      norm, sigma_u^2 = batch size x the variance of client u's batch gradients. The warm-up
      is not charged to the clock.
    - ``p1_margin``: enforce q_t1 <= 1/2 - margin (Lemma 3). ``batch_scale_min/max``: the
      box on m (the batch of a mean-capability client). ``max_iter``: trust-constr's limit.
    - ``time_aware_lr`` (our variant): the learning-rate schedule runs on simulated time
      instead of the round index — round t gets eta(s_t / (T_max / R)), s_t = the planned
      time before round t (the sum of the earlier deadlines), so rounds the planner makes
      long also advance the schedule further. The bound's round weights use these rates; the
      plan and the rates are solved alternately until they agree (a fixed point, at most
      ``time_aware_iterations`` solves). Under equal deadlines it is the per-round schedule.
    - ``plan``: "optimised" (Problem 2) or "equal": no optimisation, equal deadlines T_max / R
      and S_u = ceil(``batch_scale`` P_u) — the "SALF" baseline of the ADEL-FL authors' plots
      (equal deadlines with m = 1), with ADEL-FL's aggregation.
    """

    rho_c: float = 0.1
    rho_s: float = 1.0
    grad_bound: float = 1.0
    grad_variance: float = 1.0
    heterogeneity_gap: float = 0.0
    initial_distance: float = 1.0
    estimate_constants: bool = False
    warmup_batches: int = 8
    p1_margin: float = 0.05
    batch_scale_min: float = 1.0  # the smallest batch scale m the planner may choose
    batch_scale_max: float = 64.0  # the largest batch scale m the planner may choose
    max_iter: int = 3000
    plan: str = "optimised"
    batch_scale: float = 1.0  # plan = "equal": the fixed m
    time_aware_lr: bool = False
    time_aware_iterations: int = 20

    def validate(self) -> None:
        super().validate()
        if self.time_aware_iterations < 1:
            raise ConfigError(f"algorithm.time_aware_iterations = {self.time_aware_iterations}: must be >= 1")
        if self.plan not in ("optimised", "equal"):
            raise ConfigError(f"algorithm.plan = {self.plan!r}: must be 'optimised' or 'equal'")
        if self.batch_scale <= 0:
            raise ConfigError(f"algorithm.batch_scale = {self.batch_scale}: must be > 0")
        for key in ("rho_c", "rho_s", "grad_bound", "grad_variance", "initial_distance"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"algorithm.{key} = {getattr(self, key)}: must be > 0")
        if self.heterogeneity_gap < 0:
            raise ConfigError(f"algorithm.heterogeneity_gap = {self.heterogeneity_gap}: must be >= 0")
        if not 0 < self.p1_margin < 0.5:
            raise ConfigError(f"algorithm.p1_margin = {self.p1_margin}: must be in (0, 0.5)")
        if not 0 < self.batch_scale_min <= self.batch_scale_max:
            raise ConfigError(
                f"algorithm.batch_scale_min/max = {self.batch_scale_min}/{self.batch_scale_max}: "
                "need 0 < min <= max"
            )
        if self.warmup_batches < 2:
            raise ConfigError(f"algorithm.warmup_batches = {self.warmup_batches}: must be >= 2")
        if self.max_iter < 1:
            raise ConfigError(f"algorithm.max_iter = {self.max_iter}: must be >= 1")


class ADELFLPlanner(Planner):
    """ADEL-FL's planner: the deadlines T_1..T_R and batch scale m that minimise the Theorem 1
    bound (Problem 2, Algorithm 1), solved before round 1 from probed gradient statistics."""

    def probe_tasks(self, setting: RunSetting) -> list[ClientTask]:
        """With ``estimate_constants``: one gradient probe per client at the initial model."""
        if not self.options.estimate_constants:
            return []
        return [
            ClientTask(
                round=0,
                client=u,
                lr=0.0,
                batch_size=self.train.batch_size,
                local_steps=0,
                kind="probe",
                payload={"batches": self.options.warmup_batches},
            )
            for u in range(setting.num_clients)
        ]

    def plan(self, round_index: int, state: dict, system, deadline) -> RoundPlan:
        """Round t: the planned deadline T_t and batches S_u, one entry per client."""
        deadlines = state["deadlines"]
        t = min(round_index, len(deadlines) - 1)
        rates = state.get("learning_rates")
        return RoundPlan(
            round=round_index,
            deadline=deadlines[t],
            lr=rates[t] if self.options.time_aware_lr and rates else self.lr_at(round_index),
            assignments=[ClientAssignment(int(s), self.train.local_steps) for s in state["batch_sizes"]],
        )

    @staticmethod
    def _time_law(setting: RunSetting) -> LayerTimeLaw:
        """The exponential model's law the plan is solved against, with the run it needs:
        always-present clients and a total time budget (ADEL-FL A4, Problem 2)."""
        system = setting.system
        if not system.always_present:
            raise ConfigError(
                'system.participation: adel-fl plans for clients that are always present; set it to "always"'
            )
        law = system.time_law()
        if not isinstance(law, LayerTimeLaw):
            raise ConfigError(
                f"system.model = {system.name!r}: adel-fl plans against the exponential model "
                '(ADEL-FL A4); set system.model = "exponential"'
            )
        if not setting.time_budget:
            raise ConfigError("run.time_budget: adel-fl needs a total time budget T_max (simulated seconds)")
        return law

    def _bound_constants(self, setting: RunSetting) -> tuple[BoundConstants, dict | None]:
        """Theorem 1's constants: the options', or G^2 and sigma_u^2 estimated from the
        probes (``estimate_constants``; what was estimated, else None)."""
        o = self.options
        constants = BoundConstants(
            rho_c=o.rho_c,
            rho_s=o.rho_s,
            grad_bound=o.grad_bound,
            grad_variance=o.grad_variance,
            heterogeneity_gap=o.heterogeneity_gap,
            initial_distance=o.initial_distance,
        )
        if o.estimate_constants:
            return self._estimate_constants(setting, constants)
        return constants, None

    def init_state(self, setting: RunSetting) -> dict:
        """Solve Problem 2 once (ADEL-FL Algorithm 1, steps 1-3)."""
        system, law = setting.system, self._time_law(setting)
        o = self.options
        constants, estimated = self._bound_constants(setting)
        learning_rates = np.array([self.lr_at(t) for t in range(setting.rounds)])

        def planned(rates: np.ndarray) -> tuple[DeadlineProblem, DeadlinePlan]:
            problem = DeadlineProblem(
                time_budget=setting.time_budget,
                num_layers=system.num_layers,
                capabilities=law.capabilities,
                time_per_sample_layer=law.time_per_sample_layer,
                learning_rates=rates,
                constants=constants,
                batch_scale_bounds=(o.batch_scale_min, o.batch_scale_max),
                p1_max=0.5 - o.p1_margin,
            )
            if o.plan == "equal":
                return problem, equal_plan(problem, o.batch_scale)
            start = float(self.train.batch_size)
            return problem, solve(problem, initial_batch_scale=start, max_iter=o.max_iter)

        problem, plan = planned(learning_rates)
        solves = 1
        while o.time_aware_lr and solves < o.time_aware_iterations:
            rates = self.time_learning_rates(plan.deadlines, setting.time_budget)
            if np.allclose(rates, learning_rates, rtol=1e-6, atol=0.0):
                break
            learning_rates = rates
            problem, plan = planned(learning_rates)
            solves += 1
        sizes = batch_sizes(plan.batch_scale, law.capabilities, setting.client_sizes)
        report = self._report(plan, problem, sizes, estimated, learning_rates)
        if o.time_aware_lr:
            report["time_aware_solves"] = solves
        return {
            "deadlines": [float(t) for t in plan.deadlines],
            "batch_sizes": [int(s) for s in sizes],
            "learning_rates": [float(e) for e in learning_rates],
            "plan": report,
        }

    def time_learning_rates(self, deadlines, time_budget: float) -> np.ndarray:
        """eta(s_t / (T_max / R)) for each round t, s_t = sum of the deadlines before t: the
        schedule on planned simulated time, in units of the equal deadline."""
        deadlines = np.asarray(deadlines, float)
        before = np.concatenate([[0.0], np.cumsum(deadlines)[:-1]])
        unit = time_budget / len(deadlines)
        return np.array([self.lr_at(x) for x in before / unit])

    def _estimate_constants(self, setting: RunSetting, constants: BoundConstants):
        """G^2 and sigma_u^2 from the clients' probe replies at the initial model (our option)."""
        replies = sorted(setting.probes, key=lambda u: u.client)
        if len(replies) != setting.num_clients:
            raise ValueError(f"adel-fl: {len(replies)} probe replies for {setting.num_clients} clients")
        norms = [float(r.payload["grad_sq_norm"]) for r in replies]
        variances = [float(r.payload["grad_variance"]) for r in replies]
        grad_bound = float(np.sqrt(max(norms)))
        variances = np.maximum(np.array(variances), 1e-12)
        constants = BoundConstants(
            rho_c=constants.rho_c,
            rho_s=constants.rho_s,
            grad_bound=grad_bound,
            grad_variance=variances,
            heterogeneity_gap=constants.heterogeneity_gap,
            initial_distance=constants.initial_distance,
        )
        estimated = {
            "grad_bound": grad_bound,
            "grad_variance": [float(v) for v in variances],
            "warmup_batches": self.options.warmup_batches,
            "batch_size": self.train.batch_size,
        }
        return constants, estimated

    def _report(self, plan: DeadlinePlan, problem: DeadlineProblem, sizes, estimated, learning_rates) -> dict:
        c = problem.constants
        report = plan.to_dict()
        report.update(
            {
                "batch_sizes": [int(s) for s in sizes],
                "capabilities": [float(p) for p in problem.capabilities],
                "min_deadline": problem.min_deadline(plan.batch_scale),
                "time_budget": problem.time_budget,
                "rounds": problem.num_rounds,
                "learning_rates": [float(e) for e in learning_rates],
                "constants": {
                    "rho_c": c.rho_c,
                    "rho_s": c.rho_s,
                    "grad_bound": float(c.grad_bound),
                    "grad_variance": np.asarray(c.grad_variance, float).tolist(),
                    "heterogeneity_gap": c.heterogeneity_gap,
                    "initial_distance": c.initial_distance,
                },
                "estimated": estimated,
                "step_size_condition": bool(learning_rates[0] <= 1.0 / (4.0 * c.rho_s)),
            }
        )
        return report


class ADELFLReporting(Reporting):
    """ADEL-FL's plan (deadlines, batch sizes, the bound's constants) and its fallbacks."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"plan": state["plan"]}

    def warnings(self, state: dict) -> list[str]:
        plan = state["plan"]
        notes = []
        if plan["status"].startswith("fallback"):
            notes.append(
                f"adel-fl planner did not find a better schedule ({plan['solver_message']}); "
                "using equal deadlines T_max/R, see plan.json"
            )
        if not plan["step_size_condition"]:
            notes.append(
                f"adel-fl: eta_1 = {plan['learning_rates'][0]:g} > 1/(4 rho_s) = "
                f"{1 / (4 * plan['constants']['rho_s']):g}; Theorem 1's condition does not hold "
                "(the bound still guides the plan)"
            )
        return notes


@register
class ADELFL(SALF):
    """Planned deadlines T_t and batches S_u = ceil(m P_u) (Problem 2), SALF aggregation
    with p_l(T_t, m) (ADEL-FL eq. (5), Lemma 1); layers nobody reached are kept."""

    name = "adel-fl"
    summary = "ADEL-FL: deadlines and batch sizes optimised for a time budget, layer-wise aggregation"
    Options = ADELFLOptions
    Planner = ADELFLPlanner
    Reporting = ADELFLReporting
