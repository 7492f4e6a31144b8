"""The values a system model trades in: a round's :class:`Workload` (what the server asks),
the sampled :class:`Outcomes` (who got how far by when) and their :class:`Marginals` (the
probabilities the unbiased rules need)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Workload:
    """What the server asks of every client in one round: the deadline and, per client, the
    batch size, the local steps K (default 1) and the planned first layer d0 (default 1)."""

    deadline: float | None
    batch_sizes: np.ndarray
    # None (the default) is filled in by __post_init__: every client 1
    local_steps: np.ndarray = None  # type: ignore[assignment]
    depth: np.ndarray = None  # type: ignore[assignment]
    start_time: float = 0.0  # when the round starts on the virtual clock (availability traces)
    upload_bytes: np.ndarray | None = None  # per client: the update's size as it travels
    download_bytes: np.ndarray | None = None  # per client: the model's size as it is sent
    extra_gradients: np.ndarray | None = None  # per client: gradient evaluations beyond the steps

    def __post_init__(self) -> None:
        self.batch_sizes = np.asarray(self.batch_sizes)
        n = len(self.batch_sizes)
        self.local_steps = np.ones(n, dtype=int) if self.local_steps is None else np.asarray(self.local_steps)
        self.depth = np.ones(n, dtype=int) if self.depth is None else np.asarray(self.depth)

    @property
    def max_steps(self) -> int:
        return int(self.local_steps.max()) if len(self.local_steps) else 1


@dataclass
class Outcomes:
    """One round's sampled outcomes, arrays over clients.

    ``depth``: first layer reached by K steps of partial back-propagation (1..L+1).
    ``steps_done``: whole local steps finished by the deadline (0..K). ``full_time``: when
    all the planned work would finish. ``finish_time``: when the delivered work is done (at
    most the deadline).

    When each piece of the work would be delivered, for models that time their work
    (:attr:`~fedhet.system.base.SystemModel.times_pieces`; None otherwise):
    ``layer_times[u, l-1]``: the earliest cutoff by which the client's K partial steps reach
    layer l, its upload included (inf for layers below its planned d0), so that under a
    deadline T ``depth <= l`` iff ``layer_times[u, l-1] <= T``; ``step_times[u, k-1]``: the
    same for k whole steps (inf for k > K_u). The dropout wrapper cuts a failed client's
    work with them (``system.dropout_keeps = "finished"``).

    ``failure_time``: when a client failed mid-round (inf: it did not), where a dropout
    wrapper is configured (None otherwise). Rules that size their clients' work themselves
    (HeteroFL's widths, DepthFL's depths) deliver only work that ended before it
    (:meth:`finishes_before_failure`).

    ``comm_time``: each client's seconds of communication this round, within its work (models
    that price communication; None: none), for the energy account (:mod:`fedhet.system.energy`).
    """

    participates: np.ndarray
    depth: np.ndarray
    full_time: np.ndarray
    finish_time: np.ndarray
    steps_done: np.ndarray = None  # type: ignore[assignment]  # None: filled in by __post_init__
    layer_times: np.ndarray | None = None
    step_times: np.ndarray | None = None
    failure_time: np.ndarray | None = None
    comm_time: np.ndarray | None = None

    def finishes_before_failure(self, client: int, seconds: float) -> bool:
        """Whether ``client``'s work of ``seconds`` (from the round's start, its upload
        included) ends before the client fails: always without failures."""
        return self.failure_time is None or seconds <= float(self.failure_time[client]) * (1 + 1e-12)

    def __post_init__(self) -> None:
        if self.steps_done is None:  # a model that only samples depths: one step
            self.steps_done = (self.depth == 1).astype(int)


@dataclass
class Marginals:
    """The probabilities unbiased rules need, for one round's workload.

    ``reach_prob[u, l-1]`` = P[d_u <= l]; ``no_reach_prob[l-1]`` = p_l = P[no client reaches
    layer l]; ``participation_prob[u]`` = p_u; ``step_prob[u, k-1]`` = P[u present and
    steps_done_u >= k] for k = 1..max K.
    """

    reach_prob: np.ndarray
    no_reach_prob: np.ndarray
    participation_prob: np.ndarray
    step_prob: np.ndarray | None = None
