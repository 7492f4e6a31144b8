"""FedBalancer (Shin, Li, Liu, Lee, "FedBalancer: Data and Pace Control for Efficient
Federated Learning on Heterogeneous Clients", MobiSys 2022, arXiv:2201.01601): clients train
on the samples the model still gets wrong, and the server sets each round's deadline where
the most clients finish per second.

- **Sample selection** (Algorithm 1, a client hook): the client evaluates every example's
  loss at the received model and splits them at the server's loss threshold lt into
  under-threshold (UT, already learned) and over-threshold (OT) samples. It trains on all of
  its data if that fits the deadline; else, if OT fits, on as many as fit, a share p of them
  drawn from UT and the rest from OT; else on |OT| samples, a share p from UT. It reports
  its smallest and largest loss and how many samples it selected.
- **Loss threshold** (Algorithm 2): lt = L_low + (L_high - L_low) r_lt, with L_low the
  smallest reported loss and L_high the mean of the clients' largest, from the last round's
  reports; lt = 0 (every sample over it) until r_lt leaves 0.
- **Ratio control** (Algorithm 3): every w rounds, if the mean training loss of the last w
  rounds fell below that of the w before, r_lt rises and r_D falls by their step sizes,
  otherwise the reverse (both kept in [0, 1]; r_D starts at 1, r_lt at 0).
- **Deadline** (Algorithm 4): D = D_low + (D_high - D_low) r_D, where D(k) is the time T
  that maximises (clients whose estimated completion <= T) / T when every client does k
  steps' worth of its selected samples: D_high for the full work, D_low for a share
  ``low_share`` of it (the paper's one epoch out of E). It is used once more than half of
  the clients have reported their speed; before that, the run's ``system.deadline``. Every
  asked client that is present reports its seconds per step, one that misses the deadline
  as it quits (it measured them on the steps it did).

fedhet's local work is ``train.local_steps`` K steps of batch B over a client's n examples;
training on c selected samples takes ceil(K c / n) steps (the same number of passes over the
data), planned from the mean of the client's last five selected counts (as the authors'
server estimates completion times). A client's seconds per step and communication seconds
are those it reported with its last update. Evaluating the n losses costs ceil(n / (3 B))
more steps on the clock (a forward pass is about a third of a step), or nothing with
``inference = "pipelined"`` (the paper's inference pipelining). Updates are averaged with
weights n_trained / sum n_trained (FedAvg over the samples trained); a client that would
miss the deadline gets no task.

Defaults (ours where the paper's text gives none we could check): p = 0 (every selected
sample from OT when OT is large enough: the authors' code's default), w = 20 rounds, step
sizes 0.05, low_share 0.2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedhet.algorithms.base import Algorithm, ClientAssignment, RoundPlan, register, require_time_law
from fedhet.algorithms.mechanisms import Mechanism
from fedhet.algorithms.parts import Aggregation, ClientPart, Planner, Reporting
from fedhet.checks import in_range, one_of
from fedhet.errors import ConfigError


@dataclass
class FedBalancerOptions:
    """``under_share`` p, ``window`` w, the step sizes ``threshold_step`` and
    ``deadline_step``, ``low_share`` (D_low's share of the work) and ``inference``
    (charged | pipelined)."""

    under_share: float = 0.0  # p in [0, 1]: the share of selected samples drawn from under the threshold
    window: int = 20  # w >= 1: rounds between ratio adjustments
    threshold_step: float = 0.05  # the loss threshold ratio's step, in [0, 1]
    deadline_step: float = 0.05  # the deadline ratio's step, in [0, 1]
    low_share: float = 0.2  # D_low's share of the full work, in (0, 1]
    inference: str = "charged"  # charged (the loss evaluation costs time) | pipelined (free)

    def validate(self) -> None:
        in_range("algorithm.under_share", self.under_share, 0.0, 1.0)
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(f"algorithm.window = {self.window!r}: must be a whole number >= 1")
        in_range("algorithm.threshold_step", self.threshold_step, 0.0, 1.0)
        in_range("algorithm.deadline_step", self.deadline_step, 0.0, 1.0)
        in_range("algorithm.low_share", self.low_share, 0.0, 1.0, low_open=True)
        one_of("algorithm.inference", self.inference, ("charged", "pipelined"))


def select_samples(
    losses: np.ndarray, threshold: float, capacity: float, under_share: float, rng
) -> np.ndarray:
    """FedBalancer's Algorithm 1: positions of the samples to train on, from each sample's
    loss, the threshold lt, the most samples that fit the deadline (``capacity``; inf: all
    fit) and the share p drawn from under the threshold."""
    n = len(losses)
    under, over = np.flatnonzero(losses < threshold), np.flatnonzero(losses >= threshold)
    if n <= capacity:
        return np.arange(n)
    count = int(capacity) if len(over) <= capacity else len(over)
    easy = min(int(count * under_share), len(under))
    hard = min(count - easy, len(over))
    easy = min(count - hard, len(under))
    chosen = np.concatenate([rng.choice(under, easy, replace=False), rng.choice(over, hard, replace=False)])
    return np.sort(chosen)


def peak_deadline(times: np.ndarray) -> float:
    """The time T maximising (completions <= T) / T over the estimated completion times
    (Algorithm 4's findPeakDDLE; the ratio peaks at one of them)."""
    ordered = np.sort(times[np.isfinite(times) & (times > 0)])
    if not len(ordered):
        return math.inf
    rates = np.arange(1, len(ordered) + 1) / ordered
    return float(ordered[int(np.argmax(rates))])  # the earliest of equal peaks


class FedBalancerPlanner(Planner):
    """FedBalancer's planner: the round's deadline from the clients' estimated times and the
    loss threshold's window (FedBalancer's deadline control)."""

    def plan(self, round_index: int, state: dict, system, deadline) -> RoundPlan:
        """Each client's steps from its estimated selected count; the deadline of Alg. 4."""
        lr, batch = self.lr_at(round_index), self.train.batch_size
        steps = self._steps_for(state, self._estimated_counts(state))
        extra = self._inference_steps(state)
        chosen = self._deadline(state, deadline)
        assignments = [
            ClientAssignment(batch, int(k), extra_gradients=int(e)) for k, e in zip(steps, extra, strict=True)
        ]
        record = {"round": round_index + 1, "deadline": chosen, "threshold": state["threshold"],
                  "threshold_ratio": state["threshold_ratio"],
                  "deadline_ratio": state["deadline_ratio"]}  # fmt: skip
        return RoundPlan(round_index, chosen, lr, assignments, record=record)

    def task_payload(self, client: int, state: dict) -> dict:
        """lt, p and the most samples that fit the deadline (-1: unknown, all fit)."""
        return {"loss_threshold": float(state["threshold"]), "under_share": float(self.options.under_share),
                "capacity": float(state.get("capacity", {}).get(client, -1.0))}  # fmt: skip


class FedBalancerClient(ClientPart):
    """FedBalancer's client: trains on the examples whose loss at the received model is over
    the threshold (sample selection), and reports its loss statistics."""

    local_loss_per_client: ClassVar[bool] = False

    # -- client -------------------------------------------------------------------------------
    def select_samples(self, task, state, losses, rng):
        """Algorithm 1 on the client's losses; its loss range and count are reported."""
        p = task.payload
        capacity = math.inf if p["capacity"] < 0 else p["capacity"]
        chosen = select_samples(losses, p["loss_threshold"], capacity, p["under_share"], rng)
        state["report"] = (float(losses.min()), float(losses.max()), len(chosen))
        return chosen

    def finish_local_work(self, task, update, state, region, local, anchor) -> None:
        low, high, count = state.pop("report")
        update.payload.update(loss_min=low, loss_max=high, selected=count)


class FedBalancerAggregation(Aggregation):
    """FedBalancer's aggregation: FedAvg's mean, then the threshold and the clients' time
    estimates updated from the reports."""

    def init_state(self, setting) -> dict:
        require_time_law(setting.system, self.name)
        n = setting.num_clients
        return {"sizes": [int(s) for s in setting.client_sizes], "counts": [[] for _ in range(n)],
                "step_time": [None] * n, "comm_time": [0.0] * n, "threshold_ratio": 0.0,
                "deadline_ratio": 1.0, "threshold": 0.0, "losses": [], "log": []}  # fmt: skip

    # -- server: aggregation and control -----------------------------------------------------
    def aggregate(self, params, buffers, updates, state, context, layout):
        """FedAvg over the samples trained, then Algorithms 2-3 and the clients' estimates."""
        self._observe(state, updates, context)
        if not updates:
            return params, buffers
        total = sum(u.num_samples for u in updates)
        new_params, new_buffers = params.clone(), buffers.clone()
        for u in updates:
            new_params.add_(u.delta, alpha=u.num_samples / total)
            if buffers.numel():
                new_buffers.add_(u.delta_buffers, alpha=u.num_samples / total)
        return new_params, new_buffers

    def _observe(self, state: dict, updates, context) -> None:
        """The reported speeds and counts; the loss threshold (Alg. 2); the ratios (Alg. 3)."""
        outcomes, plan = context.outcomes, context.plan
        comm = outcomes.comm_time if outcomes.comm_time is not None else np.zeros(len(outcomes.full_time))
        asked = [c for c, a in enumerate(plan.assignments) if a.asked and outcomes.participates[c]]
        for c in asked:  # a client that misses the deadline reports its pace as it quits
            work = plan.assignments[c].local_steps + plan.assignments[c].extra_gradients
            state["step_time"][c] = float(outcomes.full_time[c] - comm[c]) / max(work, 1)
            state["comm_time"][c] = float(comm[c])
        for u in updates:
            c = u.client
            state["counts"][c] = [*state["counts"][c], int(u.payload["selected"])][-5:]
        if updates:
            low = min(float(u.payload["loss_min"]) for u in updates)
            high = float(np.mean([float(u.payload["loss_max"]) for u in updates]))
            state["threshold"] = low + (high - low) * state["threshold_ratio"]
            state["losses"].append(float(np.mean([u.loss for u in updates])))
        self._control(state, plan.round)
        self._capacities(state, plan.deadline)
        state["log"].append({**plan.record, "clients": [u.client for u in updates],
                             "selected": [int(u.payload["selected"]) for u in updates]})  # fmt: skip

    def _control(self, state: dict, round_index: int) -> None:
        """Algorithm 3: every w rounds, move both ratios by the loss trend."""
        w, history = self.options.window, state["losses"]
        if round_index % w != w - 1 or len(history) < 2 * w:
            return
        improved = np.mean(history[-2 * w : -w]) - np.mean(history[-w:]) > 0
        sign = 1.0 if improved else -1.0
        lt = state["threshold_ratio"] + sign * self.options.threshold_step
        dr = state["deadline_ratio"] - sign * self.options.deadline_step
        state["threshold_ratio"] = lt if 0.0 <= lt <= 1.0 else state["threshold_ratio"]
        state["deadline_ratio"] = dr if 0.0 <= dr <= 1.0 else state["deadline_ratio"]

    def _capacities(self, state: dict, deadline: float | None) -> None:
        """The most samples each known client can train by the next deadline estimate."""
        upcoming = self._deadline(state, deadline)
        capacity = {}
        for c, speed in enumerate(state["step_time"]):
            if speed is None or upcoming is None or not math.isfinite(upcoming):
                continue
            spare = upcoming - state["comm_time"][c] - self._inference_steps(state)[c] * speed
            steps = math.floor(spare / speed) if speed > 0 else math.inf  # whole steps that fit
            if math.isfinite(steps):  # c samples take ceil(K c / n) steps
                capacity[c] = float(max(0, math.floor(steps * state["sizes"][c] / self.train.local_steps)))
        state["capacity"] = capacity


class FedBalancerReporting(Reporting):
    """FedBalancer's report: deadlines, thresholds and selected counts per round."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"fedbalancer": {"rounds": state["log"]}}


@register
class FedBalancer(Algorithm):
    """FedBalancer: each client trains on the examples whose loss at the received model is
    over the server's threshold (as many as fit the deadline, a share ``under_share`` from
    under it); the server sets the deadline between the peaks of clients finished per
    second for a ``low_share`` of the work and for all of it, and moves the threshold and
    deadline ratios every ``window`` rounds with the loss trend (Algorithms 1-4)."""

    name = "fedbalancer"
    summary = (
        "FedBalancer: loss-threshold sample selection and an adaptive deadline (Shin et al. MobiSys 2022)"
    )
    Options = FedBalancerOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"under_share": {"low": 0.0, "high": 0.5}}
    planner_knowledge = "history"  # plans from the speeds clients reported with their last update
    mechanisms = (
        Mechanism("its sample selection (Algorithm 1)",
                  needs="train.local_steps >= 2 (a client trains ceil(K c / n) steps on c of its n "
                  "samples: with K = 1 all of its samples fit one step, so it trains on all of them)",
                  acts=lambda rule: rule.train.local_steps >= 2, knobs=("under_share", "threshold_step")),
        Mechanism("its deadline interpolation D_low..D_high (Algorithm 4)",
                  needs="a work share low_share of K steps below K steps (with train.local_steps = 1, "
                  "or low_share = 1, D_low = D_high)",
                  acts=lambda rule: math.ceil(rule.options.low_share * rule.train.local_steps)
                  < rule.train.local_steps, knobs=("deadline_step", "low_share")),
    )  # fmt: skip

    # -- server: the plan ---------------------------------------------------------------------
    def _estimated_counts(self, state: dict) -> np.ndarray:
        """Each client's selected count: the mean of its last five reports (n before any),
        at most what fits the deadline."""
        reports = zip(state["counts"], state["sizes"], strict=True)
        counts = np.array([np.mean(c) if c else n for c, n in reports], dtype=float)
        for client, capacity in state.get("capacity", {}).items():
            if capacity >= 0:
                counts[client] = max(1.0, min(counts[client], capacity))
        return counts

    def _steps_for(self, state: dict, counts: np.ndarray) -> np.ndarray:
        """ceil(K c / n) steps for c of n samples, at least one."""
        sizes = np.maximum(np.array(state["sizes"], dtype=float), 1.0)
        return np.maximum(1, np.ceil(self.train.local_steps * counts / sizes - 1e-9)).astype(int)

    def _deadline(self, state: dict, configured: float | None) -> float | None:
        """Algorithm 4 once more than half of the clients reported their speed."""
        known = np.array([t is not None for t in state["step_time"]])
        if known.sum() * 2 <= len(known):
            return configured
        speed = np.array([t if t is not None else np.nan for t in state["step_time"]], dtype=float)
        comm = np.array(state["comm_time"], dtype=float)
        steps = self._steps_for(state, self._estimated_counts(state))
        inference = self._inference_steps(state) * speed
        high = peak_deadline(comm + inference + steps * speed)
        low = peak_deadline(comm + inference + np.maximum(1, np.ceil(self.options.low_share * steps)) * speed)
        if not math.isfinite(high):
            return configured
        return low + (high - low) * state["deadline_ratio"]

    def _inference_steps(self, state: dict) -> np.ndarray:
        """ceil(n / (3 B)) steps for evaluating n losses (0 when pipelined)."""
        if self.options.inference == "pipelined":
            return np.zeros(len(state["sizes"]), dtype=int)
        return np.ceil(np.array(state["sizes"]) / (3.0 * self.train.batch_size)).astype(int)

    Planner = FedBalancerPlanner
    Client = FedBalancerClient
    Aggregation = FedBalancerAggregation
    Reporting = FedBalancerReporting
