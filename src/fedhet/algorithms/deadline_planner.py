"""ADEL-FL's planner: per-round deadlines T_1..T_R and batch scale m minimising Theorem 1's
bound (ADEL-FL Problem 2) under a total time budget.

The bound (ADEL-FL Theorem 1) is

    J = prod_t (1 - eta_t rho_c) Delta_1 + sum_t W_t (B + C_t),
    W_t = eta_t^2 prod_{tau > t} (1 - eta_tau rho_c),
    B   = (1 / (m U^2)) sum_u sigma_u^2 / P_u + 6 rho_s Gamma,
    C_t = G^2 4U/(U-1) sum_{l=1..L} (1 + q_tl) / (1 - 2 q_tl),
    q_tl = Q(L+1-l, T_t / (tau m))^U                     (ADEL-FL Lemma 1),

with Q the regularised upper incomplete gamma function and tau the time one sample costs a
layer of a capability-1 client (so a client's mean layer time is tau S_u / P_u ~ tau m).
Delta_1 and Gamma shift J by a constant and do not move its minimiser; they only change the
reported objective.

Constraints: sum_t T_t <= T_max; q_t1 <= 1/2 - margin (Lemma 3 needs p_1 < 1/2, and the
bound is meaningless, even negative, beyond it); m in a box. The p_1 constraint is linear:
Q(L, x)^U <= c  <=>  x >= x_min = Q^{-1}(L, c^{1/U}), i.e. T_t >= tau x_min m. We therefore
optimise the slack s_t = T_t - tau x_min m >= 0 and m, so every iterate keeps q_t1 below
1/2 (variable bounds are kept feasible by trust-constr), and solve with
``scipy.optimize.minimize(method="trust-constr")`` with the analytic gradient.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from fedhet.errors import ConfigError


@dataclass
class BoundConstants:
    """Constants of ADEL-FL's Theorem 1 (assumptions A1-A3).

    ``rho_c``/``rho_s``: strong convexity / smoothness; ``grad_bound``: G (A3);
    ``grad_variance``: sigma_u^2 per client or one value for all (A2, per-sample variance, so
    a batch of S has variance sigma_u^2 / S); ``heterogeneity_gap``: Gamma;
    ``initial_distance``: Delta_1 = E||w_1 - w_opt||^2.
    """

    rho_c: float = 0.1
    rho_s: float = 1.0
    grad_bound: float = 1.0
    grad_variance: float | np.ndarray = 1.0
    heterogeneity_gap: float = 0.0
    initial_distance: float = 1.0


@dataclass
class DeadlineProblem:
    """ADEL-FL Problem 2 for one run.

    ``learning_rates``: eta_1..eta_R. ``capabilities``: P_u (mean 1 after normalisation).
    ``time_per_sample_layer``: tau. ``batch_scale_bounds``: the box on m (samples per unit
    capability). ``p1_max``: the largest q_t1 allowed (1/2 minus a margin).
    """

    time_budget: float
    num_layers: int
    capabilities: np.ndarray
    time_per_sample_layer: float
    learning_rates: np.ndarray
    constants: BoundConstants = field(default_factory=BoundConstants)
    batch_scale_bounds: tuple[float, float] = (1.0, 64.0)
    p1_max: float = 0.45

    def __post_init__(self) -> None:
        self.capabilities = np.asarray(self.capabilities, dtype=float)
        self.learning_rates = np.asarray(self.learning_rates, dtype=float)
        lo, hi = self.batch_scale_bounds
        if not 0 < lo <= hi:
            raise ConfigError(f"batch scale box [{lo}, {hi}]: need 0 < min <= max")
        if not 0 < self.p1_max < 0.5:
            raise ConfigError(f"p_1 limit {self.p1_max}: must be in (0, 0.5) (ADEL-FL Lemma 3)")
        if self.time_budget <= 0:
            raise ConfigError("run.time_budget: ADEL-FL needs a total time budget T_max > 0")
        if self.num_clients < 2:
            raise ConfigError("data.num_clients: ADEL-FL's bound needs at least 2 clients (4U/(U-1))")
        steps = self.learning_rates * self.constants.rho_c
        if np.any(steps >= 1.0) or np.any(steps < 0):
            raise ConfigError(
                f"algorithm.rho_c = {self.constants.rho_c}: eta_t * rho_c must stay in [0, 1) "
                f"(largest eta_t = {self.learning_rates.max():g})"
            )

    @property
    def num_rounds(self) -> int:
        return int(self.learning_rates.size)

    @property
    def num_clients(self) -> int:
        return int(self.capabilities.size)

    # -- pieces of the bound ----------------------------------------------------------
    def round_weights(self) -> np.ndarray:
        """W_t = eta_t^2 prod_{tau > t}(1 - eta_tau rho_c) (ADEL-FL Theorem 1)."""
        contraction = 1.0 - self.learning_rates * self.constants.rho_c
        later = np.concatenate([np.cumprod(contraction[::-1])[::-1][1:], [1.0]])
        return self.learning_rates**2 * later

    def min_rate(self) -> float:
        """Smallest T/(tau m) with q_t1 = Q(L, T/(tau m))^U <= p1_max (Lemma 1 and 3)."""
        from scipy.special import gammainccinv

        return float(gammainccinv(self.num_layers, self.p1_max ** (1.0 / self.num_clients)))

    def min_deadline(self, batch_scale: float) -> float:
        """Shortest deadline that keeps q_t1 <= p1_max at batch scale m."""
        return self.time_per_sample_layer * self.min_rate() * batch_scale

    def no_reach_prob(self, deadlines: np.ndarray, batch_scale: float) -> np.ndarray:
        """q_tl = Q(L+1-l, T_t/(tau m))^U, shape [R, L] (ADEL-FL Lemma 1)."""
        from scipy.special import gammaincc

        rate = np.asarray(deadlines, float)[:, None] / (self.time_per_sample_layer * batch_scale)
        needed = np.arange(self.num_layers, 0, -1)[None, :]  # L+1-l for l = 1..L
        return gammaincc(needed, rate) ** self.num_clients

    def _variance_term(self) -> float:
        """sum_u sigma_u^2 / P_u / U^2 (the m-dependent part of B is this / m)."""
        sigma2 = np.broadcast_to(np.asarray(self.constants.grad_variance, float), self.capabilities.shape)
        return float(np.sum(sigma2 / self.capabilities)) / self.num_clients**2

    def objective(self, deadlines: np.ndarray, batch_scale: float) -> float:
        """Theorem 1's bound J(T_1..T_R, m) (ADEL-FL Problem 2)."""
        return self._objective_and_gradient(np.asarray(deadlines, float), batch_scale)[0]

    def _objective_and_gradient(self, deadlines: np.ndarray, m: float) -> tuple[float, np.ndarray, float]:
        from scipy.special import gammaincc, gammaln

        c = self.constants
        U, L, tau = self.num_clients, self.num_layers, self.time_per_sample_layer
        weights = self.round_weights()
        head = float(np.prod(1.0 - self.learning_rates * c.rho_c)) * c.initial_distance
        variance = self._variance_term()
        b_term = variance / m + 6.0 * c.rho_s * c.heterogeneity_gap
        rate = deadlines[:, None] / (tau * m)
        needed = np.arange(L, 0, -1)[None, :].astype(float)
        upper = gammaincc(needed, rate)
        q = np.minimum(upper**U, 0.5 - 1e-9)  # guards iterates that stray past p = 1/2
        scale = c.grad_bound**2 * 4.0 * U / (U - 1)
        c_terms = scale * np.sum((1.0 + q) / (1.0 - 2.0 * q), axis=1)
        value = head + float(np.sum(weights * (b_term + c_terms)))
        # d/dx Q(s, x) = -x^(s-1) e^(-x) / Gamma(s), the Poisson pmf at s-1
        pmf = np.exp((needed - 1.0) * np.log(np.maximum(rate, 1e-300)) - rate - gammaln(needed))
        dq_drate = -U * upper ** (U - 1) * pmf
        dc_drate = scale * 3.0 / (1.0 - 2.0 * q) ** 2 * dq_drate  # d/dq (1+q)/(1-2q) = 3/(1-2q)^2
        grad_deadlines = weights * np.sum(dc_drate, axis=1) / (tau * m)
        grad_m = float(np.sum(weights * (-variance / m**2 + np.sum(dc_drate * (-rate / m), axis=1))))
        return value, grad_deadlines, grad_m


@dataclass
class DeadlinePlan:
    """The planner's answer, written to the run directory as ``plan.json``."""

    deadlines: np.ndarray
    batch_scale: float
    objective: float
    equal_deadlines_objective: float
    status: str  # "optimal", "time limit: ..." (the best iterate when time ran out), or "fallback: <why>"
    solver_message: str
    iterations: int
    no_reach_first_layer: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def fell_back(self) -> bool:
        return self.status.startswith("fallback")

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "solver_message": self.solver_message,
            "iterations": self.iterations,
            "objective": self.objective,
            "equal_deadlines_objective": self.equal_deadlines_objective,
            "batch_scale": self.batch_scale,
            "deadlines": [float(t) for t in self.deadlines],
            "total_time": float(np.sum(self.deadlines)),
            "no_reach_first_layer": [float(q) for q in self.no_reach_first_layer],
        }


def equal_deadlines(problem: DeadlineProblem) -> np.ndarray:
    """T_t = T_max / R for every round (the baselines' schedule, ADEL-FL Sec. 4)."""
    return np.full(problem.num_rounds, problem.time_budget / problem.num_rounds)


def feasible_batch_scale(problem: DeadlineProblem, preferred: float) -> float:
    """``preferred`` clipped into the box and lowered until equal deadlines keep q_t1 <= p1_max
    with room to spare (m at most 90% of the largest feasible value, or the box's lower end):
    an interior starting point, which trust-constr needs to move freely.

    Raises ConfigError when even the smallest m in the box cannot meet Lemma 3's condition.
    """
    lo, hi = problem.batch_scale_bounds
    share = problem.time_budget / problem.num_rounds
    largest = share / (problem.time_per_sample_layer * problem.min_rate())
    if largest < lo:
        need = problem.num_rounds * problem.min_deadline(lo)
        raise ConfigError(
            f"run.time_budget = {problem.time_budget:g}: too small for {problem.num_rounds} rounds; "
            f"ADEL-FL needs p_1 < 1/2 in every round, i.e. T_max >= {need:.4g} at the smallest "
            f"batch scale {lo:g} (lower algorithm.batch_scale_min or run.rounds, or raise the budget)"
        )
    return float(min(max(preferred, lo), hi, max(lo, 0.9 * largest)))


def solve(
    problem: DeadlineProblem, initial_batch_scale: float, max_iter: int = 3000, time_limit: float = 60.0
) -> DeadlinePlan:
    """Solve ADEL-FL Problem 2 with trust-constr, starting from equal deadlines.

    Each solve stops after ``time_limit`` seconds of host time (some budgets and constants
    make trust-constr take tens of minutes); its last iterate is then used if it meets the
    constraints and beats equal deadlines (status ``time limit: ...``), otherwise the start
    falls back as a failed solve does.

    Variables are scaled to O(1): slacks in units of T_max/R and m in units of the box's
    upper end. A solution that violates a constraint, fails to converge or is worse than
    equal deadlines is not used; after a second start (equal deadlines, m halfway to the
    box's lower end) fails too, the plan falls back to equal deadlines at the starting m and
    says why in ``status``.
    """
    m0 = feasible_batch_scale(problem, initial_batch_scale)
    equal_value = problem.objective(equal_deadlines(problem), m0)
    plan = _solve_from(problem, m0, m0, equal_value, max_iter, time_limit)
    lo = problem.batch_scale_bounds[0]
    if plan.fell_back and m0 > lo:
        retry = _solve_from(problem, 0.5 * (m0 + lo), m0, equal_value, max_iter, time_limit)
        if not retry.fell_back:
            return retry
    return plan


def _solve_from(
    problem: DeadlineProblem, start: float, m0: float, equal_value: float, max_iter: int, time_limit: float
) -> DeadlinePlan:
    """One trust-constr solve from equal deadlines at batch scale ``start``, stopped after
    ``time_limit`` seconds; the fallback is equal deadlines at ``m0``."""
    from scipy.optimize import BFGS, Bounds, LinearConstraint, minimize

    R = problem.num_rounds
    equal = equal_deadlines(problem)
    share = problem.time_budget / R
    lo, hi = problem.batch_scale_bounds
    a = problem.time_per_sample_layer * problem.min_rate()  # T_t = a m + s_t
    m_unit = hi

    def unpack(z: np.ndarray) -> tuple[np.ndarray, float]:
        m = z[-1] * m_unit
        return a * m + z[:-1] * share, m

    def fun(z: np.ndarray) -> tuple[float, np.ndarray]:
        deadlines, m = unpack(z)
        value, g_t, g_m = problem._objective_and_gradient(deadlines, m)
        grad = np.empty_like(z)
        grad[:-1] = g_t * share
        grad[-1] = (g_m + a * np.sum(g_t)) * m_unit
        return value / equal_value, grad / equal_value

    z0 = np.concatenate([(equal - a * start) / share, [start / m_unit]])
    budget_row = np.concatenate([np.full(R, share), [R * a * m_unit]])  # sum_t T_t
    constraint = LinearConstraint(budget_row[None, :], -np.inf, problem.time_budget)
    bounds = Bounds(
        np.concatenate([np.zeros(R), [lo / m_unit]]),
        np.concatenate([np.full(R, np.inf), [hi / m_unit]]),
        keep_feasible=True,
    )
    started = time.monotonic()

    def out_of_time(intermediate_result) -> None:
        if time.monotonic() - started > time_limit:
            raise StopIteration  # trust-constr ends with status 3 and its last iterate

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="delta_grad == 0.0")  # BFGS at a converged point
            # overflow/0/0 inside the solver at extreme budgets: its status reports the failure
            warnings.filterwarnings("ignore", category=RuntimeWarning)
            result = minimize(
                fun,
                z0,
                jac=True,
                hess=BFGS(),
                method="trust-constr",
                constraints=[constraint],
                bounds=bounds,
                options={"maxiter": max_iter, "gtol": 1e-9, "xtol": 1e-10},
                callback=out_of_time,
            )
    except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:  # numerical breakdown
        return _fallback(problem, m0, f"solver error: {exc}", 0)
    deadlines, m = unpack(np.clip(result.x, bounds.lb, bounds.ub))
    excess = deadlines.sum() - problem.time_budget
    if excess > 0:  # trust-constr meets linear constraints to ~1e-8: take the excess off the slack
        slack = deadlines - a * m
        if excess > 1e-6 * problem.time_budget or slack.sum() <= excess:
            return _fallback(problem, m0, f"budget violated by {excess:.3g}", result.niter)
        deadlines = a * m + slack * (1 - excess / slack.sum())
    value = problem.objective(deadlines, m)
    timed_out = result.status == 3
    if result.status not in (1, 2) and not timed_out:
        return _fallback(problem, m0, f"not converged ({result.message})", result.niter)
    if not np.isfinite(value) or value > equal_value * (1 + 1e-9):
        why = "time limit" if timed_out else "solution"
        return _fallback(problem, m0, f"{why} {value:.6g} worse than equal deadlines", result.niter)
    status = (
        f"time limit: best iterate after {time_limit:g} s, {result.niter} iterations"
        if timed_out
        else "optimal"
    )
    return DeadlinePlan(
        deadlines=deadlines,
        batch_scale=float(m),
        objective=value,
        equal_deadlines_objective=equal_value,
        status=status,
        solver_message=str(result.message),
        iterations=int(result.niter),
        no_reach_first_layer=problem.no_reach_prob(deadlines, m)[:, 0],
    )


def equal_plan(
    problem: DeadlineProblem,
    batch_scale: float,
    status: str = "equal deadlines (not optimised)",
    message: str = "algorithm.plan = 'equal'",
    iterations: int = 0,
) -> DeadlinePlan:
    """Equal deadlines T_max / R at the batch scale ``batch_scale``, the bound evaluated for
    the report: ``plan = "equal"`` (the ADEL-FL authors' "SALF" baseline uses m = 1), and the
    solver's fallback."""
    equal = equal_deadlines(problem)
    value = problem.objective(equal, batch_scale)
    return DeadlinePlan(
        deadlines=equal,
        batch_scale=float(batch_scale),
        objective=value,
        equal_deadlines_objective=value,
        status=status,
        solver_message=message,
        iterations=int(iterations),
        no_reach_first_layer=problem.no_reach_prob(equal, batch_scale)[:, 0],
    )


def _fallback(problem, m0, why, iterations) -> DeadlinePlan:
    return equal_plan(problem, m0, f"fallback: {why}", why, iterations)


def batch_sizes(batch_scale: float, capabilities: np.ndarray, client_sizes: np.ndarray) -> np.ndarray:
    """S_u = ceil(m P_u), at least 1 and at most the client's number of samples (ADEL-FL Sec. 3.1)."""
    sizes = np.ceil(batch_scale * np.asarray(capabilities, float) - 1e-9).astype(int)
    return np.clip(sizes, 1, np.maximum(np.asarray(client_sizes, int), 1))
