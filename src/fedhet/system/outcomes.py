"""Outcome samplers: per round and client, participation, depth, local steps done and finish
time; and their marginals P[client u reaches layer l], p_l = P[no client reaches layer l] and
P[client u finishes k local steps].

Depth convention (DESIGN idea 4): layers 1..L input to output; a client with depth d
computed layers d..L of back-propagation; d = L + 1 means it computed nothing. "Reaches
layer l" means d <= l.

A model prices a round's whole :class:`Workload`: the deadline (``None`` = wait for
everyone: each client does all its work and the round lasts until the slowest finishes) and,
per client, the batch size, the number of local steps K and the planned coverage (first layer
d0 of its back-propagation, 1 = every layer). Models with a time law (exponential,
per-step) charge K steps K times one step. Depth-only models (full, uniform-depth,
straggler-ratio) have none: their depth law (SALF AS4, Sec. IV) is the outcome of whatever
work is asked, and the clock is implied from it (:func:`implied_full_time`).

A client that runs out of time can deliver its work in two ways, and every model says how
far it got in both:

- ``depth``: all K steps over the layers it reached, d..L (SALF's partial back-propagation);
- ``steps_done``: the number of whole steps over its planned layers d0..L (FedProx, FedNova).

Finishing everything (depth = d0 and steps_done = K) is the same event in both readings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import gammainc, gammaincc

from fedhet.errors import ConfigError


@dataclass
class Workload:
    """What the server asks of every client in one round: the deadline and, per client, the
    batch size, the local steps K (default 1) and the planned first layer d0 (default 1)."""

    deadline: float | None
    batch_sizes: np.ndarray
    local_steps: np.ndarray | None = None
    depth: np.ndarray | None = None
    start_time: float = 0.0  # when the round starts on the virtual clock (availability traces)

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
    """

    participates: np.ndarray
    depth: np.ndarray
    full_time: np.ndarray
    finish_time: np.ndarray
    steps_done: np.ndarray | None = None

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


class SystemModel:
    """Base class: ``sample`` draws outcomes, ``marginals`` gives their probabilities."""

    name = "base"
    wall_clock = False  # True: clients cut their own work against a real deadline

    @property
    def independent_clients(self) -> bool:
        """Whether clients' outcomes are drawn independently of each other (p_l has the
        product form of :meth:`no_reach_given_presence`)."""
        return True

    def __init__(self, num_clients: int, num_layers: int):
        self.num_clients = num_clients
        self.num_layers = num_layers

    def observe(self, updates) -> None:
        """Learn from a round's delivered updates (models that estimate their marginals)."""

    def state_dict(self) -> dict:
        """What :meth:`observe` learned, for checkpoints."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def reports(self) -> dict[str, dict]:
        """Documents for the run folder (e.g. measured layer times)."""
        return {}

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        raise NotImplementedError

    def marginals(self, work: Workload) -> Marginals:
        raise NotImplementedError

    def no_reach_given_presence(self, work: Workload, presence: np.ndarray) -> np.ndarray:
        """p_l = P[no client reaches layer l] when client u is present with probability
        ``presence[u]`` independently: prod_u (1 - presence_u P[d_u <= l]) for models whose
        clients are independent (ADEL-FL Lemma 1's product form)."""
        reach = self.marginals(work).reach_prob
        return np.prod(1.0 - np.asarray(presence, float)[:, None] * reach, axis=0)

    def _everyone(self) -> np.ndarray:
        return np.ones(self.num_clients, dtype=bool)

    def _full_marginals(self, work: Workload) -> Marginals:
        L, U = self.num_layers, self.num_clients
        reach = _planned_reach(work, L)
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(U), _steps_mask(work))


def _planned_reach(work: Workload, num_layers: int) -> np.ndarray:
    """1 where layer l is at or above the planned first layer d0, else 0 (U x L)."""
    return (np.arange(1, num_layers + 1)[None, :] >= work.depth[:, None]).astype(float)


def _steps_mask(work: Workload) -> np.ndarray:
    """P[steps_done >= k] when every client does all its steps: 1 for k <= K_u (U x max K)."""
    return (np.arange(1, work.max_steps + 1)[None, :] <= work.local_steps[:, None]).astype(float)


def implied_full_time(units_done: np.ndarray, units_total: np.ndarray, deadline: float) -> np.ndarray:
    """Time a client needs for all ``units_total`` layer-steps (one layer of one step's
    back-propagation each) when it finished ``units_done`` of them by ``deadline``.

    Depth-only models (uniform-depth, straggler-ratio) have no time law; we read a depth as a
    constant speed of (k + 1/2) / deadline layer-steps for k done (the midpoint of the speeds
    that give exactly k), so all the work takes units_total * deadline / (k + 1/2).
    """
    return units_total * deadline / (units_done + 0.5)


def steps_from_depth(depth: np.ndarray, work: Workload, num_layers: int) -> np.ndarray:
    """Whole steps over the planned layers d0..L that the compute of K partial steps over
    d..L pays for: floor(K (L+1-d) / (L+1-d0)), K when d = d0."""
    per_step = num_layers + 1 - work.depth
    return np.minimum(work.local_steps * (num_layers + 1 - depth) // per_step, work.local_steps)


class DepthOnlyModel(SystemModel):
    """Shared clock logic of models that sample depths directly: the sampled depth is how far
    a client's K steps of back-propagation got by the deadline; whole steps done and the
    implied time follow from it (:func:`steps_from_depth`, :func:`implied_full_time`)."""

    nominal_deadline = 1.0

    def _sample_depth(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _depth_reach(self) -> np.ndarray:
        """P[d_u <= l] of the sampled depth (U x L), before the planned d0 is applied."""
        raise NotImplementedError

    def sample(self, work, rng):
        L = self.num_layers
        depth = np.maximum(self._sample_depth(rng), work.depth)
        clock = work.deadline if work.deadline is not None else self.nominal_deadline
        steps = work.local_steps
        total = steps * (L + 1 - work.depth)
        full = implied_full_time(steps * (L + 1 - depth), total, clock)
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, steps.copy())
        done = steps_from_depth(depth, work, L)
        return Outcomes(self._everyone(), depth, full, np.minimum(full, work.deadline), done)

    def marginals(self, work):
        if work.deadline is None:
            return self._full_marginals(work)
        L, U = self.num_layers, self.num_clients
        reach = self._depth_reach() * _planned_reach(work, L)
        return Marginals(reach, self._no_reach(reach), np.ones(U), self._step_prob(reach, work))

    def _no_reach(self, reach: np.ndarray) -> np.ndarray:
        return np.prod(1.0 - reach, axis=0)

    def _step_prob(self, reach: np.ndarray, work: Workload) -> np.ndarray:
        """steps_done >= k  <=>  d <= L + 1 - ceil(k (L+1-d0) / K), read off ``reach``."""
        L = self.num_layers
        k = np.arange(1, work.max_steps + 1)[None, :]
        K = work.local_steps[:, None]
        per_step = (L + 1 - work.depth)[:, None]
        layer = L + 1 - np.ceil(k * per_step / K).astype(int)  # 1..L for k <= K
        rows = np.arange(self.num_clients)[:, None]
        prob = reach[rows, np.clip(layer, 1, L) - 1]
        return np.where(k <= K, prob, 0.0)


class NoStragglers(DepthOnlyModel):
    """Every client does all its work; each round lasts ``deadline`` (default 1 s).

    The system of the FedStale experiments, where heterogeneity is in participation only
    (wrap it in Bernoulli participation).
    """

    name = "full"

    def __init__(self, num_clients: int, num_layers: int, deadline: float = 1.0):
        super().__init__(num_clients, num_layers)
        self.nominal_deadline = deadline

    def sample(self, work, rng):
        clock = work.deadline if work.deadline is not None else self.nominal_deadline
        done = np.full(self.num_clients, float(clock))
        return Outcomes(self._everyone(), work.depth.copy(), done, done, work.local_steps.copy())

    def marginals(self, work):
        return self._full_marginals(work)


class UniformDepth(DepthOnlyModel):
    """SALF AS4: d_u ~ Uniform{1..L+1}, i.i.d. over clients and rounds.

    P[reach l] = l / (L+1); p_l = (1 - l/(L+1))^U (SALF eq. (10)).
    """

    name = "uniform-depth"

    def __init__(self, num_clients: int, num_layers: int, deadline: float = 1.0):
        super().__init__(num_clients, num_layers)
        self.nominal_deadline = deadline

    def _sample_depth(self, rng):
        return rng.integers(1, self.num_layers + 2, size=self.num_clients)

    def _depth_reach(self):
        L, U = self.num_layers, self.num_clients
        return np.tile(np.arange(1, L + 1) / (L + 1), (U, 1))  # SALF Lemma 1, eq. (10)


class StragglerRatio(DepthOnlyModel):
    """SALF Sec. IV: round(ratio * U) stragglers; others compute every layer.

    The straggler set is drawn uniformly each round, or once for the run with
    ``fixed_stragglers`` (as the authors' code does). A straggler's depth is uniform on
    ``{min_depth..L+1}`` (default 2: it did not finish). p_l is 0 whenever some client is not
    a straggler, else prod over stragglers of P[d > l].
    """

    name = "straggler-ratio"

    def __init__(
        self,
        num_clients: int,
        num_layers: int,
        straggler_ratio: float,
        fixed_stragglers: bool = False,
        min_depth: int = 2,
        deadline: float = 1.0,
        rng: np.random.Generator | None = None,
    ):
        super().__init__(num_clients, num_layers)
        if not 0.0 <= straggler_ratio <= 1.0:
            raise ConfigError(f"system.straggler_ratio = {straggler_ratio}: must be in [0, 1]")
        if not 1 <= min_depth <= num_layers + 1:
            raise ConfigError(
                f"system.straggler_min_depth = {min_depth}: must be in 1..{num_layers + 1} (L + 1)"
            )
        self.num_stragglers = int(round(straggler_ratio * num_clients))
        self.min_depth = min_depth
        self.nominal_deadline = deadline
        self.fixed: np.ndarray | None = None
        if fixed_stragglers:
            rng = rng if rng is not None else np.random.default_rng(0)
            self.fixed = np.zeros(num_clients, dtype=bool)
            self.fixed[rng.choice(num_clients, self.num_stragglers, replace=False)] = True

    def _sample_depth(self, rng):
        U, L = self.num_clients, self.num_layers
        if self.fixed is not None:
            is_straggler = self.fixed
        else:
            is_straggler = np.zeros(U, dtype=bool)
            is_straggler[rng.choice(U, self.num_stragglers, replace=False)] = True
        straggler_depth = rng.integers(self.min_depth, L + 2, size=U)
        return np.where(is_straggler, straggler_depth, 1)

    def _straggler_reach(self) -> np.ndarray:
        L, lo = self.num_layers, self.min_depth
        layers = np.arange(1, L + 1)
        return np.clip(layers - lo + 1, 0, None) / (L + 2 - lo)

    def _depth_reach(self):
        U = self.num_clients
        if self.fixed is not None:
            share = self.fixed.astype(float)[:, None]
        else:
            share = np.full((U, 1), self.num_stragglers / U)
        return (1.0 - share) + share * self._straggler_reach()[None, :]

    def _no_reach(self, reach):
        if self.fixed is None and self.num_stragglers < self.num_clients:
            # a non-straggler reaches every planned layer (exact when all plan the same d0)
            return np.where((reach > 0).any(axis=0), 0.0, 1.0)
        if self.fixed is None:
            return (1.0 - self._straggler_reach()) ** self.num_clients
        return np.prod(1.0 - reach, axis=0)

    @property
    def independent_clients(self) -> bool:
        return self.fixed is not None  # a set drawn each round couples the clients

    def no_reach_given_presence(self, work, presence):
        """With a fixed straggler set clients are independent (product form). With a set
        drawn each round, average over the C(U, k) equally likely sets: the sum over sets S of
        prod_{u in S} (1 - q_u s_l) prod_{u not in S} (1 - q_u) is an elementary symmetric
        sum, computed by dynamic programming over clients."""
        if work.deadline is None or self.fixed is not None:
            return super().no_reach_given_presence(work, presence)
        q = np.asarray(presence, float)
        k, s_reach = self.num_stragglers, self._straggler_reach()
        out = np.empty(self.num_layers)
        for layer, s in enumerate(s_reach):
            out[layer] = random_subset_product(1.0 - q * s, 1.0 - q, k)
        return out


def random_subset_product(inside: np.ndarray, outside: np.ndarray, size: int) -> float:
    """E over a uniformly random ``size``-subset S of the clients of
    prod_{u in S} inside_u * prod_{u not in S} outside_u (all factors in [0, 1]).

    That is [z^k] prod_u (outside_u + inside_u z) / C(U, k). Exact and free of overflow for
    any number of clients: tilt z -> theta z with theta chosen so that the Bernoulli
    probabilities r_u = inside_u theta / (outside_u + inside_u theta) sum to k; then
    [z^k] = theta^-k prod_u (outside_u + inside_u theta) P[sum_u Bernoulli(r_u) = k], all in
    logarithms, and the Poisson-binomial probability at its own mean comes from the product
    of the U polynomials (1 - r_u + r_u z) by pairwise (FFT) convolution, O(U log^2 U)."""
    from scipy.optimize import brentq
    from scipy.special import gammaln

    x, y = np.asarray(inside, float), np.asarray(outside, float)
    total = len(x)
    k = int(size)
    if not 0 <= k <= total:
        return 0.0
    log_choose = gammaln(total + 1) - gammaln(k + 1) - gammaln(total - k + 1)
    forced_in, forced_out = y == 0, x == 0  # clients that must be (or must not be) in S
    if np.any(forced_in & forced_out) or forced_in.sum() > k or forced_out.sum() > total - k:
        return 0.0
    log_fixed = np.log(x[forced_in]).sum() + np.log(y[forced_out]).sum()
    free = ~(forced_in | forced_out)
    x, y, k = x[free], y[free], k - int(forced_in.sum())
    if k == 0 or k == len(x):
        log_value = log_fixed + (np.log(y).sum() if k == 0 else np.log(x).sum())
        return float(np.exp(log_value - log_choose))
    log_ratio = np.log(x) - np.log(y)  # r_u = sigmoid(log_ratio + log_theta)

    def excess(log_theta: float) -> float:
        return float(np.sum(1.0 / (1.0 + np.exp(-(log_ratio + log_theta))))) - k

    low, high = -log_ratio.max() - 50.0, -log_ratio.min() + 50.0
    log_theta = brentq(excess, low, high, xtol=1e-12)
    r = 1.0 / (1.0 + np.exp(-(log_ratio + log_theta)))
    pmf_k = poisson_binomial_pmf(r)[k]
    if pmf_k <= 0:
        return 0.0
    log_tilt = np.logaddexp(np.log(y), np.log(x) + log_theta).sum()
    log_value = log_fixed - k * log_theta + log_tilt + np.log(pmf_k) - log_choose
    return float(np.exp(log_value))


def poisson_binomial_pmf(probs: np.ndarray) -> np.ndarray:
    """P[sum_u Bernoulli(probs_u) = j], j = 0..U: the product of the polynomials
    (1 - p_u + p_u z), multiplied pairwise level by level (direct convolution while short,
    batched FFTs after), O(U log^2 U)."""
    p = np.asarray(probs, float)
    size = 1 << max(0, int(np.ceil(np.log2(max(len(p), 1)))))
    polys = np.zeros((size, 2))
    polys[:, 0] = 1.0  # padding: the polynomial 1
    polys[: len(p), 0], polys[: len(p), 1] = 1.0 - p, p
    while len(polys) > 1:
        a, b = polys[0::2], polys[1::2]
        width = 2 * a.shape[1] - 1
        if a.shape[1] <= 32:
            merged = np.zeros((len(a), width))
            for i in range(a.shape[1]):
                merged[:, i : i + b.shape[1]] += a[:, i : i + 1] * b
        else:
            n = 1 << int(np.ceil(np.log2(width)))
            merged = np.fft.irfft(np.fft.rfft(a, n) * np.fft.rfft(b, n), n)[:, :width]
            np.clip(merged, 0.0, None, out=merged)
        polys = merged
    return polys[0][: len(p) + 1]


class ExponentialLayers(SystemModel):
    """ADEL-FL A4: per-layer backward times ~ Exp(mean_u), mean_u = tau * S_u / P_u, i.i.d.
    over clients, rounds, layers and local steps.

    A client's layer-steps are a Poisson process: by the deadline T it finishes
    N ~ Poisson(T / mean_u) of them. With K local steps over layers d0..L (W = L + 1 - d0
    per step), K steps of partial back-propagation reach layer l iff N >= K (L + 1 - l), so
    depth = L + 1 - min(floor(N / K), W), and steps_done = min(floor(N / W), K) whole
    steps. P[reach l] = 1 - Q(K (L+1-l), T/mean_u) and p_l = prod_u Q(K (L+1-l), T/mean_u)
    (ADEL-FL Lemma 1 at K = 1), Q the regularised upper incomplete gamma. All the work takes
    the sum of the K W draws.
    """

    name = "exponential"

    def __init__(
        self,
        num_clients: int,
        num_layers: int,
        capabilities: np.ndarray,
        time_per_sample_layer: float = 1.0,
    ):
        super().__init__(num_clients, num_layers)
        if time_per_sample_layer <= 0:
            raise ConfigError(f"system.time_per_sample_layer = {time_per_sample_layer}: must be > 0")
        self.capabilities = np.asarray(capabilities, dtype=float)
        self.time_per_sample_layer = time_per_sample_layer

    def mean_layer_time(self, batch_sizes: np.ndarray) -> np.ndarray:
        """Mean per-layer backward time of each client, tau * S_u / P_u."""
        return self.time_per_sample_layer * np.asarray(batch_sizes, float) / self.capabilities

    def sample(self, work, rng):
        L = self.num_layers
        mean = self.mean_layer_time(work.batch_sizes)
        per_step = L + 1 - work.depth
        units = work.local_steps * per_step
        times = rng.exponential(1.0, size=(self.num_clients, int(units.max()))) * mean[:, None]
        cumulative = np.cumsum(times, axis=1)
        rows = np.arange(self.num_clients)
        full = cumulative[rows, units - 1]
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, work.local_steps.copy())
        done = np.minimum((cumulative <= work.deadline).sum(axis=1), units)
        depth = L + 1 - np.minimum(done // work.local_steps, per_step)
        steps = np.minimum(done // per_step, work.local_steps)
        return Outcomes(self._everyone(), depth, full, np.minimum(full, work.deadline), steps)

    def marginals(self, work):
        if work.deadline is None:
            return self._full_marginals(work)
        L = self.num_layers
        rate = (work.deadline / self.mean_layer_time(work.batch_sizes))[:, None]  # layer-steps expected
        planned = _planned_reach(work, L)
        needed = work.local_steps[:, None] * (L + 1 - np.arange(1, L + 1))[None, :]
        reach = gammainc(needed, rate) * planned  # P[Poisson(rate) >= K (L+1-l)]
        miss = np.where(planned > 0, gammaincc(needed, rate), 1.0)
        k = np.arange(1, work.max_steps + 1)[None, :]
        step_units = k * (L + 1 - work.depth)[:, None]
        step_prob = np.where(k <= work.local_steps[:, None], gammainc(step_units, rate), 0.0)
        return Marginals(reach, np.prod(miss, axis=0), np.ones(self.num_clients), step_prob)  # Lemma 1


class PerStepCost(SystemModel):
    """AMSFL Sec. 3.4: client i needs c_i seconds per local step and b_i seconds of
    communication; t_i steps finish at c_i t_i + b_i.

    c_i = tau_step * S_i / P_i (``time_per_sample_step`` tau_step, batch size S_i,
    capability P_i), times an optional per-round jitter J ~ LogNormal(0, sigma) (median 1),
    i.i.d. over clients and rounds; b_i = ``comm_time``. A step over the planned layers d0..L
    costs the share (L+1-d0)/L of c_i. Under a deadline T a client delivers the whole steps
    it finished, steps_done = min(K, floor((T - b_i) / (c_i J f))) with f that share; reading
    the same time as K steps of partial back-propagation, it reaches layer l iff
    K c_i J (L+1-l)/L + b_i <= T. Marginals follow from the lognormal CDF (indicators when
    sigma = 0).
    """

    name = "per-step"

    def __init__(
        self,
        num_clients: int,
        num_layers: int,
        capabilities: np.ndarray,
        time_per_sample_step: float = 1.0,
        comm_time: float = 0.0,
        jitter: float = 0.0,
    ):
        super().__init__(num_clients, num_layers)
        if time_per_sample_step <= 0:
            raise ConfigError(f"system.time_per_sample_step = {time_per_sample_step}: must be > 0")
        if comm_time < 0:
            raise ConfigError(f"system.comm_time = {comm_time}: must be >= 0")
        if jitter < 0:
            raise ConfigError(f"system.step_jitter = {jitter}: must be >= 0")
        self.capabilities = np.asarray(capabilities, dtype=float)
        self.time_per_sample_step = time_per_sample_step
        self.comm_time = comm_time
        self.jitter = jitter

    def step_time(self, batch_sizes: np.ndarray) -> np.ndarray:
        """c_i, seconds per full local step (median over the jitter)."""
        return self.time_per_sample_step * np.asarray(batch_sizes, float) / self.capabilities

    def comm_times(self) -> np.ndarray:
        """b_i, seconds of communication per round."""
        return np.full(self.num_clients, float(self.comm_time))

    def sample(self, work, rng):
        L = self.num_layers
        factor = np.exp(self.jitter * rng.standard_normal(self.num_clients)) if self.jitter else 1.0
        cost = self.step_time(work.batch_sizes) * factor  # c_i J this round
        share = (L + 1 - work.depth) / L
        full = cost * share * work.local_steps + self.comm_time
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, work.local_steps.copy())
        budget = np.maximum(work.deadline - self.comm_time, 0.0) / cost  # full steps affordable
        slack = 1.0 + 1e-9  # exact fits (T = c t + b) count as finished despite rounding
        steps = np.minimum(np.floor(budget * slack / share).astype(int), work.local_steps)
        layers = np.minimum(np.floor(budget * slack * L / work.local_steps).astype(int), L + 1 - work.depth)
        return Outcomes(self._everyone(), L + 1 - layers, full, np.minimum(full, work.deadline), steps)

    def _prob_within(self, allowed: np.ndarray) -> np.ndarray:
        """P[J <= allowed] for J ~ LogNormal(0, sigma) (an indicator when sigma = 0)."""
        allowed = np.asarray(allowed, float)
        if not self.jitter:
            return (allowed >= 1.0 - 1e-9).astype(float)
        from scipy.stats import norm

        with np.errstate(divide="ignore"):
            return np.where(allowed > 0, norm.cdf(np.log(np.maximum(allowed, 1e-300)) / self.jitter), 0.0)

    def marginals(self, work):
        if work.deadline is None:
            return self._full_marginals(work)
        L = self.num_layers
        c = self.step_time(work.batch_sizes)[:, None]
        spare = max(work.deadline - self.comm_time, 0.0)
        layers_needed = (L + 1 - np.arange(1, L + 1))[None, :]
        reach = self._prob_within(spare / (c * work.local_steps[:, None] * layers_needed / L))
        reach = reach * _planned_reach(work, L)
        k = np.arange(1, work.max_steps + 1)[None, :]
        share = ((L + 1 - work.depth) / L)[:, None]
        step_prob = np.where(k <= work.local_steps[:, None], self._prob_within(spare / (c * k * share)), 0.0)
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients), step_prob)


SYSTEM_MODELS = (
    "full",
    "uniform-depth",
    "straggler-ratio",
    "exponential",
    "per-step",
    "wall-clock",
    "measured",
)


def expected_depth_fraction(system: SystemModel, deadline: float, batch_sizes: np.ndarray) -> float:
    """Average over clients of the expected share of the L layers back-propagated by the
    deadline: mean_u sum_l P[u reaches l] / L."""
    reach = system.marginals(Workload(deadline, np.asarray(batch_sizes))).reach_prob
    return float(reach.sum(axis=1).mean() / system.num_layers)


def deadline_for_depth_fraction(system: SystemModel, batch_sizes: np.ndarray, fraction: float) -> float:
    """The per-round deadline at which clients back-propagate ``fraction`` of the layers on
    average (how ADEL-FL Sec. 4 sets T_max / R: 50% for MNIST, 85% for CIFAR-10)."""
    from scipy.optimize import brentq

    if not isinstance(system, ExponentialLayers):
        raise ConfigError(f"system.model = {system.name!r}: depth calibration needs the exponential model")
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"depth fraction {fraction}: must be in (0, 1)")
    slowest = float(system.mean_layer_time(np.asarray(batch_sizes)).max())
    high = slowest * system.num_layers
    while expected_depth_fraction(system, high, batch_sizes) < fraction:
        high *= 2.0
    return float(brentq(lambda t: expected_depth_fraction(system, t, batch_sizes) - fraction, 1e-12, high))
