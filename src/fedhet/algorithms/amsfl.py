"""AMSFL (AMSFL Sec. 3, Algorithm 1): per-round local step counts chosen under a time budget,
from smoothness and drift estimates made by Gradient Difference Approximation (GDA).

Each round the server assigns client i a number of local steps t_i >= 1 so that
sum_i (c_i t_i + b_i) <= S (Sec. 3.4), trading progress (alpha sum_i w_i t_i, alpha =
2 eta sqrt(mu) G_k) against drift (beta sum_i w_i t_i (t_i - 1) / 2, beta = eta^2 L^2 G^2 / 2).
Clients report, along their local steps, ||grad F_i(w_i,t) - grad F_i(w^(k))|| and
||w_i,t - w^(k)|| (both gradients on the same batch; no Hessian, Sec. 3.2, Prop. 3.3), from
which the server estimates L, G and G_k for the next round. Aggregation is the weighted
average of the local models (w_i = n_i / n); the round lasts max_i (c_i t_i + b_i).

Two allocation rules:

- ``paper``: Algorithm 1 as printed: starting from t_i = 1, repeatedly add a step to
  argmin_i (alpha w_i + beta w_i (2 t_i - 1) / 2) / c_i. Dividing by c_i favours slow
  clients, which contradicts the paper's Theorem 3.4 and its discussion ("more steps are
  assigned to lower-cost clients").
- ``marginal`` (default, ours): treat alpha w_i t_i as progress and the drift term as its
  cost, i.e. maximise sum_i w_i (alpha t_i - beta t_i (t_i - 1) / 2), and add the step whose
  net gain w_i (alpha - beta t_i) per second of budget c_i is largest, while it is positive.
  Cheaper clients get more steps. Its continuous optimum (KKT) is
  t_i = 1/2 + (alpha - lambda c_i / w_i) / beta, decreasing in c_i; Theorem 3.4's
  t_i ~ c_i^(-1/2) does not follow from the printed objective with either rule.

Both rules only add a step that still fits the budget (the printed loop ``while T < S``
can overshoot S by one step) and cap t_i at ``max_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.algorithms.base import ClientAssignment, RoundPlan, RunSetting, register
from fedhet.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhet.errors import ConfigError

ALLOCATIONS = ("marginal", "paper")
COSTS = ("known", "estimated")


def greedy_steps(
    weights: np.ndarray,
    step_cost: np.ndarray,
    comm_cost: np.ndarray,
    budget: float,
    alpha: float,
    beta: float,
    allocation: str = "marginal",
    max_steps: int = 50,
) -> np.ndarray:
    """Local step counts t_i >= 1 with sum_i (c_i t_i + b_i) <= S (AMSFL Algorithm 1).

    ``paper``: add a step to argmin_i (alpha w_i + beta w_i (2 t_i - 1)/2) / c_i (line 5).
    ``marginal``: add a step to argmax_i w_i (alpha - beta t_i) / c_i while positive.
    Only steps that fit the budget are added; t_i <= ``max_steps``. If even one step each
    does not fit, every t_i is 1."""
    w = np.asarray(weights, float)
    c = np.asarray(step_cost, float)
    steps = np.ones(len(w), dtype=int)
    used = float(np.sum(c + np.asarray(comm_cost, float)))
    tolerance = 1e-12 * max(budget, 1.0)
    while True:
        fits = (used + c <= budget + tolerance) & (steps < max_steps)
        if allocation == "paper":
            score = (alpha * w + beta * w * (2 * steps - 1) / 2) / c  # Algorithm 1, line 5
            score = np.where(fits, score, np.inf)
            if not np.isfinite(score).any():
                break
            j = int(np.argmin(score))
        else:
            gain = w * (alpha - beta * steps) / c  # net gain of step t_i + 1 per second
            gain = np.where(fits, gain, -np.inf)
            if not (gain > 0).any():
                break
            j = int(np.argmax(gain))
        steps[j] += 1
        used += c[j]
    return steps


@dataclass
class GDAEstimates:
    """Server-side estimates from one round's GDA reports (AMSFL Sec. 3.2-3.3):
    ``smoothness`` L = max over clients and steps of ||Delta g_t|| / ||w_t - w^(k)||;
    ``grad_bound`` G = max gradient norm seen (A2); ``round_grad`` G_k = sum_i w_i
    ||grad F_i(w^(k))||, the weighted norm of the clients' gradients at the round's model."""

    smoothness: float
    grad_bound: float
    round_grad: float


def gda_estimates(reports: list[dict], weights: np.ndarray) -> GDAEstimates | None:
    """Turn clients' GDA reports (``ratio_max``, ``grad_norm_max``, ``grad_norm_anchor``)
    into L, G and G_k; ``None`` when no client reported a step that moved its model."""
    ratios = [r["ratio_max"] for r in reports if r["ratio_max"] > 0]
    if not reports or not ratios:
        return None
    w = np.asarray(weights, float)
    w = w / w.sum()
    return GDAEstimates(
        smoothness=float(max(ratios)),
        grad_bound=float(max(r["grad_norm_max"] for r in reports)),
        round_grad=float(sum(wi * r["grad_norm_anchor"] for wi, r in zip(w, reports, strict=True))),
    )


class StepCostEstimator:
    """Online least-squares fit of finish_time = c_i t_i + b_i per client from observed
    rounds (``costs = "estimated"``): c_i = f_i / t_i and b_i = 0 until a client has been
    seen with two different step counts."""

    def __init__(self, num_clients: int):
        self.sums = np.zeros((num_clients, 5))  # n, sum t, sum t^2, sum f, sum t f

    def observe(self, client: int, steps: int, finish_time: float) -> None:
        self.sums[client] += [1.0, steps, steps * steps, finish_time, steps * finish_time]

    def costs(self, default_step: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        n, st, stt, sf, stf = self.sums.T
        seen = n > 0
        mean_t = np.where(seen, st / np.maximum(n, 1), 1.0)
        mean_f = np.where(seen, sf / np.maximum(n, 1), default_step)
        var_t = np.where(seen, stt / np.maximum(n, 1) - mean_t**2, 0.0)
        cov = np.where(seen, stf / np.maximum(n, 1) - mean_t * mean_f, 0.0)
        fitted = var_t > 1e-9
        step = np.where(fitted, cov / np.where(fitted, var_t, 1.0), mean_f / mean_t)
        step = np.maximum(step, 1e-9)
        comm = np.where(fitted, np.maximum(mean_f - step * mean_t, 0.0), 0.0)
        return step, comm

    def state_dict(self) -> np.ndarray:
        return self.sums.copy()


@dataclass
class AMSFLOptions(FedAvgOptions):
    """``round_budget`` S (simulated seconds, the sum over clients of c_i t_i + b_i);
    ``mu`` (strong convexity in alpha); ``allocation`` = marginal | paper; ``costs`` = known
    (c_i, b_i from the per-step system model, without its jitter) | estimated (fitted
    online from observed finish times); ``max_steps``. ``weights`` defaults to ``samples``
    (w_i = n_i / n)."""

    weights: str = "samples"
    round_budget: float = 0.0
    mu: float = 0.1
    allocation: str = "marginal"
    costs: str = "known"
    max_steps: int = 50

    def validate(self) -> None:
        super().validate()
        if not self.round_budget > 0:
            raise ConfigError(
                f"algorithm.round_budget = {self.round_budget}: amsfl needs the per-round budget S > 0 "
                "(simulated seconds, summed over clients)"
            )
        if not self.mu > 0:
            raise ConfigError(f"algorithm.mu = {self.mu}: must be > 0")
        if self.allocation not in ALLOCATIONS:
            raise ConfigError(
                f"algorithm.allocation = {self.allocation!r}: must be one of {', '.join(ALLOCATIONS)}"
            )
        if self.costs not in COSTS:
            raise ConfigError(f"algorithm.costs = {self.costs!r}: must be one of {', '.join(COSTS)}")
        if self.max_steps < 1:
            raise ConfigError(f"algorithm.max_steps = {self.max_steps}: must be >= 1")


@register
class AMSFL(FedAvg):
    """Adaptive local steps under a per-round time budget (AMSFL Algorithm 1), GDA estimates,
    weighted averaging of the local models."""

    name = "amsfl"
    summary = "AMSFL: local steps per client chosen under a time budget from GDA drift estimates"
    Options = AMSFLOptions
    uses_deadline = False
    partial_work = "none"
    tracks_gradient_differences = True

    def init_state(self, setting: RunSetting) -> dict:
        sizes = np.asarray(setting.client_sizes, float)
        weights = (
            sizes / sizes.sum() if self.options.weights == "samples" else np.full(len(sizes), 1 / len(sizes))
        )
        o = self.options
        law = setting.system.time_law()
        if o.costs == "known" and (law is None or law.kind != "per-step"):
            raise ConfigError(
                f"system.model = {setting.system.name!r}: amsfl with known costs needs the per-step "
                'model (c_i, b_i); set system.model = "per-step" or algorithm.costs = "estimated"'
            )
        if o.costs == "known":
            batch = np.full(setting.num_clients, self.train.batch_size)
            step, comm = law.step_time(batch), law.comm_times()
            least = float(np.sum(step) + np.sum(comm))  # one step per client (Algorithm 1's t_i >= 1)
            if o.round_budget < least:
                raise ConfigError(
                    f"algorithm.round_budget = {o.round_budget:g}: below the least a round costs, "
                    f"{least:.4g} s (communication sum b_i = {np.sum(comm):.4g} s plus one step per client, "
                    f"sum c_i = {np.sum(step):.4g} s)"
                )
        return {
            "weights": weights,
            "estimates": None,
            "cost_sums": np.zeros((setting.num_clients, 5)),
            "history": [],
        }

    def _costs(self, state: dict, system, batch_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.options.costs == "known":
            law = system.time_law()
            return law.step_time(batch_sizes), law.comm_times()
        estimator = StepCostEstimator(len(batch_sizes))
        estimator.sums = state["cost_sums"]
        return estimator.costs()

    def plan(self, round_index: int, state: dict, system, deadline) -> RoundPlan:
        """AMSFL Algorithm 1 with alpha, beta from the last GDA estimates. Until the first
        estimates arrive every client runs ``train.local_steps`` (fewer, equally, if that
        does not fit the budget)."""
        o, lr = self.options, self.lr_at(round_index)
        batch = np.full(system.num_clients, self.train.batch_size)
        step_cost, comm_cost = self._costs(state, system, batch)
        est = state["estimates"]
        if est is None:
            alpha = beta = float("nan")
            affordable = int((o.round_budget - comm_cost.sum()) / max(step_cost.sum(), 1e-300) + 1e-9)
            steps = np.full(system.num_clients, max(1, min(self.train.local_steps, affordable, o.max_steps)))
        else:
            alpha = 2.0 * lr * np.sqrt(o.mu) * est["round_grad"]  # AMSFL Sec. 3.4
            beta = lr**2 * est["smoothness"] ** 2 * est["grad_bound"] ** 2 / 2.0
            steps = greedy_steps(
                state["weights"], step_cost, comm_cost, o.round_budget, alpha, beta, o.allocation, o.max_steps
            )
        state["history"].append(
            {
                "round": round_index + 1,
                "steps": steps.tolist(),
                "alpha": float(alpha),
                "beta": float(beta),
                **{k: float(v) for k, v in (est or {}).items()},
                "step_cost": [float(v) for v in step_cost],
                "comm_cost": [float(v) for v in comm_cost],
                "budget_used": float(np.sum(step_cost * steps + comm_cost)),
            }
        )
        return RoundPlan(
            round=round_index,
            deadline=None,
            lr=lr,
            assignments=[ClientAssignment(self.train.batch_size, int(t)) for t in steps],
        )

    # -- client: GDA along the local steps ---------------------------------------------------
    def observe_gradients(self, task, state, local_grad, anchor_grad, distance):
        """Record ||grad F_i(w_t) - grad F_i(w^(k))|| and ||w_t - w^(k)|| (same batch), and
        accumulate Delta_i^(t) = sum_t sum_{j<=t} Delta g_j (Sec. 3.2) for the drift check."""
        record = state.setdefault("gda", {"diff": [], "distance": [], "grad": [], "anchor": []})
        difference = local_grad - anchor_grad
        record["diff"].append(float(difference.norm()))
        record["distance"].append(float(distance))
        record["grad"].append(float(local_grad.norm()))
        record["anchor"].append(float(anchor_grad.norm()))
        cumulative = state.get("gda_cumulative")
        state["gda_cumulative"] = difference.clone() if cumulative is None else cumulative + difference
        total = state.get("gda_total")
        state["gda_total"] = (
            state["gda_cumulative"].clone() if total is None else total + state["gda_cumulative"]
        )

    def finish_local_work(self, task, update, state, region, local, anchor):
        record = state.pop("gda", None)
        state.pop("gda_cumulative", None)
        total = state.pop("gda_total", None)
        if not record:
            return
        diff, distance = np.array(record["diff"]), np.array(record["distance"])
        moved = distance > 0
        update.payload.update(
            {
                "gda_diff": torch.tensor(diff, dtype=torch.float32),
                "gda_distance": torch.tensor(distance, dtype=torch.float32),
                "ratio_max": float((diff[moved] / distance[moved]).max()) if moved.any() else 0.0,
                "grad_norm_max": float(max(record["grad"])),
                "grad_norm_anchor": float(record["anchor"][0]),
                "drift_norm": float(total.norm()) if total is not None else 0.0,
            }
        )

    # -- server ---------------------------------------------------------------------------
    def aggregate(self, params, buffers, updates, state, context, layout):
        """Weighted average of the local models (w_i = n_i / n); then L, G, G_k from GDA and,
        with ``costs = "estimated"``, the observed finish times."""
        new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
        reports = [u for u in updates if "ratio_max" in u.payload]
        estimates = gda_estimates([u.payload for u in reports], state["weights"][[u.client for u in reports]])
        if estimates is not None:
            state["estimates"] = estimates.__dict__
        if self.options.costs == "estimated":
            estimator = StepCostEstimator(context.num_clients)
            estimator.sums = state["cost_sums"]
            for u in updates:
                estimator.observe(u.client, u.steps, float(context.outcomes.finish_time[u.client]))
        history = state["history"][-1]
        history["drift_norm"] = [float(u.payload.get("drift_norm", 0.0)) for u in reports]
        est = state["estimates"] or {"smoothness": float("nan"), "grad_bound": float("nan")}
        history["drift_bound"] = [
            float(est["smoothness"] * est["grad_bound"] * u.steps * (u.steps - 1) / 2) for u in reports
        ]
        return new_params, new_buffers

    def reports(self, state: dict) -> dict[str, dict]:
        run_rounds = [h for h in state["history"] if "drift_norm" in h]  # not a plan cut by the budget
        return {"amsfl": {"estimates": state["estimates"], "rounds": run_rounds}}
