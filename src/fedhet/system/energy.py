"""Energy on the simulated clock: each client's power draw while it trains, communicates and
waits, and the joules each round costs it.

A client that the server asked in a synchronous round and that was present (or failed
mid-round) spends

    E_u = P^train_u t^train_u + P^upload_u t^comm_u + P^idle_u t^idle_u   (joules)

where, from the round's sampled outcomes (its finish time f_u: when its delivered work ended,
or when it failed):

- ``t^comm_u = min(c_u, f_u)``: the system model's communication seconds c_u this round (the
  model's download and upload, ``comm_time``; 0 for models that price compute only). The
  models with communication charge it before the compute, and so does this account;
- ``t^train_u = f_u - t^comm_u``: the rest of its work, cut by the deadline or its failure;
- ``t^idle_u = D - f_u``: waiting, connected, until the round of duration D closes.

A client that was not asked, or was absent, spends nothing in the round. A client whose
task is its whole planned work but who does not finish it by the deadline keeps training past
the round (AsyncFL's and REFL's stragglers, whose late updates join a later round): it is
charged its whole work when it starts, ``f_u = min(T_u, failure)`` for its full time T_u, with
no waiting, and nothing in the rounds that follow while it is still at work (the rule's
``busy_clients``). A client sent a sub-model (HeteroFL's, FedRolex's and FjORD's widths,
FIARSE's rates, DepthFL's depths) works the sub-model's share s_u of its full time T_u, the
share the rule sized it by: ``f_u = s_u T_u`` and ``t^comm_u = s_u c_u``, then waits; one the
rule sends no work because no sub-model fits spends nothing (the planner's ``idle_clients``);
one whose sub-model does not fit its drawn time works until the deadline, charged as above.
Under an asynchronous rule (the event driver) each start costs its training and
communication, with no waiting, charged when the client starts.

Seconds are the simulated clock's, so joules are watts times simulated seconds: with a
system model whose time scale is arbitrary (``time_per_sample_layer = 1``) the joules are on
that scale too; with device profiles the clock is in the file's seconds.

Power draws (watts) come from ``[system]`` (``compute_watts``, ``upload_watts``,
``idle_watts``, the same for every client) or per device from the device-profile file's
columns of the same names. The defaults are order-of-magnitude figures for a smartphone:
2 W while training (a mobile application processor at full load draws 0.5-2 W, and a phone
sustains about 3 W at most; Tarkoma et al., *Smartphone Energy Consumption*, Cambridge
University Press 2014), 1 W while communicating and 0.27 W idle (a phone call's ~1 W and the
idle, screen-off 0.27 W measured by Carroll and Heiser, *An Analysis of Power Consumption in
a Smartphone*, USENIX ATC 2010).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.system.types import Outcomes

DEFAULT_WATTS = {"compute_watts": 2.0, "upload_watts": 1.0, "idle_watts": 0.27}
MAX_WATTS = 1e6  # the most a power draw may be, in [system] or a device file (a megawatt)
ACCOUNTS = ("train_s", "comm_s", "idle_s", "joules")  # per client, summed over the run


@dataclass(frozen=True)
class PowerDraw:
    """Each client's power draw, in watts: training, communicating, waiting."""

    train: np.ndarray
    upload: np.ndarray
    idle: np.ndarray
    devices: tuple[str, ...] | None = None  # each client's device name, from device profiles

    @classmethod
    def of(cls, num_clients: int, watts: dict[str, float], devices=None) -> PowerDraw:
        """Every client's draw: the device profiles' power columns where ``devices`` (one
        per client) has them, else ``watts`` (``[system]``'s ``compute_watts``,
        ``upload_watts``, ``idle_watts``)."""
        given = devices.power if devices is not None else {}

        def column(name: str) -> np.ndarray:
            if name in given:
                return np.asarray(given[name], dtype=float)
            return np.full(num_clients, float(watts.get(name, DEFAULT_WATTS[name])))

        names = devices.names if devices is not None else None
        return cls(column("compute_watts"), column("upload_watts"), column("idle_watts"), names)

    def table(self, account: dict, client_sizes: np.ndarray) -> list[dict]:
        """``clients.csv``'s rows: each client's examples, device (where profiled), power
        draws and what it spent over the run (:data:`ACCOUNTS` of ``account``)."""
        rows = []
        for u, size in enumerate(client_sizes):
            row: dict = {"client": u, "examples": int(size)}
            if self.devices is not None:
                row["device"] = self.devices[u]
            row.update(compute_watts=float(self.train[u]), upload_watts=float(self.upload[u]),
                       idle_watts=float(self.idle[u]))  # fmt: skip
            row.update({name: float(account.get(name, [0.0] * len(client_sizes))[u]) for name in ACCOUNTS})
            rows.append(row)
        return rows


@dataclass(frozen=True)
class RoundEnergy:
    """One round's account, arrays over clients: seconds training, communicating and
    waiting, and joules."""

    train_s: np.ndarray
    comm_s: np.ndarray
    idle_s: np.ndarray
    joules: np.ndarray

    @property
    def total(self) -> float:
        return float(self.joules.sum())


def spent_in_round(
    power: PowerDraw,
    outcomes: Outcomes,
    asked: np.ndarray,
    duration: float,
    waits: bool = True,
    late: np.ndarray | None = None,
    share: np.ndarray | None = None,
) -> RoundEnergy:
    """Each client's energy in a round (the module's E_u): the clients in ``asked`` (asked by
    the server; present, or failed mid-round) over the round's ``duration``; ``waits``: the
    clients wait, connected, until the round closes (synchronous rounds); ``late``: the
    clients that train their whole work past the deadline, charged it all now, up to their
    failure, without waiting; ``share``: each client's task's share of its planned work (a
    sub-model's), whose work, communication included, takes that share of its full time."""
    finish = np.asarray(outcomes.finish_time, dtype=float)
    comm = outcomes.comm_time if outcomes.comm_time is not None else np.zeros_like(finish)
    if late is not None and np.any(late):
        failure = outcomes.failure_time if outcomes.failure_time is not None else np.full_like(finish, np.inf)
        whole = np.minimum(np.asarray(outcomes.full_time, dtype=float), failure)
        past = np.asarray(late, dtype=bool) & np.isfinite(whole)
        finish = np.where(past, np.maximum(whole, finish), finish)
    if share is not None and np.any(share < 1):
        sub = np.asarray(share) < 1  # the rule sized it to finish before the deadline and failure
        finish = np.where(sub, share * np.asarray(outcomes.full_time, dtype=float), finish)
        comm = np.where(sub, share * comm, comm)
    spent = np.asarray(asked, dtype=bool) & np.isfinite(finish)
    comm_s = np.where(spent, np.minimum(comm, finish), 0.0)
    train_s = np.where(spent, np.maximum(finish - comm_s, 0.0), 0.0)
    idle_s = np.where(spent, np.maximum(duration - finish, 0.0), 0.0) if waits else np.zeros_like(finish)
    joules = power.train * train_s + power.upload * comm_s + power.idle * idle_s
    return RoundEnergy(train_s, comm_s, idle_s, joules)


def involved(outcomes: Outcomes, asked: np.ndarray) -> np.ndarray:
    """The asked clients that spent energy in a round: present, or failed mid-round (a
    failure takes a client out of the round's participants, not back its work)."""
    failed = outcomes.failure_time is not None and np.isfinite(outcomes.failure_time)
    return np.asarray(asked, dtype=bool) & (outcomes.participates | failed)
