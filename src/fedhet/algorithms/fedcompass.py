"""FedCompass (Li, Chaturvedi, He, Chen, Singh, Kindratenko, Huerta, Kim, Madduri, "FedCompass:
Efficient Cross-Silo Federated Learning on Heterogeneous Client Devices Using a Computing
Power-Aware Scheduler", ICLR 2024, arXiv:2309.14675): a semi-asynchronous rule whose server
estimates each client's time per local step and hands out step counts so that the clients of
an *arrival group* finish together; a group is applied in one server step when its last
member arrives, or at its latest arrival time with whoever is in. Runs on the event-driven
driver, as FedBuff.

The scheduler (the paper's Algorithms 1-2, and the authors' public scheduler for the details
the paper leaves open):

- **Speed.** Client i's seconds per step S_i are measured at each arrival as (arrival time -
  start time) / Q_i and smoothed, S_i <- (1 - m) S_i + m S_measured (the first measurement
  is taken as it is).
- **First round.** Every client starts with Q_max steps and no group; its first arrival is
  applied at once, alone.
- **Joining a group.** A client starting at time T joins the group g whose expected arrival
  time T_g gives the largest Q = floor((T_g - T) / S_i) with Q_min <= Q <= Q_max.
- **Creating a group.** Failing that, it gets the largest Q <= Q_max over the open groups of
  floor((L_g + S_g Q_max - T) / S_i), L_g the group's latest arrival time and S_g its fastest
  member's speed (so it arrives with that group's next round), raised to Q_min; Q_max when no
  group is open. Its new group expects it at T + Q S_i and waits until T + lambda Q S_i.
- **Arrivals.** A member arriving by its group's latest time waits for its group; one
  arriving later leaves the group, its update joins the general buffer and it starts again
  at once.
- **Server step.** When a group's last member arrives, or its latest time passes, the
  group's arrivals and the general buffer are applied together,

      x <- x + sum_i alpha s(tau_i) p_i (x_i - x),   x_i = x_(tau_i) + Delta_i,

  with s the staleness function of FedAsync (constant by default, the authors' aggregator's
  default) and p_i = 1/N or n_i/n. The group's members that arrived are then reassigned, the
  fastest first.

Defaults: Q_max = the run's ``train.local_steps``; Q_min = 0.2 Q_max and lambda = 1.5 (the
authors' scheduler's ``q_ratio`` and ``lambda_val``); alpha = 0.9 (their aggregator's);
speed smoothing m = 0.9 (ours).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedhet.algorithms.base import AsyncAlgorithm, register
from fedhet.algorithms.fedasync import STALENESS_FUNCTIONS, staleness_function
from fedhet.algorithms.mechanisms import Mechanism
from fedhet.algorithms.parts import EventAggregation, EventScheduler, Reporting
from fedhet.checks import in_range, one_of
from fedhet.errors import ConfigError


@dataclass
class FedCompassOptions:
    """The scheduler's ``max_steps`` Q_max (0 = ``train.local_steps``), ``min_ratio``
    Q_min / Q_max, ``latest_factor`` lambda and ``speed_momentum`` m; the aggregation's
    ``alpha``, ``staleness`` function (with ``staleness_a``, ``staleness_b`` as FedAsync's)
    and client ``weights``."""

    max_steps: int = 0  # Q_max, the most local steps a client is given (0 = train.local_steps)
    min_ratio: float = 0.2  # Q_min / Q_max, in (0, 1]
    latest_factor: float = 1.5  # lambda >= 1: a group waits until lambda times its expected time
    speed_momentum: float = 0.9  # m in (0, 1]: the weight of the newest step-time measurement
    alpha: float = 0.9  # the server's mixing weight, in (0, 1]
    staleness: str = "constant"  # constant | polynomial | hinge (FedAsync's functions)
    staleness_a: float = 0.5
    staleness_b: float = 4.0
    weights: str = "uniform"  # p_i: uniform (1/N) | samples (n_i / n)

    def validate(self) -> None:
        if isinstance(self.max_steps, bool) or self.max_steps < 0:
            raise ConfigError(
                f"algorithm.max_steps = {self.max_steps!r}: must be >= 0 (0 = train.local_steps)"
            )
        in_range("algorithm.min_ratio", self.min_ratio, 0.0, 1.0, low_open=True)
        if not 1.0 <= self.latest_factor < math.inf:
            raise ConfigError(f"algorithm.latest_factor = {self.latest_factor!r}: must be >= 1")
        in_range("algorithm.speed_momentum", self.speed_momentum, 0.0, 1.0, low_open=True)
        in_range("algorithm.alpha", self.alpha, 0.0, 1.0, low_open=True)
        one_of("algorithm.staleness", self.staleness, STALENESS_FUNCTIONS)
        if not 0.0 <= self.staleness_a < math.inf or not 0.0 <= self.staleness_b < math.inf:
            raise ConfigError(
                f"algorithm.staleness_a = {self.staleness_a!r}, staleness_b = {self.staleness_b!r}: "
                "must be >= 0"
            )
        one_of("algorithm.weights", self.weights, ("uniform", "samples"))


class FedCompassScheduler(EventScheduler):
    """FedCompass's scheduler: each client's local steps from its measured speed so that a
    group arrives together, and the groups' arrival times (computing-power-aware scheduling)."""

    @property
    def q_max(self) -> int:
        return self.options.max_steps or self.train.local_steps

    @property
    def q_min(self) -> int:
        return max(1, math.floor(self.options.min_ratio * self.q_max))

    # -- scheduling -------------------------------------------------------------------------
    def plan_starts(self, state: dict, clients: list[int], now: float) -> list[int]:
        """Q_i for each starting client, the fastest first (Algorithm 1's assignment)."""
        info = state["clients"]
        order = sorted(clients, key=lambda c: (info.get(c, {}).get("speed") is not None,
                                               info.get(c, {}).get("speed") or 0.0, c))  # fmt: skip
        planned = {}
        for client in order:
            record = info.setdefault(client, {"speed": None, "group": None})
            steps = self.q_max if record["speed"] is None else self._assign(state, client, now)
            record.update(start=now, steps=steps)
            planned[client] = steps
            state["starts"].append({"client": client, "time": now, "steps": steps, "group": record["group"]})
        return [planned[c] for c in clients]

    def _assign(self, state: dict, client: int, now: float) -> int:
        """Join the open group that gives the most steps in [Q_min, Q_max], else create one."""
        speed, best, steps = state["clients"][client]["speed"], None, -1
        for gid, group in state["groups"].items():
            if not math.isfinite(group["expected"]):
                continue  # applied at its latest time: it waits for no one
            q = math.floor((group["expected"] - now) / speed)
            if self.q_min <= q <= self.q_max and q >= steps:
                best, steps = gid, q
        if best is None:
            return self._create(state, client, now)
        state["groups"][best]["members"].append(client)
        state["clients"][client]["group"] = best
        return steps

    def _create(self, state: dict, client: int, now: float) -> int:
        """A new group for ``client``, timed to arrive with an open group's next round."""
        info, speed, steps = state["clients"], state["clients"][client]["speed"], -1
        for group in state["groups"].values():
            if now < group["latest"]:
                fastest = min(info[c]["speed"] for c in group["members"] + group["arrived"])
                q = math.floor((group["latest"] + fastest * self.q_max - now) / speed)
                if q <= self.q_max:
                    steps = max(steps, q)
        steps = self.q_max if steps < 0 else max(steps, self.q_min)
        gid = state["next_group"]
        state["next_group"] = gid + 1
        state["groups"][gid] = {"members": [client], "arrived": [], "expected": now + steps * speed,
                                "latest": now + steps * speed * self.options.latest_factor}  # fmt: skip
        info[client]["group"] = gid
        return steps

    # -- arrivals and steps -----------------------------------------------------------------
    def arrive(self, state: dict, client: int, now: float) -> bool:
        """Update S_i; a first arrival is applied alone, a punctual group member waits for
        its group, a late one joins the general buffer and starts again."""
        record = state["clients"][client]
        measured = (now - record["start"]) / record["steps"]
        first = record["speed"] is None
        m = self.options.speed_momentum
        record["speed"] = measured if first else (1.0 - m) * record["speed"] + m * measured
        group = state["groups"].get(record["group"])
        record["group"] = None
        if first or group is None:
            if first:
                state["single"].append(client)
            return True
        group["members"].remove(client)
        if now > group["latest"]:
            self._drop_if_empty(state)
            return True
        group["arrived"].append(client)
        return False

    def take(self, state: dict, buffered: list[tuple[int, int]], now: float) -> list[int]:
        """A first arrival alone; else a group that is complete or past its latest time,
        with the general buffer (every buffered arrival of no waiting group)."""
        if state["single"]:
            client = state["single"].pop(0)
            return [max(i for i, (c, _) in enumerate(buffered) if c == client)]
        ready = [gid for gid, g in state["groups"].items()
                 if g["arrived"] and (not g["members"] or now >= g["latest"])]  # fmt: skip
        if not ready:
            return []
        gid = min(ready, key=lambda g: (state["groups"][g]["latest"], g))
        waiting = {c for g, group in state["groups"].items() if g != gid for c in group["arrived"]}
        group = state["groups"][gid]
        group["arrived"], group["expected"], group["latest"] = [], -math.inf, -math.inf
        self._drop_if_empty(state)
        state["step_group"] = gid
        return [i for i, (c, _) in enumerate(buffered) if c not in waiting]

    def due(self, state: dict) -> float | None:
        """The earliest latest arrival time of a group with arrivals waiting."""
        times = [g["latest"] for g in state["groups"].values() if g["arrived"]]
        return min(times) if times else None

    @staticmethod
    def _drop_if_empty(state: dict) -> None:
        state["groups"] = {g: v for g, v in state["groups"].items() if v["members"] or v["arrived"]}


class FedCompassAggregation(EventAggregation):
    """FedCompass's server step: a group's models mixed with staleness weights."""

    def init_state(self, setting) -> dict:
        sizes = np.asarray(setting.client_sizes, dtype=float)
        shares = (
            sizes / sizes.sum()
            if self.options.weights == "samples"
            else np.full(len(sizes), 1.0 / len(sizes))
        )
        return {"log": [], "starts": [], "shares": shares.tolist(), "clients": {}, "groups": {},
                "next_group": 0, "single": []}  # fmt: skip

    def apply_models(self, params, buffers, arrivals, state: dict, version: int):
        """x <- x + sum_i alpha s(tau_i) p_i (x_i - x), x_i = x_(tau_i) + Delta_i."""
        o, shares = self.options, state["shares"]
        new_params, new_buffers = params.clone(), buffers.clone()
        for update, staleness, sent_params, sent_buffers in arrivals:
            weight = o.alpha * staleness_function(o.staleness, staleness, o.staleness_a, o.staleness_b)
            weight *= shares[update.client]
            new_params.add_(sent_params + update.delta - params, alpha=weight)
            if buffers.numel():
                new_buffers.add_(sent_buffers + update.delta_buffers - buffers, alpha=weight)
        state["log"].append({"step": version + 1, "group": state.pop("step_group", None),
                             "clients": [u.client for u, *_ in arrivals],
                             "staleness": [s for _, s, *_ in arrivals]})  # fmt: skip
        return new_params, new_buffers


class FedCompassReporting(Reporting):
    """FedCompass's report: the groups and the steps it assigned."""

    def reports(self, state: dict) -> dict[str, dict]:
        speeds = {str(c): r["speed"] for c, r in sorted(state["clients"].items())}
        return {
            "fedcompass": {
                "server_steps": state["log"],
                "starts": state["starts"],
                "seconds_per_step": speeds,
            }
        }


@register
class FedCompass(AsyncAlgorithm):
    """FedCompass: step counts in [Q_min, Q_max] planned from each client's measured seconds
    per step so that the clients of an arrival group finish together; a group is one server
    step, x <- x + sum_i alpha s(tau_i) p_i (x_i - x), taken when its last member arrives or
    at its latest time (lambda times its expected duration) with whoever arrived."""

    name = "fedcompass"
    summary = "FedCompass: per-client step counts so arrival groups finish together (Li et al. ICLR 2024)"
    Options = FedCompassOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        "alpha": {"low": 0.3, "high": 1.0},
        "min_ratio": {"low": 0.1, "high": 0.5},
    }
    planner_knowledge = "history"  # assigns steps from the speeds measured at clients' arrivals
    mechanisms = (
        Mechanism("its computing-power-aware step assignment (Q_min..Q_max steps per client)",
                  needs="a step range wider than one step: Q_max (algorithm.max_steps, else "
                  "train.local_steps) above Q_min = max(1, floor(min_ratio Q_max)); with Q_max = 1 "
                  "every client gets one step", acts=lambda rule: rule.q_max > rule.q_min,
                  knobs=("min_ratio",), needs_time_law=True),
    )  # fmt: skip
    Scheduler = FedCompassScheduler
    Aggregation = FedCompassAggregation
    Reporting = FedCompassReporting
