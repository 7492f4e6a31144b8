"""AMSFL (AMSFL Sec. 3, Algorithm 1): per-round local step counts chosen under a time budget,
from smoothness and drift estimates made by Gradient Difference Approximation (GDA).

Each round the server assigns client i a number of local steps t_i >= 1 so that
sum_i (c_i t_i + b_i) <= S (Sec. 3.4), trading progress (alpha sum_i w_i t_i, alpha =
2 eta sqrt(mu) G_k) against drift (beta sum_i w_i t_i (t_i - 1) / 2, beta = eta^2 L^2 G^2 / 2).
Clients report, along their local steps, ||grad F_i(w_i,t) - grad F_i(w^(k))|| and
||w_i,t - w^(k)|| (both gradients on the same batch; no Hessian, Sec. 3.2, Prop. 3.3), from
which the server estimates L, G and G_k for the next round. Aggregation is the weighted
average of the local models (w_i = n_i / n); the round lasts max_i (c_i t_i + b_i).

Three allocation rules:

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
- ``sqrt`` (ours): the diminishing-returns reading, minimise sum_i w_i / t_i subject to
  sum_i (c_i t_i + b_i) <= S, 1 <= t_i <= max_steps, whose solution is Theorem 3.4's
  t_i ~ (w_i / c_i)^(1/2) (:func:`sqrt_steps`). It needs no GDA estimate.
- ``gda-sqrt`` (ours): Theorem 3.4's shape driven by each client's own GDA estimates
  (:func:`gda_sqrt_weights`): the same minimisation with w_i replaced by w_i G_i,k / G_k,
  the client's share of the progress term (its gradient norm at the round's model), so
  t_i ~ (w_i G_i,k / c_i)^(1/2); and each t_i capped at the last step whose net gain in the
  printed objective is positive, t_i <= 1 + alpha_i / beta_i with alpha_i = 2 eta sqrt(mu)
  G_i,k and beta_i = eta^2 L_i^2 G_i^2 / 2 from the client's last reports (L_i its largest
  ||Delta g|| / ||Delta w||, G_i its largest gradient norm). Budget the cap frees is left
  unspent (the round ends sooner). Until a client has reported, its w_i and no cap are used.

GDA keeps estimating with one local step: a client that takes one step still reports the
gradient at the received model (its step's own gradient), so G_k and G follow the shrinking
gradient; when no client took two steps, L is estimated across rounds from the last two
global models and the clients' weighted mean gradients at them. Evaluating grad F_i(w^(k)) on
each later step's batch is one more forward and backward pass per step: with
``gda_cost = "charged"`` (default) the clock and the budget pay for it as one more step's time
c_i for each of steps 2..t_i (finish c_i (2 t_i - 1) + b_i); ``"free"`` is the paper's claim
that GDA costs nothing.

Both rules only add a step that still fits the budget (the printed loop ``while T < S``
can overshoot S by one step) and cap t_i at ``max_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedhet.algorithms.base import ClientAssignment, RoundPlan, RunSetting, register
from fedhet.algorithms.fedavg import FedAvg, FedAvgAggregation, FedAvgOptions
from fedhet.algorithms.mechanisms import Mechanism
from fedhet.algorithms.parts import ClientPart, Planner, Reporting
from fedhet.errors import ConfigError
from fedhet.system.base import StepTimeLaw

ALLOCATIONS = ("marginal", "paper", "sqrt", "gda-sqrt")
COSTS = ("known", "estimated")
GDA_COSTS = ("charged", "free")
PARETO_LIMIT = 50_000  # sqrt_steps: the exact search's front size beyond which it rounds instead


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


def sqrt_steps(
    weights: np.ndarray,
    step_cost: np.ndarray,
    comm_cost: np.ndarray,
    budget: float,
    max_steps: int = 50,
) -> np.ndarray:
    """Integer t_i minimising sum_i w_i / t_i subject to sum_i (c_i t_i + b_i) <= S and
    1 <= t_i <= max_steps (AMSFL Theorem 3.4 under the diminishing-returns reading).

    Derivation: the Lagrangian sum_i w_i / t_i + lambda (sum_i c_i t_i - S') with
    S' = S - sum_i b_i is stationary at -w_i / t_i^2 + lambda c_i = 0, i.e.
    t_i = (w_i / (lambda c_i))^(1/2): steps proportional to c_i^(-1/2) at equal weights, the
    theorem's claim. With the box 1 <= t_i <= M the KKT solution is
    t_i(lambda) = clip((w_i / (lambda c_i))^(1/2), 1, M), lambda > 0 fixed by
    sum_i c_i t_i(lambda) = S' (the objective decreases in every t_i, so the budget binds
    unless every t_i = M); :func:`sqrt_steps_continuous` solves it.

    Integers: an exact search over clients keeps, for each prefix of clients, the Pareto
    front of (budget used, objective) over their step counts (a choice dominated in both is
    never part of an optimum), so the result is the integer optimum. When the front would
    exceed ``PARETO_LIMIT`` entries (many clients) the KKT solution is rounded down and the
    budget filled step by step, each step to the client whose objective falls most per
    second, then single steps are moved between clients while that lowers the objective.
    If even one step each does not fit, every t_i is 1."""
    a = np.asarray(weights, float)
    c = np.asarray(step_cost, float)
    n = len(a)
    spare = float(budget) - float(np.sum(comm_cost))
    tolerance = 1e-12 * max(abs(float(budget)), 1.0)
    if n == 0 or spare < float(np.sum(c)) - tolerance:
        return np.ones(n, dtype=int)
    exact = _pareto_steps(a, c, spare, max_steps, tolerance)
    if exact is not None:
        return exact
    return _rounded_steps(a, c, spare, max_steps, tolerance)


def sqrt_steps_continuous(weights, step_cost, spare: float, max_steps: int) -> np.ndarray:
    """The KKT solution t_i(lambda) = clip((w_i / (lambda c_i))^(1/2), 1, M) with
    sum_i c_i t_i = ``spare`` (see :func:`sqrt_steps`); every t_i = M when that fits."""
    from scipy.optimize import brentq

    a, c = np.asarray(weights, float), np.asarray(step_cost, float)
    if float(np.sum(c)) * max_steps <= spare:
        return np.full(len(a), float(max_steps))

    def steps(log_lambda: float) -> np.ndarray:
        return np.clip(np.sqrt(a / (np.exp(log_lambda) * c)), 1.0, max_steps)

    root = brentq(lambda x: float(np.sum(c * steps(x))) - spare, -700.0, 700.0, xtol=1e-13)
    return steps(root)


def _pareto_steps(a, c, spare, max_steps, tolerance) -> np.ndarray | None:
    n = len(a)
    after = np.concatenate([np.cumsum(c[::-1])[::-1][1:], [0.0]])  # least cost of the clients after i
    options = np.arange(1, max_steps + 1)
    used, objective = np.zeros(1), np.zeros(1)
    parents = []
    for i in range(n):
        cost = (used[:, None] + c[i] * options[None, :]).ravel()
        value = (objective[:, None] + a[i] / options[None, :]).ravel()
        source = np.repeat(np.arange(len(used)), max_steps)
        steps = np.tile(options, len(used))
        fits = cost + after[i] <= spare + tolerance
        cost, value, source, steps = cost[fits], value[fits], source[fits], steps[fits]
        order = np.lexsort((value, cost))
        cost, value, source, steps = cost[order], value[order], source[order], steps[order]
        best_so_far = np.minimum.accumulate(value)
        keep = np.concatenate([[True], value[1:] < best_so_far[:-1]])  # better than anything cheaper
        used, objective = cost[keep], value[keep]
        parents.append((source[keep], steps[keep]))
        if len(used) > PARETO_LIMIT:
            return None
    k = int(np.argmin(objective))
    result = np.zeros(n, dtype=int)
    for i in range(n - 1, -1, -1):
        source, steps = parents[i]
        result[i] = steps[k]
        k = int(source[k])
    return result


def _rounded_steps(a, c, spare, max_steps, tolerance) -> np.ndarray:
    steps = np.clip(np.floor(sqrt_steps_continuous(a, c, spare, max_steps) + 1e-9).astype(int), 1, max_steps)
    used = float(np.sum(c * steps))

    def gain(i: int) -> float:  # objective decrease of one more step
        return a[i] * (1.0 / steps[i] - 1.0 / (steps[i] + 1))

    def loss(i: int) -> float:  # objective increase of one step fewer
        return a[i] * (1.0 / (steps[i] - 1) - 1.0 / steps[i])

    while True:
        while True:
            fits = [i for i in range(len(a)) if steps[i] < max_steps and used + c[i] <= spare + tolerance]
            if not fits:
                break
            j = max(fits, key=lambda i: gain(i) / c[i])
            steps[j] += 1
            used += c[j]
        best, move = 0.0, None
        for i in map(int, np.flatnonzero(steps > 1)):
            for j in map(int, np.flatnonzero(steps < max_steps)):
                if i != j and used - c[i] + c[j] <= spare + tolerance and gain(j) - loss(i) > best + 1e-15:
                    best, move = gain(j) - loss(i), (i, j)
        if move is None:
            return steps
        i, j = move
        steps[i] -= 1
        steps[j] += 1
        used += c[j] - c[i]


def gda_sqrt_steps(
    weights: np.ndarray,
    step_cost: np.ndarray,
    comm_cost: np.ndarray,
    budget: float,
    client_estimates: dict[int, dict],
    lr: float,
    mu: float,
    max_steps: int = 50,
) -> np.ndarray:
    """Theorem 3.4's allocation driven by each client's GDA estimates (allocation
    ``gda-sqrt``): :func:`sqrt_steps` with the weights of :func:`gda_sqrt_weights`, then each
    t_i capped at 1 + alpha_i / beta_i, the last step whose net gain w_i (alpha_i - beta_i
    (t - 1)) in AMSFL's objective (Sec. 3.4) is positive, alpha_i = 2 eta sqrt(mu) G_i,k,
    beta_i = eta^2 L_i^2 G_i^2 / 2 (floored, at least 1; no cap for a client without
    estimates or with L_i G_i = 0)."""
    steps = sqrt_steps(gda_sqrt_weights(weights, client_estimates), step_cost, comm_cost, budget, max_steps)
    for i, est in client_estimates.items():
        beta = lr**2 * est["smoothness"] ** 2 * est["grad_bound"] ** 2 / 2.0
        if beta > 0:
            alpha = 2.0 * lr * np.sqrt(mu) * est["round_grad"]
            steps[i] = min(int(steps[i]), max(1, int(np.floor(1.0 + alpha / beta + 1e-9))))
    return steps


def gda_sqrt_weights(weights: np.ndarray, client_estimates: dict[int, dict]) -> np.ndarray:
    """w_i G_i,k / G_k: client i's share of the progress term alpha sum_i w_i t_i when alpha
    is split by the clients' own gradient norms at the round's model, G_i,k (its last
    report), G_k = sum_j w_j G_j,k over the clients that reported (AMSFL Sec. 3.2-3.4).
    Clients without a report, or a zero G_k, keep w_i."""
    w = np.asarray(weights, float).copy()
    reported = [i for i in client_estimates if client_estimates[i]["round_grad"] > 0]
    if not reported:
        return w
    share = w[reported] / w[reported].sum()
    mean = float(np.dot(share, [client_estimates[i]["round_grad"] for i in reported]))
    if mean <= 0:
        return w
    for i in reported:
        w[i] *= client_estimates[i]["round_grad"] / mean
    return w


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
    ``mu`` (strong convexity in alpha); ``allocation`` = marginal | paper | sqrt; ``costs`` =
    known (c_i, b_i from the per-step system model, without its jitter) | estimated (fitted
    online from observed finish times, GDA's cost included); ``gda_cost`` = charged (GDA's
    extra gradient per step takes simulated time) | free; ``max_steps``. ``weights``
    defaults to ``samples`` (w_i = n_i / n)."""

    weights: str = "samples"
    round_budget: float = 0.0
    mu: float = 0.1
    allocation: str = "marginal"
    costs: str = "known"
    gda_cost: str = "charged"
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
        if self.gda_cost not in GDA_COSTS:
            raise ConfigError(
                f"algorithm.gda_cost = {self.gda_cost!r}: must be one of {', '.join(GDA_COSTS)}"
            )
        if self.max_steps < 1:
            raise ConfigError(f"algorithm.max_steps = {self.max_steps}: must be >= 1")


class AMSFLPlanner(Planner):
    """AMSFL's planner: each client's local steps from the step costs and the GDA drift
    estimates under the round's time budget (AMSFL Sec. 3.3-3.4)."""

    def _costs(self, state: dict, system, batch_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(c_i, b_i) as the allocation sees them: with GDA charged, steps 2..t_i cost 2 c_i
        (the step and the gradient at w^(k)), i.e. c'_i = 2 c_i, b'_i = b_i - c_i, so that
        c'_i t_i + b'_i = c_i (2 t_i - 1) + b_i. Estimated costs are fitted to finish times
        that already include GDA's share."""
        if self.options.costs == "known":
            law = system.time_law()
            if not isinstance(law, StepTimeLaw):  # checked when the run started (init_state)
                raise ConfigError(
                    f"system.model = {system.name!r}: amsfl with known costs needs per-step times"
                )
            step, comm = law.step_time(batch_sizes), law.comm_times()
            if self.options.gda_cost == "charged":
                return 2.0 * step, comm - step
            return step, comm
        estimator = StepCostEstimator(len(batch_sizes))
        estimator.sums = state["cost_sums"]
        return estimator.costs()

    def _steps(self, state, num_clients: int, step_cost, comm_cost, lr: float, alpha: float, beta: float):
        """Each client's local steps by ``allocation`` (AMSFL Algorithm 1, its sqrt rules, or
        before the first estimates ``train.local_steps`` where the budget allows)."""
        o = self.options
        if o.allocation == "sqrt":
            return sqrt_steps(state["weights"], step_cost, comm_cost, o.round_budget, o.max_steps)
        if o.allocation == "gda-sqrt":
            return gda_sqrt_steps(state["weights"], step_cost, comm_cost, o.round_budget,
                                  state["client_estimates"], lr, o.mu, o.max_steps)  # fmt: skip
        if state["estimates"] is None:
            spare = o.round_budget - comm_cost.sum()
            affordable = int(spare / max(step_cost.sum(), 1e-300) + 1e-9)
            return np.full(num_clients, max(1, min(self.train.local_steps, affordable, o.max_steps)))
        return greedy_steps(
            state["weights"], step_cost, comm_cost, o.round_budget, alpha, beta, o.allocation, o.max_steps
        )

    def plan(self, round_index: int, state: dict, system, deadline) -> RoundPlan:
        """AMSFL Algorithm 1 with alpha, beta from the last GDA estimates (``sqrt`` needs
        none). Until the first estimates arrive the greedy rules run ``train.local_steps`` on
        every client (fewer, equally, if that does not fit the budget)."""
        o, lr = self.options, self.lr_at(round_index)
        batch = np.full(system.num_clients, self.train.batch_size)
        step_cost, comm_cost = self._costs(state, system, batch)
        est = state["estimates"]
        alpha = beta = float("nan")
        if est is not None:
            alpha = 2.0 * lr * np.sqrt(o.mu) * est["round_grad"]  # AMSFL Sec. 3.4
            beta = lr**2 * est["smoothness"] ** 2 * est["grad_bound"] ** 2 / 2.0
        steps = self._steps(state, system.num_clients, step_cost, comm_cost, lr, alpha, beta)
        record = {
            "round": round_index + 1,
            "steps": steps.tolist(),
            "alpha": float(alpha),
            "beta": float(beta),
            **{k: (float(v) if isinstance(v, int | float) else v) for k, v in (est or {}).items()},
            "step_cost": [float(v) for v in step_cost],
            "comm_cost": [float(v) for v in comm_cost],
            "budget_used": float(np.sum(step_cost * steps + comm_cost)),
        }  # kept in the history by aggregate: plan() writes no state
        extra = o.gda_cost == "charged"
        return RoundPlan(
            round=round_index,
            deadline=None,
            lr=lr,
            record=record,
            assignments=[
                ClientAssignment(self.train.batch_size, int(t), extra_gradients=int(t) - 1 if extra else 0)
                for t in steps
            ],
        )


class AMSFLClient(ClientPart):
    """AMSFL's client: tracks each step's gradient beside the gradient at the received model
    (GDA, AMSFL Sec. 3.2) and reports the estimates with its update."""

    tracks_gradient_differences = True

    # -- client: GDA along the local steps ---------------------------------------------------
    def upload_payload(self, covered: int) -> dict[str, int]:
        """The gradient at the received model (step 1's batch) travels with the update: the
        server's smoothness estimate across rounds needs it (the GDA statistics are a few
        scalars per step, metadata)."""
        return {"gda_anchor_gradient": covered}

    def observe_gradients(self, task, state, local_grad, anchor_grad, distance):
        """Record ||grad F_i(w_t) - grad F_i(w^(k))|| and ||w_t - w^(k)|| (same batch), and
        accumulate Delta_i^(t) = sum_t sum_{j<=t} Delta g_j (Sec. 3.2) for the drift check."""
        record = state.setdefault("gda", {"diff": [], "distance": [], "grad": [], "anchor": []})
        if not record["anchor"]:  # step 1: the gradient at the received model w^(k)
            state["gda_anchor_gradient"] = anchor_grad.detach().clone()
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
        anchor_gradient = state.pop("gda_anchor_gradient", None)
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
                "gda_anchor_gradient": anchor_gradient,  # grad F_i(w^(k)) on step 1's batch
            }
        )


class AMSFLAggregation(FedAvgAggregation):
    """AMSFL's aggregation: FedAvg's weighted mean, then the server's estimates (step costs,
    smoothness, drift) updated from what the clients reported."""

    def init_state(self, setting: RunSetting) -> dict:
        sizes = np.asarray(setting.client_sizes, float)
        weights = (
            sizes / sizes.sum() if self.options.weights == "samples" else np.full(len(sizes), 1 / len(sizes))
        )
        o = self.options
        law = setting.system.time_law()
        if o.costs == "known" and not isinstance(law, StepTimeLaw):
            raise ConfigError(
                f"system.model = {setting.system.name!r}: amsfl with known costs needs the per-step "
                'model (c_i, b_i); set system.model = "per-step" or algorithm.costs = "estimated"'
            )
        if o.gda_cost == "charged" and not isinstance(law, StepTimeLaw):
            raise ConfigError(
                f"system.model = {setting.system.name!r}: only the per-step model prices GDA's extra "
                'gradients; set system.model = "per-step" or algorithm.gda_cost = "free"'
            )
        if o.costs == "known" and isinstance(law, StepTimeLaw):
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
            "previous": None,  # the last round's model and mean gradient (L across rounds)
            "client_estimates": {},  # client -> its last GDA report's L_i, G_i, G_i,k (gda-sqrt)
        }

    # -- server ---------------------------------------------------------------------------
    def aggregate(self, params, buffers, updates, state, context, layout):
        """Weighted average of the local models (w_i = n_i / n); then L, G, G_k from GDA and,
        with ``costs = "estimated"``, the observed finish times."""
        new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
        reports = [u for u in updates if "ratio_max" in u.payload]
        weights = state["weights"][[u.client for u in reports]]
        for u in reports:  # each client's own estimates, for gda-sqrt
            previous = state["client_estimates"].get(u.client, {})
            smoothness = u.payload["ratio_max"] or previous.get("smoothness", 0.0)
            state["client_estimates"][u.client] = {
                "smoothness": float(smoothness),
                "grad_bound": float(u.payload["grad_norm_max"]),
                "round_grad": float(u.payload["grad_norm_anchor"]),
            }
        estimates = gda_estimates([u.payload for u in reports], weights)
        state["history"].append(dict(context.plan.record))  # the plan of the round aggregated
        history = state["history"][-1]
        across = self._smoothness_across_rounds(params, reports, weights, state)
        if estimates is not None:
            state["estimates"] = {**estimates.__dict__, "smoothness_from": "steps"}
        elif reports:  # one step everywhere: G and G_k still follow the gradient at w^(k)
            previous = state["estimates"] or {}
            smoothness = across if across is not None else previous.get("smoothness")
            if smoothness is not None:
                w = weights / weights.sum()
                anchors = [u.payload["grad_norm_anchor"] for u in reports]
                state["estimates"] = {
                    "smoothness": float(smoothness),
                    "grad_bound": float(max(u.payload["grad_norm_max"] for u in reports)),
                    "round_grad": float(np.dot(w, anchors)),
                    "smoothness_from": "rounds" if across is not None else "kept",
                }
        if self.options.costs == "estimated":
            estimator = StepCostEstimator(context.num_clients)
            estimator.sums = state["cost_sums"]
            for u in updates:
                estimator.observe(u.client, u.steps, float(context.outcomes.finish_time[u.client]))
        history["drift_norm"] = [float(u.payload.get("drift_norm", 0.0)) for u in reports]
        est = state["estimates"] or {"smoothness": float("nan"), "grad_bound": float("nan")}
        history["drift_bound"] = [
            float(est["smoothness"] * est["grad_bound"] * u.steps * (u.steps - 1) / 2) for u in reports
        ]
        for u in reports:  # the gradient vectors have served; keep the update small
            u.payload.pop("gda_anchor_gradient", None)
        return new_params, new_buffers

    @staticmethod
    def _smoothness_across_rounds(params, reports, weights, state) -> float | None:
        """L ~ ||g(w^(k)) - g(w^(k-1))|| / ||w^(k) - w^(k-1)|| with g the clients' weighted
        mean gradient at the round's model (each on its own first batch, so the estimate
        carries minibatch noise); remembers this round's pair for the next. ``None`` in the
        first round or when the model did not move."""
        vectors = [u.payload.get("gda_anchor_gradient") for u in reports]
        if not reports or any(v is None or v.numel() != params.numel() for v in vectors):
            return None
        w = torch.as_tensor(weights / weights.sum(), dtype=torch.float32)
        gradient = torch.stack([v.float() for v in vectors]).mul_(w[:, None]).sum(0)
        previous = state.get("previous")
        state["previous"] = {"params": params.detach().clone(), "gradient": gradient}
        if previous is None:
            return None
        distance = float((params - previous["params"]).norm())
        if distance <= 0:
            return None
        return float((gradient - previous["gradient"]).norm()) / distance


class AMSFLReporting(Reporting):
    """AMSFL's report: the steps it allocated and the estimates behind them."""

    def reports(self, state: dict) -> dict[str, dict]:
        run_rounds = [h for h in state["history"] if "drift_norm" in h]  # not a plan cut by the budget
        return {"amsfl": {"estimates": state["estimates"], "rounds": run_rounds}}


@register
class AMSFL(FedAvg):
    """Adaptive local steps under a per-round time budget (AMSFL Algorithm 1), GDA estimates,
    weighted averaging of the local models."""

    name = "amsfl"
    summary = "AMSFL: local steps per client chosen under a time budget from GDA drift estimates"
    Options = AMSFLOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        **FedAvg.hyperparameters,
        "mu": {"low": 0.01, "high": 1.0, "log": True},
    }
    uses_deadline = False
    partial_work = "none"

    @property
    def planner_knowledge(self) -> str:
        """``profile`` with the system model's per-step costs (``costs = "known"``), else
        ``history`` (costs estimated from what clients reported)."""
        return "profile" if self.options.costs == "known" else "history"

    mechanisms = (
        Mechanism("its allocation of local step counts (AMSFL Sec. 3.4)",
                  needs="algorithm.max_steps >= 2 (each client's t_i is in 1..max_steps)",
                  acts=lambda rule: rule.options.max_steps >= 2, knobs=("mu", "allocation")),
    )  # fmt: skip
    Planner = AMSFLPlanner
    Client = AMSFLClient
    Aggregation = AMSFLAggregation
    Reporting = AMSFLReporting
