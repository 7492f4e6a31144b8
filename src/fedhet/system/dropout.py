"""Mid-round dropout: a client may fail while it works, wrapping any system model
(``[system] dropout = "hazard"`` or ``"trace"``).

Presence wrappers (participation, availability) decide who starts a round; a client that
starts can still fail before it delivers, as FLGo's "connectivity" model and real devices
do (an app killed, a network lost). Client u fails at a time F_u after the round (or its
start, on the event driver) begins:

- ``hazard``: F_u ~ Exp(lambda_u), ``dropout_hazard`` lambda_u in failures per simulated
  second of work, the same for every client or one per client (``dropout_hazards``, or the
  ``hazard`` column of a device-profile file); survival S_u(t) = exp(-lambda_u t).
- ``trace``: F_u is what is left of the client's online interval when the round starts, from
  a file in the availability-trace format (``dropout_trace``, see :mod:`fedhet.system.traces`;
  often the file of ``availability_trace``): the client fails when the trace takes it
  offline. Marginals read the round's start as uniform over the client's online time (the
  reading the trace availability wrapper takes for p_u): S_u(t) = sum_j max(len_j - t, 0) /
  sum_j len_j over its online intervals, an interval that runs into the next period joined
  with the one that starts it.

What a failed client delivers (``dropout_keeps``):

- ``"nothing"`` (default): a client whose delivered work would finish at f_u (the wrapped
  model's finish time, its upload included) delivers iff F_u > f_u; a failed client counts
  as absent for the round, which does not wait for it.
- ``"finished"``: the failure is the client's deadline. It stays a participant of the round
  until F_u (a round that waits for every client waits until then) with the pieces finished
  and uploaded before F_u: the layers its K partial steps reached
  and the whole steps it finished by then (the wrapped model's
  :attr:`~fedhet.system.types.Outcomes.layer_times` and ``step_times``; the client sends each
  piece as it completes). The algorithm treats it as a straggler: rules that use partial
  work (SALF's top layers, FedProx's and FedNova's steps) take what arrived; rules that need
  their whole planned work (FedAvg, TimelyFL, the asynchronous rules) get nothing unless it
  ended before F_u; rules that size a client's work themselves (HeteroFL's and FjORD's
  widths, DepthFL's depths) deliver iff the sub-model's time ended before F_u
  (:meth:`Outcomes.finishes_before_failure`). It is the optimistic bound on what a failure
  leaves; ``"nothing"`` the pessimistic one.

Marginals: with t_ul the time the work that reaches layer l is delivered (f_u for
``"nothing"``, layer_times for ``"finished"``), P[u delivers layer l] = E[1{d_u <= l}
S_u(t_ul)], likewise for k whole steps; the participation probability is E[S_u(f_u)]
(``"nothing"``) or the wrapped model's (``"finished"``: a failed client still takes part).
The expectations are over the wrapped model's outcomes: where
it draws nothing (:attr:`SystemModel.deterministic`: per-step cost and measured times
without jitter, ``full``) this is exact from one draw. Otherwise it is estimated from
``dropout_marginal_draws`` draws of the wrapped model on a fixed stream (the failure is
integrated out exactly in each draw, so the only Monte-Carlo error is the wrapped model's);
the run folder's ``dropout.json`` says which. p_l = prod_u (1 - P[u delivers l]) for models
whose clients are independent (failures are independent given the outcomes), else the
draws' mean of that product.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from fedhet import seeding
from fedhet.checks import number_list, path_option
from fedhet.errors import ConfigError
from fedhet.registry import NoOptions, register
from fedhet.system.base import SystemContext, SystemModel
from fedhet.system.participation import PresenceWrapper
from fedhet.system.types import Marginals, Outcomes, Workload

KEEPS = ("nothing", "finished")


@register("dropout", "none")
class NoDropout:
    """No wrapper: a client that starts its work delivers it."""

    name = "none"
    Options = NoOptions

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        return ctx.wrapped


def check_failure_options(options) -> None:
    """The options every failure law has: ``dropout_keeps``, what a failed client delivers
    (``"nothing"`` or the pieces it ``"finished"``); ``dropout_marginal_draws``, draws of
    the wrapped model for marginals with no closed form."""
    if options.dropout_keeps not in KEEPS:
        raise ConfigError(
            f"system.dropout_keeps = {options.dropout_keeps!r}: unknown (known: {', '.join(KEEPS)})"
        )
    if not 1 <= options.dropout_marginal_draws <= 1_000_000:
        raise ConfigError(
            f"system.dropout_marginal_draws = {options.dropout_marginal_draws}: must be in 1..1000000"
        )


@dataclass
class HazardOptions:
    """``dropout_hazard``: failures per simulated second of work, every client;
    ``dropout_hazards``: one per client instead. Precedence: ``dropout_hazards``, then the
    device profiles' ``hazard`` column (``capability_profile = "devices"``), then
    ``dropout_hazard``. ``dropout_marginal_draws`` and ``dropout_keeps``: see
    :func:`check_failure_options`."""

    dropout_hazard: float = 0.01
    dropout_hazards: list = field(default_factory=list)
    dropout_marginal_draws: int = 2000
    dropout_keeps: str = "nothing"

    def validate(self) -> None:
        check_failure_options(self)
        if not 0 <= self.dropout_hazard < float("inf"):
            raise ConfigError(f"system.dropout_hazard = {self.dropout_hazard}: must be >= 0 (per second)")
        number_list("system.dropout_hazards", self.dropout_hazards, 0.0, 1e12)

    def validate_in(self, config) -> None:
        clients = config.data.num_clients
        if self.dropout_hazards and len(self.dropout_hazards) != clients:
            raise ConfigError(
                f"system.dropout_hazards: {len(self.dropout_hazards)} values given for {clients} clients"
            )


class FailureWrapper(PresenceWrapper):
    """Shared by the failure laws: a client fails at F_u (:meth:`failure_times`, survival
    :meth:`survival`) and delivers nothing or what it finished (the module's docstring gives
    the rule and the marginals)."""

    law = ""

    def __init__(self, base: SystemModel, keeps: str = "nothing", draws: int = 2000, seed: int = 0):
        super().__init__(base)
        if keeps not in KEEPS:
            raise ConfigError(f"system.dropout_keeps = {keeps!r}: unknown (known: {', '.join(KEEPS)})")
        if keeps == "finished" and not base.times_pieces:
            raise ConfigError(
                f"system.dropout_keeps = 'finished': system.model = {base.name!r} does not say when each "
                "piece of a client's work is done; use dropout_keeps = 'nothing'"
            )
        self.keeps = keeps
        self.draws = int(draws)
        self.seed = int(seed)
        self.participation_prob = np.ones(base.num_clients)  # not used: marginals are our own
        self.name = f"{base.name}+dropout"
        self._cache: dict = {}
        self.estimated = False  # whether a marginal so far came from Monte-Carlo draws

    # -- the failure law ------------------------------------------------------------------
    @property
    def fails(self) -> bool:
        """Whether any client can fail (else the wrapper passes the wrapped model through)."""
        raise NotImplementedError

    def failure_times(self, work: Workload, rng: np.random.Generator) -> np.ndarray:
        """F_u for every client (inf: it does not fail)."""
        raise NotImplementedError

    def survival(self, times: np.ndarray) -> np.ndarray:
        """S_u(t) = P[F_u > t] for ``times`` of shape (U,) or (U, n) (rows: clients)."""
        raise NotImplementedError

    # -- sampling -------------------------------------------------------------------------
    @property
    def always_present(self) -> bool:
        return not self.fails and self.base.always_present

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        out = self.base.sample(work, rng)
        if not self.fails:
            return out
        failure = self.failure_times(work, rng)
        failed = out.participates & (failure < out.finish_time)
        finish = np.where(failed, failure, out.finish_time)
        failure_time = np.where(failed, failure, np.inf)
        if self.keeps == "nothing":
            return dataclasses.replace(
                out, participates=out.participates & ~failed, finish_time=finish, failure_time=failure_time
            )
        if out.layer_times is None or out.step_times is None:
            raise ValueError(f"system model {self.base.name!r} sampled no piece times (times_pieces)")
        # the failure is the client's deadline: what it reached and finished by then
        cut = failure[:, None]
        depth = np.maximum(out.depth, self.num_layers + 1 - (out.layer_times <= cut).sum(axis=1))
        steps = np.minimum(out.steps_done, (out.step_times <= cut).sum(axis=1))
        return dataclasses.replace(
            out,
            depth=np.where(failed, depth, out.depth),
            steps_done=np.where(failed, steps, out.steps_done),
            finish_time=finish,
            failure_time=failure_time,
        )

    # -- marginals ------------------------------------------------------------------------
    def _survival_draws(self, work: Workload):
        """(reach, steps, survive) over draws of the wrapped model: the probabilities, given
        the draw, that u delivers layer l (m, u, l), k whole steps (m, u, k) and that it
        takes part (m, u: it does not fail, or, keeping what it finished, it is present).
        One draw when the wrapped model's outcomes are deterministic for this workload.
        The wrapped models price work, not the hour, so the start time is not part of the
        key (presence wrappers, which read it, wrap this one)."""
        key = _workload_key(work)
        if key in self._cache:
            return self._cache[key]
        rng = seeding.stream(self.seed, "dropout-marginals")
        L, K = self.num_layers, work.max_steps
        layers, ks = np.arange(1, L + 1), np.arange(1, K + 1)
        reach, steps, survive = [], [], []
        for _ in range(1 if self.base.deterministic else self.draws):  # one draw: the exact law
            out = self.base.sample(work, rng)
            reached = out.depth[:, None] <= layers[None, :]
            stepped = out.steps_done[:, None] >= ks[None, :]
            if self.keeps == "nothing":
                alive = out.participates * self.survival(out.finish_time)
                reach.append(reached * alive[:, None])
                steps.append(stepped * alive[:, None])
                survive.append(alive)
                continue
            layer_times, step_times = out.layer_times, out.step_times
            if layer_times is None or step_times is None:
                raise ValueError(f"system model {self.base.name!r} sampled no piece times (times_pieces)")
            f = out.finish_time[:, None]
            present = out.participates[:, None]
            layer_t = np.where(reached, np.minimum(layer_times, f), 0.0)
            step_t = np.where(stepped, np.minimum(step_times[:, :K], f), 0.0)
            reach.append(present * reached * self.survival(layer_t))
            steps.append(present * stepped * self.survival(step_t))
            survive.append(out.participates.astype(float))  # a failed client is still there
        draws = (np.array(reach), np.array(steps), np.array(survive))
        self.estimated |= len(survive) > 1
        self._cache = {key: draws}  # rounds repeat one workload; keep the last only
        return draws

    def marginals(self, work: Workload) -> Marginals:
        if not self.fails:
            return self.base.marginals(work)
        reach, steps, survive = self._survival_draws(work)
        reach_prob = reach.mean(axis=0)
        return Marginals(
            reach_prob=reach_prob,
            no_reach_prob=self._no_reach(reach, np.ones(self.num_clients), reach_prob),
            participation_prob=survive.mean(axis=0),
            step_prob=steps.mean(axis=0),
        )

    def no_reach_given_presence(self, work: Workload, presence: np.ndarray) -> np.ndarray:
        if not self.fails:
            return self.base.no_reach_given_presence(work, presence)
        reach, _, _ = self._survival_draws(work)
        return self._no_reach(reach, np.asarray(presence, float), reach.mean(axis=0))

    def _no_reach(self, reach, presence, reach_prob) -> np.ndarray:
        """p_l: the product form for independent clients, else the draws' mean product."""
        if self.base.independent_clients:
            return np.prod(1.0 - presence[:, None] * reach_prob, axis=0)
        joint = 1.0 - presence[None, :, None] * reach
        return np.prod(joint, axis=1).mean(axis=0)

    def reports(self) -> dict[str, dict]:
        out = dict(self.base.reports())
        out["dropout"] = {
            "law": self.law,
            **self.law_report(),
            "keeps": self.keeps,
            "marginals": f"estimated from {self.draws} draws" if self.estimated else "exact",
        }
        return out

    def law_report(self) -> dict:
        """The failure law's own entries of ``dropout.json``."""
        return {}


@register("dropout", "hazard")
class HazardDropout(FailureWrapper):
    """Client u fails after F_u ~ Exp(hazard_u) seconds of work (see the module's docstring
    for what it delivers and the marginals)."""

    Options = HazardOptions
    law = "hazard"

    def __init__(
        self,
        base: SystemModel,
        hazards: np.ndarray,
        draws: int = 2000,
        seed: int = 0,
        keeps: str = "nothing",
    ):
        super().__init__(base, keeps, draws, seed)
        hazards = np.asarray(hazards, dtype=float)
        if hazards.shape != (base.num_clients,):
            raise ConfigError(f"system.dropout_hazards: {hazards.size} given for {base.num_clients} clients")
        if np.any(hazards < 0) or not np.all(np.isfinite(hazards)):
            raise ConfigError("system.dropout_hazards: every hazard must be finite and >= 0")
        self.hazards = hazards

    @classmethod
    def build(cls, options: HazardOptions, ctx: SystemContext) -> SystemModel:
        base = ctx.wrapped
        hazards = (
            np.asarray(options.dropout_hazards, float)
            if options.dropout_hazards
            else device_hazards(base, options.dropout_hazard)
        )
        return cls(base, hazards, options.dropout_marginal_draws, ctx.seed, options.dropout_keeps)

    @property
    def fails(self) -> bool:
        return bool(self.hazards.any())

    def failure_times(self, work, rng):
        with np.errstate(divide="ignore"):
            return rng.exponential(1.0, size=self.num_clients) / self.hazards  # inf where 0

    def survival(self, times):
        times = np.asarray(times, float)
        rate = self.hazards if times.ndim == 1 else self.hazards[:, None]
        return np.exp(-rate * times)

    def law_report(self) -> dict:
        return {"hazards": self.hazards.tolist()}


@dataclass
class TraceFailureOptions:
    """``dropout_trace``: a file in the availability-trace format; a client fails when the
    trace takes it offline. ``dropout_marginal_draws`` and ``dropout_keeps``: see
    :func:`check_failure_options`."""

    dropout_trace: str = path_option()
    dropout_marginal_draws: int = 2000
    dropout_keeps: str = "nothing"

    def validate(self) -> None:
        check_failure_options(self)
        if not self.dropout_trace:
            raise ConfigError(
                "system.dropout = 'trace' needs system.dropout_trace (an availability-trace file)"
            )


@register("dropout", "trace")
class TraceDropout(FailureWrapper):
    """Client u fails when its online interval ends (an availability trace); a client offline
    when its work starts fails at once. See the module's docstring for the marginals."""

    Options = TraceFailureOptions
    law = "trace"

    def __init__(self, base: SystemModel, trace, draws: int = 2000, seed: int = 0, keeps: str = "nothing"):
        super().__init__(base, keeps, draws, seed)
        if len(trace.intervals) != base.num_clients:
            raise ConfigError(f"system.dropout_trace: {len(trace.intervals)} clients for {base.num_clients}")
        self.trace = trace
        self.spells = [online_spells(spans, trace.period) for spans in trace.intervals]

    @classmethod
    def build(cls, options: TraceFailureOptions, ctx: SystemContext) -> SystemModel:
        from fedhet.system.traces import read_trace

        trace = read_trace(options.dropout_trace, ctx.num_clients, "system.dropout_trace")
        return cls(ctx.wrapped, trace, options.dropout_marginal_draws, ctx.seed, options.dropout_keeps)

    @property
    def fails(self) -> bool:
        return not all(spells == [np.inf] for spells in self.spells)

    def failure_times(self, work, rng):
        return np.array([self.time_left(c, work.start_time) for c in range(self.num_clients)])

    def time_left(self, client: int, time: float) -> float:
        """How long client ``client`` stays online from ``time`` (0 if it is offline)."""
        spans, period = self.trace.intervals[client], self.trace.period
        if self.spells[client] == [np.inf]:
            return np.inf
        t = time % period
        for start, end in spans:
            if start <= t < end:
                left = end - t
                if end >= period and spans[0][0] <= 0.0:  # runs on into the next period
                    left += spans[0][1]
                return left
        return 0.0

    def survival(self, times):
        times = np.asarray(times, float)
        rows = times if times.ndim == 2 else times[:, None]
        out = np.empty_like(rows)
        for c, spells in enumerate(self.spells):
            out[c] = spell_survival(np.asarray(spells, float), rows[c])
        return out if times.ndim == 2 else out[:, 0]

    def law_report(self) -> dict:
        return {"trace_period": self.trace.period}


def online_spells(spans: list[tuple[float, float]], period: float) -> list[float]:
    """The lengths of a client's online spells in a repeating trace: its intervals, the one
    ending at the period joined with the one starting at 0; ``[inf]`` when it is always
    online."""
    if not spans:
        return []
    lengths = [end - start for start, end in spans]
    if spans[-1][1] >= period and spans[0][0] <= 0.0:
        if len(spans) == 1:
            return [np.inf]
        lengths = [lengths[0] + lengths[-1], *lengths[1:-1]]
    return lengths


def spell_survival(spells: np.ndarray, times: np.ndarray) -> np.ndarray:
    """P[the spell outlasts t more seconds] when the start falls uniformly in the online time:
    sum_j max(len_j - t, 0) / sum_j len_j (0 for a client never online)."""
    if spells.size == 0:
        return np.zeros_like(times)
    if np.isinf(spells).any():
        return np.ones_like(times)
    left = np.maximum(spells[None, :] - times[:, None], 0.0).sum(axis=1)
    return left / spells.sum()


def device_hazards(base: SystemModel, default: float) -> np.ndarray:
    """Per-client hazards: the wrapped model's device profiles' ``hazard`` column where it
    has one (:mod:`fedhet.system.devices`), else ``default`` for every client."""
    profile = getattr(base, "device_hazards", None)
    hazards = profile() if callable(profile) else None
    return np.full(base.num_clients, float(default)) if hazards is None else np.asarray(hazards, float)


def _workload_key(work: Workload) -> tuple:
    def b(array):
        return None if array is None else np.asarray(array).tobytes()

    return (
        work.deadline, b(work.batch_sizes), b(work.local_steps), b(work.depth),
        b(work.upload_bytes), b(work.download_bytes), b(work.extra_gradients),
    )  # fmt: skip
