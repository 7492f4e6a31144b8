"""Client selection: which of the clients present in a round the server asks to train. A
plug-in kind (``[selection] rule = "..."``) that composes with every round rule and every
system model, participation and availability plug-in: it wraps them as the outermost
presence wrapper, choosing among the clients they make present.

A selector sees what a real server would: each client's data size, the mean training loss
and example count it reported with its last update, and when that update arrived (a client
asked but heard from with nothing is known only to have missed the deadline); never the
system model's draws. Built-ins:

- ``all`` (the default): every present client; no wrapper, so runs are what they were
  before selection existed, bit for bit.
- ``uniform``: ``clients_per_round`` (m) of the present clients, uniformly without
  replacement.
- ``power-of-choice`` (Cho, Wang, Joshi, "Towards Understanding Biased Client Selection in
  Federated Learning", AISTATS 2022, arXiv:2010.01243): d = ``candidates`` present clients
  drawn without replacement with probability proportional to their data fractions p_k, then
  the m of them with the highest local loss. The losses are those the candidates last
  reported (the paper's computation-free variant rpow-d: no extra forward pass); a client
  never heard from ranks first, so that each is tried once.
- ``oort`` (Lai et al., OSDI 2021, arXiv:2010.06081): statistical utility times a penalty
  for clients slower than the preferred round duration T, a staleness bonus, epsilon
  exploration of clients never asked, and a pacer that moves T (:class:`Oort`).
- ``tifl`` (Chai et al., HPDC 2020): tiers of clients by response time, one tier drawn per
  round with probabilities that favour the tiers the model does worst on (:class:`Tifl`).
- ``refl`` (Abdelmoniem et al., EuroSys 2023, arXiv:2111.13263): the present clients least
  often available so far first (:class:`LeastAvailableFirst`).

Every selector's choice is drawn from its own stream of the run's seed per round
(``selection``), so the system model's draws are those of the same run without selection.

Inclusion probabilities pi_i (what rules weighted by p_i take: FedStale's memory, SALF's p_l,
ADEL-FL's plans) are exact for ``uniform`` over clients that are always present (m/N, with
the cohort's p_l, as ``system.participation = "cohort"``) and otherwise estimated: the share
of rounds so far in which the client was asked, given it was present, (asked + 1) /
(present + 2), times its presence probability. The run's ``selection.json`` says which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedhet import seeding
from fedhet.errors import ConfigError
from fedhet.registry import NoOptions, register
from fedhet.system.base import SystemContext, SystemModel
from fedhet.system.participation import PresenceWrapper, cohort_no_reach
from fedhet.system.types import Marginals


@dataclass
class ServerView:
    """What the server knows of its clients when it selects: data sizes, each client's last
    reported mean training loss (nan: never heard from), when its last update arrived after
    the round started (nan: never), the round it was last asked (-1: never), how often it
    was asked and in how many rounds it was present (checked in). Selectors read it; the
    wrapper keeps it."""

    sizes: np.ndarray
    loss: np.ndarray
    duration: np.ndarray
    last_asked: np.ndarray
    times_asked: np.ndarray
    times_present: np.ndarray
    round: int = 0

    @classmethod
    def empty(cls, sizes: np.ndarray) -> ServerView:
        n = len(sizes)
        nan = np.full(n, np.nan)
        return cls(np.asarray(sizes, float), nan.copy(), nan.copy(), np.full(n, -1), np.zeros(n, int),
                   np.zeros(n, int))  # fmt: skip

    def state_dict(self) -> dict:
        fields = dataclasses.asdict(self).items()
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in fields}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            current = getattr(self, key)
            setattr(
                self,
                key,
                np.asarray(value, dtype=current.dtype) if isinstance(current, np.ndarray) else value,
            )


class Selector:
    """Base of the kind: ``name``, ``Options``, :meth:`choose` and the declared
    :attr:`exact_inclusion`. A selector keeps what it learns beyond the
    :class:`ServerView` in :meth:`state_dict` (checkpointed with the run)."""

    name = "base"
    Options: type = NoOptions
    summary = ""

    def __init__(self, options) -> None:
        self.options = options

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        """The wrapper that applies this selector to the model ``ctx`` wraps."""
        return Selection(ctx.wrapped, cls(options), ctx)

    def exact_inclusion(self, base: SystemModel) -> bool:
        """Whether pi_i has a closed form around ``base`` (estimated otherwise)."""
        return False

    def inclusion(self, num_clients: int) -> np.ndarray | None:
        """The exact pi_i given presence, where :meth:`exact_inclusion` holds."""
        return None

    def choose(self, present: np.ndarray, view: ServerView, rng: np.random.Generator) -> np.ndarray:
        """The clients asked this round (a boolean mask within ``present``)."""
        raise NotImplementedError

    def observe(self, view: ServerView, reported: np.ndarray) -> None:
        """Learn from the round's reports (``reported``: the clients heard from); the view is
        already updated. Nothing by default."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


@register("selection", "all")
class AllPresent:
    """Every present client is asked (no selection): the run is what it was without one."""

    name = "all"
    Options = NoOptions
    summary = "every present client (no selection)"

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        return ctx.wrapped


def _chosen(config, options) -> bool:
    """Whether ``options`` are those of the configured rule (not a stray key's owner)."""
    return isinstance(options, config.selection.entry("rule").cls.Options)


def check_round_rule(config, key: str = "selection.rule") -> None:
    """Selection asks clients each round: an event-driven rule (FedBuff, FedAsync), which
    hands work to clients as they come back, is refused in one line."""
    from fedhet.registry import resolve

    cls = resolve("algorithm", config.algorithm_name, "algorithm.name").cls
    if cls.driver == "event":
        raise ConfigError(
            f"{key} = {config.selection.rule!r} with algorithm {config.algorithm_name!r}: an event-driven "
            "rule hands work to each client as it comes back, not by rounds; selection applies to round rules"
        )


class RoundRuleOptions:
    """Options of a selection rule: the configured one refuses an event-driven rule
    (:func:`check_round_rule`); a stray option's owner checks nothing beyond itself."""

    def validate_in(self, config) -> None:
        if not _chosen(config, self):
            return
        check_round_rule(config)
        asked, clients = getattr(self, "clients_per_round", None), config.data.num_clients
        if asked is not None and asked > clients:
            raise ConfigError(
                f"selection.clients_per_round = {asked}: more than the run's {clients} clients "
                '(data.num_clients); to ask every present client each round, use rule = "all"'
            )


@dataclass
class UniformOptions(RoundRuleOptions):
    """``clients_per_round`` m: the clients asked each round (every present one when fewer
    are present)."""

    clients_per_round: int = 10  # m, the clients asked each round (every present one when fewer)

    def validate(self) -> None:
        if isinstance(self.clients_per_round, bool) or self.clients_per_round < 1:
            raise ConfigError(f"selection.clients_per_round = {self.clients_per_round!r}: must be >= 1")


@register("selection", "uniform")
class UniformSelection(Selector):
    """m of the present clients, uniformly without replacement (FedAvg's client sampling)."""

    name = "uniform"
    Options = UniformOptions
    summary = "m of the present clients, uniformly at random"

    def exact_inclusion(self, base: SystemModel) -> bool:
        """m of N always-present clients: pi = m/N; p_l is the cohort's where the clients'
        outcomes are independent, the wrapped model's own when every client is asked."""
        everyone = self.options.clients_per_round >= base.num_clients
        return bool(base.always_present) and (everyone or bool(base.independent_clients))

    def inclusion(self, num_clients: int) -> np.ndarray | None:
        return np.full(num_clients, min(1.0, self.options.clients_per_round / num_clients))

    def choose(self, present, view, rng):
        chosen = np.zeros(len(present), dtype=bool)
        pool = np.flatnonzero(present)
        m = min(self.options.clients_per_round, len(pool))
        chosen[rng.choice(pool, m, replace=False)] = True
        return chosen


@dataclass
class PowerOfChoiceOptions(RoundRuleOptions):
    """``clients_per_round`` m and ``candidates`` d >= m (Cho et al.'s d; their experiments use
    d between m and N); fewer present clients than d: all of them are candidates."""

    clients_per_round: int = 10  # m, the clients asked each round among the candidates
    candidates: int = 20  # d >= m, drawn by data size among the present clients (all when fewer)

    def validate(self) -> None:
        UniformOptions(self.clients_per_round).validate()
        if isinstance(self.candidates, bool) or self.candidates < 1:
            raise ConfigError(f"selection.candidates = {self.candidates!r}: must be >= 1")

    def validate_in(self, config) -> None:
        super().validate_in(config)
        if not _chosen(config, self):
            return
        if self.candidates < self.clients_per_round:
            raise ConfigError(
                f"selection.candidates = {self.candidates}: must be >= selection.clients_per_round "
                f"({self.clients_per_round}): d candidates, the m highest losses among them"
            )
        if self.candidates > config.data.num_clients:
            raise ConfigError(
                f"selection.candidates = {self.candidates}: more than the run's {config.data.num_clients} "
                "clients (data.num_clients): d candidates are drawn from them"
            )


@register("selection", "power-of-choice")
class PowerOfChoice(Selector):
    """Cho et al. (arXiv:2010.01243), pi_pow-d: a candidate set A of d clients drawn without
    replacement with probability p_k (data fractions), then the m clients of A with the
    highest F_k(w); F_k here is the loss k last reported (rpow-d): +inf for a client never
    asked (the authors' unvisited clients), -inf for one asked but never heard from (it
    missed every deadline: ranked last, so that it is not asked round after round)."""

    name = "power-of-choice"
    Options = PowerOfChoiceOptions
    summary = "d candidates by data size, then the m with the highest last reported loss (Cho et al. 2022)"

    def choose(self, present, view, rng):
        chosen = np.zeros(len(present), dtype=bool)
        pool = np.flatnonzero(present)
        if not len(pool):
            return chosen
        weights = view.sizes[pool] / view.sizes[pool].sum()
        d = min(self.options.candidates, len(pool))
        candidates = rng.choice(pool, d, replace=False, p=weights)
        never_asked = view.times_asked[candidates] == 0
        silent = np.where(never_asked, np.inf, -np.inf)
        loss = np.where(np.isnan(view.loss[candidates]), silent, view.loss[candidates])
        order = np.lexsort((candidates, -loss))  # highest loss first; ties by client index
        chosen[candidates[order[: self.options.clients_per_round]]] = True
        return chosen


def _fill(chosen: np.ndarray, pool: np.ndarray, count: int, rng, weights=None) -> None:
    """Mark ``count`` more clients of ``pool`` in ``chosen`` (all when fewer are left), drawn
    without replacement, with probabilities proportional to ``weights`` (one per client of
    ``pool``) when given."""
    left = ~chosen[pool]
    pool = pool[left]
    count = min(count, len(pool))
    if count <= 0:
        return
    p = None
    if weights is not None:
        w = np.asarray(weights, float)[left]
        p = w / w.sum() if np.count_nonzero(w) >= count else None
    chosen[rng.choice(pool, count, replace=False, p=p)] = True


@dataclass
class OortOptions(RoundRuleOptions):
    """Oort's knobs (Lai et al., OSDI 2021, Sec. 4-5). Defaults: epsilon 0.9 decaying by 0.98
    per round to 0.2, alpha = 2, c = 0.95, W = 20 rounds, the values reproductions of the
    paper take (the authors' public code decays epsilon by 0.95 instead)."""

    clients_per_round: int = 10  # K, the clients asked each round
    straggler_penalty: float = 2.0  # alpha in (T / t_i)^alpha for a client slower than T
    exploration: float = 0.9  # epsilon at the start: the share of K asked among unexplored clients
    exploration_decay: float = 0.98  # epsilon times this every round
    exploration_min: float = 0.2  # epsilon's floor
    cutoff: float = 0.95  # c: exploited clients are those within c of the K-th highest utility
    pacer_percentile: float = 50.0  # T starts at this percentile of the reported durations
    pacer_window: int = 20  # W: rounds between the pacer's checks
    pacer_step: float = 10.0  # percentile points T moves up when a window's utility fell

    def validate(self) -> None:
        UniformOptions(self.clients_per_round).validate()
        for key in ("exploration", "exploration_decay", "exploration_min", "cutoff"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"selection.{key} = {value!r}: must be in [0, 1]")
        if not 0.0 <= self.straggler_penalty < float("inf"):
            raise ConfigError(f"selection.straggler_penalty = {self.straggler_penalty!r}: must be >= 0")
        if not 0.0 <= self.pacer_percentile <= 100.0 or not 0.0 <= self.pacer_step <= 100.0:
            raise ConfigError(
                f"selection.pacer_percentile = {self.pacer_percentile!r}, pacer_step = {self.pacer_step!r}: "
                "percentiles in [0, 100]"
            )
        if isinstance(self.pacer_window, bool) or self.pacer_window < 1:
            raise ConfigError(f"selection.pacer_window = {self.pacer_window!r}: must be >= 1")
        if self.exploration_min > self.exploration:
            raise ConfigError(
                f"selection.exploration_min = {self.exploration_min!r}: above selection.exploration = "
                f"{self.exploration!r}, where epsilon starts (the floor must not be above the start)"
            )


@register("selection", "oort")
class Oort(Selector):
    """Oort (Lai et al., "Oort: Efficient Federated Learning via Guided Participant
    Selection", OSDI 2021, arXiv:2010.06081), Algorithm 1. A client heard from has the
    utility

        Util(i) = |B_i| sqrt(mean_k Loss(k)^2) * (T / t_i)^(alpha 1[T < t_i]) + sqrt(0.1 ln R / L_i)

    (statistical utility, system penalty, staleness bonus: R the round, L_i the round it was
    last asked); here the reported mean training loss stands for the root mean square of its
    examples' losses, |B_i| is its example count and t_i when its update arrived. Each round
    (1 - epsilon) K clients are exploited: those within ``cutoff`` of the K(1 - epsilon)-th
    highest utility, drawn with probability proportional to their utility; epsilon K are
    explored among the clients never asked, uniformly (the server knows nothing of their
    speed); epsilon decays. The pacer: T is the ``pacer_percentile`` of the reported
    durations, moved up ``pacer_step`` points whenever a window of ``pacer_window`` rounds
    gathered less statistical utility than the window before (the paper's Sec. 4.3)."""

    name = "oort"
    Options = OortOptions
    summary = "utility = statistical x system, epsilon exploration, pacer (Lai et al. OSDI 2021)"

    def __init__(self, options: OortOptions) -> None:
        super().__init__(options)
        self.epsilon = options.exploration
        self.percentile = options.pacer_percentile
        self.windows: list[float] = [0.0]  # statistical utility gathered per pacer window

    def utility(self, view: ServerView) -> np.ndarray:
        """Util(i) of every client (nan for one never heard from)."""
        statistical = view.sizes * view.loss
        known = view.duration[np.isfinite(view.duration)]
        preferred = float(np.percentile(known, self.percentile)) if len(known) else np.inf
        slow = np.isfinite(view.duration) & (view.duration > preferred)
        penalty = np.where(
            slow, (preferred / np.where(slow, view.duration, 1.0)) ** self.options.straggler_penalty, 1.0
        )
        asked = np.maximum(view.last_asked, 0) + 1.0
        bonus = np.sqrt(0.1 * np.log(max(view.round, 1)) / asked)
        return statistical * penalty + bonus

    def choose(self, present, view, rng):
        chosen = np.zeros(len(present), dtype=bool)
        k = self.options.clients_per_round
        explored = present & np.isfinite(view.loss)
        exploit = min(int(round((1.0 - self.epsilon) * k)), int(explored.sum()))
        if exploit:
            pool = np.flatnonzero(explored)
            util = self.utility(view)[pool]
            floor = self.options.cutoff * np.sort(util)[::-1][exploit - 1]
            keep = pool[util >= floor]
            _fill(chosen, keep, exploit, rng, weights=np.maximum(self.utility(view)[keep], 1e-12))
        _fill(chosen, np.flatnonzero(present & (view.last_asked < 0)), k - int(chosen.sum()), rng)
        _fill(chosen, np.flatnonzero(present), k - int(chosen.sum()), rng)  # too few unexplored
        self.epsilon = max(self.options.exploration_min, self.epsilon * self.options.exploration_decay)
        return chosen

    def observe(self, view: ServerView, reported: np.ndarray) -> None:
        """Adds the round's statistical utility to the pacer's window; at a window's end, T's
        percentile moves up when the window gathered less than the one before."""
        self.windows[-1] += float(np.nansum(view.sizes[reported] * view.loss[reported]))
        if view.round % self.options.pacer_window == 0:
            if len(self.windows) >= 2 and self.windows[-1] < self.windows[-2]:
                self.percentile = min(100.0, self.percentile + self.options.pacer_step)
            self.windows = [self.windows[-1], 0.0]

    def state_dict(self) -> dict:
        return {"epsilon": self.epsilon, "percentile": self.percentile, "windows": list(self.windows)}

    def load_state_dict(self, state: dict) -> None:
        self.epsilon, self.percentile = float(state["epsilon"]), float(state["percentile"])
        self.windows = [float(w) for w in state["windows"]]


@dataclass
class TiflOptions(RoundRuleOptions):
    """TiFL's knobs (Chai et al., HPDC 2020)."""

    clients_per_round: int = 10  # m, the clients asked each round, all from one tier
    tiers: int = 5  # tiers of clients by their reported durations (equal-size groups)
    interval: int = 10  # I: rounds between re-tiering and new tier probabilities

    def validate(self) -> None:
        UniformOptions(self.clients_per_round).validate()
        for key in ("tiers", "interval"):
            value = getattr(self, key)
            if isinstance(value, bool) or value < 1:
                raise ConfigError(f"selection.{key} = {value!r}: must be >= 1")

    def validate_in(self, config) -> None:
        super().validate_in(config)
        if not _chosen(config, self):
            return
        clients = config.data.num_clients
        if self.tiers > clients:
            raise ConfigError(
                f"selection.tiers = {self.tiers}: more tiers than the run's {clients} clients "
                "(data.num_clients)"
            )

    def caveats(self, num_clients: int) -> list[str]:
        """Rounds that ask fewer clients than ``clients_per_round``: TiFL asks all of them
        from one tier, and the smallest of ``tiers`` equal tiers holds N // tiers."""
        smallest = num_clients // self.tiers
        if self.clients_per_round <= smallest:
            return []
        return [
            f"selection.clients_per_round = {self.clients_per_round}: TiFL asks its clients from one tier, "
            f"and {num_clients} clients in {self.tiers} tiers leave {smallest} in the smallest: its rounds "
            f"ask as few as {smallest} (raise data.num_clients or lower selection.tiers to compare at "
            f"{self.clients_per_round})"
        ]


def _mean_loss(losses: np.ndarray) -> float:
    """The mean of the reported losses (inf when none: a tier never heard from ranks worst)."""
    known = losses[np.isfinite(losses)]
    return float(known.mean()) if len(known) else float("inf")


@register("selection", "tifl")
class Tifl(Selector):
    """TiFL (Chai et al., "TiFL: A Tier-based Federated Learning System", HPDC 2020): the
    clients are grouped into ``tiers`` by their response times; each round one tier is drawn
    and m of its present clients are asked, uniformly. Adaptive tier selection (its
    Algorithm 2): every ``interval`` rounds the tiers are ranked by how badly the model does
    on them, and the worse a tier the likelier it is drawn (probabilities proportional to
    ``tiers``, ..., 1 down the ranking). TiFL ranks by each tier's test accuracy; here the
    mean training loss its clients last reported stands for it (the server evaluates nothing
    on the clients). Clients never asked are profiled first: asked, uniformly, before any
    tier is drawn. A client asked but never heard from missed its deadline every time: as
    TiFL's profiling marks clients slower than its latency limit, it is a dropout: in no
    tier, and not asked again."""

    name = "tifl"
    Options = TiflOptions
    summary = "tiers by response time, tier drawn by adaptive probabilities (Chai et al. HPDC 2020)"

    def __init__(self, options: TiflOptions) -> None:
        super().__init__(options)
        self.tier_of: list[int] = []  # each client's tier (0 = fastest), once profiled
        self.probabilities: list[float] = []

    def retier(self, view: ServerView) -> None:
        """Tiers from the reported durations; tier probabilities from the tiers' losses."""
        heard = np.flatnonzero(np.isfinite(view.duration))
        count = max(1, min(self.options.tiers, len(heard)))
        order = heard[np.argsort(view.duration[heard], kind="stable")]
        tier_of = np.full(len(view.duration), -1)  # -1: a dropout, in no tier
        for tier, members in enumerate(np.array_split(order, count)):
            tier_of[members] = tier
        self.tier_of = tier_of.tolist()
        losses = [_mean_loss(view.loss[tier_of == t]) for t in range(count)]
        ranking = np.argsort(-np.asarray(losses), kind="stable")  # the worst (highest loss) first
        weights = np.empty(count)
        weights[ranking] = np.arange(count, 0, -1, dtype=float)
        self.probabilities = (weights / weights.sum()).tolist()

    def choose(self, present, view, rng):
        chosen = np.zeros(len(present), dtype=bool)
        m = self.options.clients_per_round
        unknown = np.flatnonzero(present & (view.times_asked == 0))
        if len(unknown):  # profiling: every client is asked before tiers exist
            _fill(chosen, unknown, m, rng)
            return chosen
        if not self.tier_of or view.round % self.options.interval == 0:
            self.retier(view)
        tier_of = np.asarray(self.tier_of)
        alive = [t for t in range(len(self.probabilities)) if (present & (tier_of == t)).any()]
        if not alive:
            return chosen
        p = np.asarray([self.probabilities[t] for t in alive])
        tier = alive[int(rng.choice(len(alive), p=p / p.sum()))]
        _fill(chosen, np.flatnonzero(present & (tier_of == tier)), m, rng)
        return chosen

    def state_dict(self) -> dict:
        return {"tier_of": list(self.tier_of), "probabilities": list(self.probabilities)}

    def load_state_dict(self, state: dict) -> None:
        self.tier_of = [int(t) for t in state["tier_of"]]
        self.probabilities = [float(p) for p in state["probabilities"]]


@register("selection", "refl")
class LeastAvailableFirst(Selector):
    """REFL's participant selection (Abdelmoniem et al., "REFL: Resource-Efficient Federated
    Learning", EuroSys 2023, arXiv:2111.13263): of the present clients, the m least likely to
    be available later are asked first, so that rarely available clients' data is not lost to
    frequently available ones. REFL predicts availability with a model of each device's
    history; here a client's predicted availability is the share of rounds so far in which
    it was present, (present + 1) / (rounds + 2); ties are broken at random. (REFL's other
    half, staleness-aware aggregation of late updates, is a round rule's business.)"""

    name = "refl"
    Options = UniformOptions
    summary = "the m present clients least often available so far first (REFL, EuroSys 2023)"

    def choose(self, present, view, rng):
        chosen = np.zeros(len(present), dtype=bool)
        pool = np.flatnonzero(present)
        availability = (view.times_present[pool] + 1.0) / (view.round + 2.0)
        order = np.lexsort((rng.random(len(pool)), availability))  # least available first
        chosen[pool[order[: self.options.clients_per_round]]] = True
        return chosen


class Selection(PresenceWrapper):
    """Wraps a system model: each round the selector asks some of the clients it makes
    present; the others sit the round out. Keeps the :class:`ServerView` (updated from the
    delivered updates in :meth:`observe`) and the counts behind the estimated pi_i."""

    def __init__(self, base: SystemModel, selector: Selector, ctx: SystemContext):
        super().__init__(base)
        sizes = np.ones(base.num_clients) if ctx.client_sizes is None else np.asarray(ctx.client_sizes, float)
        self.selector, self.seed = selector, ctx.seed
        self.view = ServerView.empty(sizes)
        self.exact = selector.exact_inclusion(base)
        self._arrival = np.full(base.num_clients, np.nan)
        self.name = f"{base.name}+{selector.name}"

    @property
    def participation_prob(self) -> np.ndarray:  # type: ignore[override]
        """pi_i given presence (the wrapped model's presence multiplies it in
        :meth:`marginals`): exact, or the smoothed share of present rounds asked."""
        exact = self.selector.inclusion(self.num_clients) if self.exact else None
        if exact is not None:
            return exact
        return (self.view.times_asked + 1.0) / (self.view.times_present + 2.0)

    @property
    def independent_clients(self) -> bool:
        return False  # a selection couples the clients it chooses among

    def sample(self, work, rng):
        out = self.base.sample(work, rng)
        stream = seeding.round_stream(self.seed, "selection", self.view.round)
        chosen = self.selector.choose(out.participates.copy(), self.view, stream) & out.participates
        self.view.times_present += out.participates
        self.view.times_asked += chosen
        self.view.last_asked[chosen] = self.view.round
        self.view.round += 1
        self._arrival = np.where(chosen, out.finish_time, np.nan)  # from the round's start
        return dataclasses.replace(out, participates=chosen)

    def observe(self, updates) -> None:
        self.base.observe(updates)
        reported = np.zeros(self.num_clients, dtype=bool)
        for update in updates:
            c = update.client
            self.view.loss[c] = float(update.loss)
            self.view.duration[c] = float(self._arrival[c]) if np.isfinite(self._arrival[c]) else np.nan
            reported[c] = True
        self.selector.observe(self.view, reported)

    def marginals(self, work) -> Marginals:
        out = super().marginals(work)
        m = getattr(self.selector.options, "clients_per_round", self.num_clients)
        if self.exact and isinstance(self.selector, UniformSelection) and m < self.num_clients:
            reach = self.base.marginals(work).reach_prob
            out.no_reach_prob = cohort_no_reach(reach, np.ones(self.num_clients),
                                                self.selector.options.clients_per_round)  # fmt: skip
        return out

    def wrapper_state_dict(self) -> dict:
        return {"view": self.view.state_dict(), "selector": self.selector.state_dict()}

    def load_wrapper_state_dict(self, state: dict) -> None:
        self.view.load_state_dict(state["view"])
        self.selector.load_state_dict(state.get("selector", {}))

    def reports(self) -> dict[str, dict]:
        out = dict(self.base.reports())
        out["selection"] = {
            "rule": self.selector.name,
            "inclusion": "exact" if self.exact else "estimated from the rounds so far",
            "times_asked": self.view.times_asked.tolist(),
            "times_present": self.view.times_present.tolist(),
            "rounds": self.view.round,
        }
        return out
