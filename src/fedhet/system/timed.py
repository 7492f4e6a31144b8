"""System models with a time law: per-layer exponential times (ADEL-FL A4) and per-step
costs (AMSFL Sec. 3.4)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedhet.checks import in_range, number_list
from fedhet.errors import ConfigError
from fedhet.registry import register
from fedhet.system.base import (
    LayerTimeLaw,
    StepTimeLaw,
    SystemContext,
    SystemModel,
    TimeLaw,
    _planned_reach,
    piece_times,
)
from fedhet.system.devices import communication_seconds, per_client
from fedhet.system.profiles import CapabilityOptions
from fedhet.system.types import Marginals, Outcomes, Workload


@dataclass
class ExponentialOptions(CapabilityOptions):
    """``time_per_sample_layer`` tau: a layer's mean backward time is tau S_u / P_u."""

    time_per_sample_layer: float = 1.0

    def validate(self) -> None:
        super().validate()
        if self.time_per_sample_layer <= 0:
            raise ConfigError(f"system.time_per_sample_layer = {self.time_per_sample_layer}: must be > 0")


@register("system_model")
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
    Options = ExponentialOptions

    @classmethod
    def build(cls, options: ExponentialOptions, ctx: SystemContext) -> SystemModel:
        caps = options.draw(ctx.num_clients, ctx.stream("system-setup"), ctx.speed)
        devices = options.devices(ctx.num_clients, ctx.stream("system-setup"), ctx.speed)
        model = cls(ctx.num_clients, ctx.num_layers, caps, options.time_per_sample_layer)
        model.hazards = None if devices is None else devices.hazard
        return model

    hazards: np.ndarray | None = None

    def device_hazards(self) -> np.ndarray | None:
        """The device profiles' failure hazards, when the file has them (mid-round dropout);
        this model prices compute only (its devices' bandwidths are not used)."""
        return self.hazards

    def time_law(self) -> TimeLaw:
        return LayerTimeLaw(self.capabilities, self.time_per_sample_layer)

    @property
    def times_pieces(self) -> bool:
        return True

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
        pieces = self._piece_times(cumulative, work)
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, work.local_steps.copy(), *pieces)
        done = np.minimum((cumulative <= work.deadline).sum(axis=1), units)
        depth = L + 1 - np.minimum(done // work.local_steps, per_step)
        steps = np.minimum(done // per_step, work.local_steps)
        return Outcomes(self._everyone(), depth, full, np.minimum(full, work.deadline), steps, *pieces)

    def _piece_times(self, cumulative: np.ndarray, work: Workload) -> tuple:
        """When the K (L+1-l)-th layer-step (layer l reached) and the k (L+1-d0)-th (k whole
        steps) finish: read off the client's cumulative layer-step times."""
        L = self.num_layers
        layers = np.arange(1, L + 1)[None, :]
        need = work.local_steps[:, None] * (L + 1 - layers)
        layer_times = np.where(
            layers >= work.depth[:, None],
            np.take_along_axis(cumulative, np.clip(need - 1, 0, cumulative.shape[1] - 1), axis=1),
            np.inf,
        )
        k = np.arange(1, work.max_steps + 1)[None, :]
        need = k * (L + 1 - work.depth)[:, None]
        step_times = np.where(
            k <= work.local_steps[:, None],
            np.take_along_axis(cumulative, np.clip(need - 1, 0, cumulative.shape[1] - 1), axis=1),
            np.inf,
        )
        return layer_times, step_times

    def marginals(self, work):
        if work.deadline is None:
            return self._full_marginals(work)
        from scipy.special import gammainc, gammaincc

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


@dataclass
class PerStepOptions(CapabilityOptions):
    """``time_per_sample_step`` tau_step (c_i = tau_step S_i / P_i), ``comm_time`` b_i (or
    ``comm_times``, one per client: AMSFL's per-client communication delays),
    ``step_jitter`` sigma of the per-round lognormal factor, ``upload_bandwidth``: bytes per
    simulated second of the client's upload (0 = uploads cost nothing beyond comm_time);
    the bytes are those of the update as it travels (after compression)."""

    time_per_sample_step: float = 1.0
    comm_time: float = 0.0
    step_jitter: float = 0.0
    upload_bandwidth: float = 0.0
    comm_times: list = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        number_list("system.comm_times", self.comm_times, 0.0, 1e12)
        if self.time_per_sample_step <= 0:
            raise ConfigError(f"system.time_per_sample_step = {self.time_per_sample_step}: must be > 0")
        if self.comm_time < 0:
            raise ConfigError(f"system.comm_time = {self.comm_time}: must be >= 0")
        in_range("system.step_jitter", self.step_jitter, 0.0, 10.0)
        if self.upload_bandwidth < 0:
            raise ConfigError(f"system.upload_bandwidth = {self.upload_bandwidth}: must be >= 0 (0 = free)")

    def validate_in(self, config) -> None:
        super().validate_in(config)
        clients = config.data.num_clients
        if self.comm_times and len(self.comm_times) != clients:
            raise ConfigError(f"system.comm_times: {len(self.comm_times)} values given for {clients} clients")


@register("system_model")
class PerStepCost(SystemModel):
    """AMSFL Sec. 3.4: client i needs c_i seconds per local step and b_i seconds of
    communication; t_i steps finish at c_i t_i + b_i.

    c_i = tau_step * S_i / P_i (``time_per_sample_step`` tau_step, batch size S_i,
    capability P_i), times an optional per-round jitter J ~ LogNormal(0, sigma) (median 1),
    i.i.d. over clients and rounds; b_i = ``comm_time`` (or ``comm_times[i]``). A step over
    the planned layers d0..L costs the share (L+1-d0)/L of c_i. Under a deadline T a client
    delivers the whole steps it finished, steps_done = min(K, floor((T - b_i) / (c_i J f)))
    with f that share; reading the same time as K steps of partial back-propagation, it
    reaches layer l iff
    K c_i J (L+1-l)/L + b_i <= T. Marginals follow from the lognormal CDF (indicators when
    sigma = 0).
    """

    name = "per-step"
    Options = PerStepOptions

    @classmethod
    def build(cls, options: PerStepOptions, ctx: SystemContext) -> SystemModel:
        caps = options.draw(ctx.num_clients, ctx.stream("system-setup"), ctx.speed)
        devices = options.devices(ctx.num_clients, ctx.stream("system-setup"), ctx.speed)
        return cls(
            ctx.num_clients,
            ctx.num_layers,
            caps,
            options.time_per_sample_step,
            comm_time=np.asarray(options.comm_times, float) if options.comm_times else options.comm_time,
            jitter=options.step_jitter,
            upload_bandwidth=options.upload_bandwidth if devices is None else devices.upload,
            download_bandwidth=0.0 if devices is None else devices.download,
            hazards=None if devices is None else devices.hazard,
        )

    def time_law(self) -> TimeLaw:
        return StepTimeLaw(self.step_time, self.comm_times)

    def __init__(
        self,
        num_clients: int,
        num_layers: int,
        capabilities: np.ndarray,
        time_per_sample_step: float = 1.0,
        comm_time: float | np.ndarray = 0.0,
        jitter: float = 0.0,
        upload_bandwidth: float | np.ndarray = 0.0,
        download_bandwidth: float | np.ndarray = 0.0,
        hazards: np.ndarray | None = None,
    ):
        super().__init__(num_clients, num_layers)
        if time_per_sample_step <= 0:
            raise ConfigError(f"system.time_per_sample_step = {time_per_sample_step}: must be > 0")
        if np.any(np.asarray(comm_time) < 0):
            raise ConfigError(f"system.comm_time = {comm_time}: must be >= 0")
        if np.shape(comm_time) not in ((), (num_clients,)):
            given = np.size(comm_time)
            raise ConfigError(f"system.comm_times: {given} values given for {num_clients} clients")
        if jitter < 0:
            raise ConfigError(f"system.step_jitter = {jitter}: must be >= 0")
        self.capabilities = np.asarray(capabilities, dtype=float)
        self.time_per_sample_step = time_per_sample_step
        self.comm_time = comm_time
        self.jitter = jitter
        self.upload_bandwidth = per_client(upload_bandwidth, num_clients)  # bytes/s per client
        self.download_bandwidth = per_client(download_bandwidth, num_clients)
        self.hazards = hazards

    def device_hazards(self) -> np.ndarray | None:
        """The device profiles' failure hazards, when the file has them (mid-round dropout)."""
        return self.hazards

    @property
    def deterministic(self) -> bool:
        return not self.jitter

    @property
    def times_pieces(self) -> bool:
        return True

    def step_time(self, batch_sizes: np.ndarray) -> np.ndarray:
        """c_i, seconds per full local step (median over the jitter)."""
        return self.time_per_sample_step * np.asarray(batch_sizes, float) / self.capabilities

    def comm_times(self, work: Workload | None = None) -> np.ndarray:
        """b_i, seconds of communication per round: ``comm_time``, plus the workload's
        ``upload_bytes`` at the client's upload bandwidth and ``download_bytes`` at its
        download bandwidth where they are set (device profiles give them per client)."""
        return communication_seconds(self.comm_time, self.upload_bandwidth, self.download_bandwidth, work)

    def sample(self, work, rng):
        L = self.num_layers
        factor = np.exp(self.jitter * rng.standard_normal(self.num_clients)) if self.jitter else 1.0
        cost = self.step_time(work.batch_sizes) * factor  # c_i J this round
        share = (L + 1 - work.depth) / L
        comm = self.comm_times(work)
        full = cost * share * work.local_steps + comm
        extra = 0.0
        if work.extra_gradients is not None:  # each priced as one more step (AMSFL's GDA, FedBalancer)
            extra = cost * share * work.extra_gradients  # done before the steps
            full = full + extra
        offset = comm + extra
        pieces = piece_times(cost / L * np.ones(self.num_clients), work, L, offset)
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, work.local_steps.copy(), *pieces,
                            comm_time=comm)  # fmt: skip
        budget = np.maximum(work.deadline - comm - extra, 0.0) / cost  # full steps affordable
        slack = 1.0 + 1e-9  # exact fits (T = c t + b) count as finished despite rounding
        steps = np.minimum(np.floor(budget * slack / share).astype(int), work.local_steps)
        layers = np.minimum(np.floor(budget * slack * L / work.local_steps).astype(int), L + 1 - work.depth)
        finish = np.minimum(full, work.deadline)
        return Outcomes(self._everyone(), L + 1 - layers, full, finish, steps, *pieces, comm_time=comm)

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
        extra = 0.0
        if work.extra_gradients is not None:
            extra = c[:, 0] * (L + 1 - work.depth) / L * work.extra_gradients
        spare = np.maximum(work.deadline - self.comm_times(work) - extra, 0.0)[:, None]
        layers_needed = (L + 1 - np.arange(1, L + 1))[None, :]
        reach = self._prob_within(spare / (c * work.local_steps[:, None] * layers_needed / L))
        reach = reach * _planned_reach(work, L)
        k = np.arange(1, work.max_steps + 1)[None, :]
        share = ((L + 1 - work.depth) / L)[:, None]
        step_prob = np.where(k <= work.local_steps[:, None], self._prob_within(spare / (c * k * share)), 0.0)
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients), step_prob)
