"""The Algorithm protocol: engine-agnostic pieces that talk through messages.

Server side:

- ``init_state(setting)`` -> server memory kept across rounds (checkpointed); algorithms
  that need the clients' view before round 1 ask for it with ``probe_tasks(setting)`` and
  read the replies in ``setting.probes``.
- ``plan(round, state, system, deadline)`` -> :class:`RoundPlan`: deadline (``None`` = wait
  for all), learning rate, per-client assignments (batch size, local steps, planned coverage,
  asked or not). ``plan`` is pure: it reads the server state and never writes it (a plan
  may be priced and dropped: the first-round check, a round past the time budget); what
  the rule wants to remember of its decision goes in ``RoundPlan.record``, which
  ``aggregate`` reads from ``context.plan``.
- ``client_task(context, client, state)`` -> the :class:`~fedhet.messages.ClientTask` sent to
  one client, its work cut to what the client's sampled outcome allows by the deadline
  (``partial_work``: ``"layers"`` keeps all steps over the layers it reached, ``"steps"``
  keeps the whole steps it finished, ``"none"`` sends nothing to a client that would not
  finish), or ``None``; ``task_payload`` adds algorithm data (SCAFFOLD's c).
- ``aggregate(params, buffers, updates, state, context, layout)`` -> new global
  (params, buffers), from the clients' :class:`~fedhet.messages.ClientUpdate`, which arrive
  sorted by client; or, for rules that can sum as updates arrive, ``aggregator(...)``
  returning a streaming :class:`~fedhet.algorithms.streaming.Aggregator`.

Client side (run by the client over its own state, see :mod:`fedhet.client`):

- ``gradient_correction(task, state, region, local, anchor)``: a term added to each local
  step's gradient over the covered ``region`` (FedProx, SCAFFOLD, FedDyn); ``None`` = plain SGD.
- ``finish_local_work(task, update, state, region, local, anchor)``: update the client's
  state and the update's payload after the local steps.
- ``observe_gradients(task, state, local_grad, anchor_grad, distance)``: with
  ``tracks_gradient_differences``, each step's gradient beside the gradient at the received
  model on the same batch (AMSFL's GDA).

Algorithms depend only on the messages, the model layout and the system model's marginals:
they never import an engine, the local trainer or the data.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedhet import registry
from fedhet.algorithms.mechanisms import check_mechanisms
from fedhet.algorithms.streaming import Aggregator, ListAggregator
from fedhet.messages import ClientTask, ClientUpdate, Coverage, Payload
from fedhet.models.layers import ModelLayout
from fedhet.registry import NoOptions
from fedhet.schedules import train_learning_rate
from fedhet.system.base import SystemModel
from fedhet.system.types import Marginals, Outcomes, Workload

# the algorithm's part of a client's state, as its client hooks see it (a
# fedhet.client.state.Namespace: keys stored under "algorithm/")
OwnState = MutableMapping[str, Any]

PARTIAL_WORK = ("none", "layers", "steps")

# the default range of a server learning rate eta_s, for the rules that have one
SERVER_LR_RANGE = {"low": 0.25, "high": 2.0, "log": True}


@dataclass(frozen=True)
class ClientAssignment:
    """The server's instructions to one client for one round: batch size, local steps, the
    planned first layer of its back-propagation (1 = all layers), whether it is asked, and
    the gradient evaluations it makes beyond its steps (AMSFL's GDA), which the clock prices
    as that many more steps."""

    batch_size: int
    local_steps: int
    asked: bool = True
    depth: int = 1
    extra_gradients: int = 0


@dataclass
class RoundPlan:
    """The server's decisions for one round."""

    round: int
    deadline: float | None
    lr: float
    assignments: list[ClientAssignment]
    record: dict = field(default_factory=dict)  # what the rule decided and why, for its report

    @property
    def batch_sizes(self) -> np.ndarray:
        return np.array([a.batch_size for a in self.assignments])

    def workload(self) -> Workload:
        """What the system model prices: the deadline, every client's batch, steps, depth
        and extra gradient evaluations."""
        extra = np.array([a.extra_gradients for a in self.assignments])
        return Workload(
            self.deadline,
            self.batch_sizes,
            np.array([a.local_steps for a in self.assignments]),
            np.array([a.depth for a in self.assignments]),
            extra_gradients=extra if extra.any() else None,
        )


@dataclass
class RoundContext:
    """What the server knows in a round: the plan, the sampled outcomes and their marginals."""

    plan: RoundPlan
    outcomes: Outcomes
    marginals: Marginals
    num_clients: int
    num_layers: int
    client_sizes: np.ndarray | None = None  # every client's number of training examples


@dataclass
class RunSetting:
    """What an algorithm may look at once, before round 1, to set up its server state: the
    run's shape, the system model, the clients' data sizes, the initial model, and the replies
    to its probe tasks (e.g. ADEL-FL's gradient statistics)."""

    num_clients: int
    num_params: int
    rounds: int
    time_budget: float  # simulated seconds; 0 = none
    system: SystemModel
    client_sizes: np.ndarray
    layout: ModelLayout
    params: torch.Tensor
    buffers: torch.Tensor
    probes: list[ClientUpdate] = field(default_factory=list)
    work_dir: Path | None = None  # the run's folder, for server state kept in files
    layer_multiply_adds: tuple = ()  # per layer, multiply-adds per example (models/cost.py)


@dataclass
class AlgorithmContext:
    """What an algorithm is built with besides its options: the run's ``[train]`` section."""

    train: Any


class Algorithm:
    """Base class; subclasses set ``name``, ``Options`` and override the pieces they change.

    **Declared capabilities** (class attributes, checked against the hooks when the class is
    registered or named): ``partial_work``, one of ``"none"`` (a client that would not
    finish gets no task), ``"layers"`` (it trains the layers it reaches, SALF's
    back-to-front cut) or ``"steps"`` (it sends the whole local steps it finished);
    ``driver``: ``"round"`` or ``"event"``; ``uses_deadline``; ``tracks_gradient_differences``.

    **Round numbers** count from 0 in this API (``plan(round_index, ...)``,
    ``RoundPlan.round``, ``RoundContext.plan.round``, ``lr_at``) and from 1 in everything a
    user reads (messages such as "aggregate (round 4)", ``metrics.csv``'s ``round`` column,
    ``fedhet run --resume``): round index t is the user's round t + 1.

    ``train`` is the run's ``[train]`` section (learning rate and its schedule, batch size,
    local steps)."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    driver: ClassVar[str] = "round"  # "round" (plan / tasks / aggregate) or "event" (AsyncAlgorithm)
    Options: ClassVar[type] = NoOptions
    uses_deadline: ClassVar[bool] = True
    partial_work: ClassVar[str] = "none"
    tracks_gradient_differences = False
    # Static BatchNorm (HeteroFL): None = the global model's BatchNorm statistics are the
    # aggregated ones; an integer = before each evaluation, recompute them on the full model
    # from that many of the clients' training examples (0 = all of them).
    static_batchnorm_examples: int | None = None
    # Whether the rule works on weights stored channels-last (run.memory_format); rules that
    # index parameter elements by their contiguous position (width masks) say False.
    supports_channels_last: ClassVar[bool] = True
    # Whether a width-reduced sub-model divides its hidden outputs by its rate during local
    # training (HeteroFL's scaler); FjORD's ordered dropout does not.
    scales_sub_models: ClassVar[bool] = True
    # Whether the rule sizes each client's work to fit before sending it (the sub-model
    # rules): a present client it sends no task was told not to work and spends no energy.
    # False: a client without a task worked on what the rule then discards (drop-stragglers'
    # late clients), charged up to the deadline or its failure (fedhet.system.energy).
    sends_only_work_that_fits: ClassVar[bool] = False
    # The options worth tuning, with default ranges (``fedhet bench`` and its suites tune
    # them beside the learning rate): option name -> { low, high[, log][, int] } or
    # { choices = [...] }, as in a search space file. Empty: the learning rate alone.
    hyperparameters: ClassVar[dict[str, dict]] = {}
    # What the rule does beyond averaging, each with the settings under which it acts and the
    # options only it reads (:mod:`fedhet.algorithms.mechanisms`): a run where one is inert
    # says so, and ``fedhet bench`` does not tune its knobs there. Empty: nothing to declare.
    mechanisms: ClassVar[tuple] = ()
    # the capability flags a class set itself (checked against its hooks at registration)
    _declared_capabilities: ClassVar[dict[str, Any]] = {}

    def __init__(self, options: Any, train: Any):
        self.options = options
        self.train = train

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Derive the capability flags from the hooks the new class defines, keeping the
        flags it sets itself for :func:`check_algorithm_class` to compare."""
        super().__init_subclass__(**kwargs)
        flags = (*CAPABILITY_HOOKS, "streams")
        cls._declared_capabilities = {flag: cls.__dict__[flag] for flag in flags if flag in cls.__dict__}
        for flag, value in _derived_capabilities(cls).items():
            setattr(cls, flag, value)

    @classmethod
    def build(cls, options: Any, ctx: Any) -> Algorithm:
        """The algorithm for a run: its options and the run's ``[train]`` section
        (``ctx.train``)."""
        return cls(options, ctx.train)

    def lr_at(self, round_index: int) -> float:
        return train_learning_rate(self.train, round_index)

    # -- before round 1 -----------------------------------------------------------------
    def probe_tasks(self, setting: RunSetting) -> list[ClientTask]:
        """Tasks to send before round 1 whose replies arrive in ``setting.probes``."""
        return []

    def init_state(self, setting: RunSetting) -> dict:
        """Server memory kept across rounds (checkpointed with the run)."""
        return {}

    def state_dict(self, state: dict, work_dir: Path | None = None) -> dict:
        """The server state ``state`` as the run's checkpoint keeps it (``torch.save``-able
        values; ``work_dir`` is the run's folder, for state kept in files). Default: the
        state as it is. Overridden where part of it lives in files (FedStale's memory)."""
        return dict(state)

    def load_state_dict(self, saved: dict, work_dir: Path | None = None) -> dict:
        """The server state back from :meth:`state_dict`'s output, when a run resumes."""
        return dict(saved)

    def reports(self, state: dict) -> dict[str, dict]:
        """Documents to write into the run directory as ``<name>.json`` (e.g. a plan)."""
        return {}

    def caveats(self) -> list[str]:
        """Settings under which this rule is provably another, simpler one (a comparison of
        the two would say nothing): one line each, warned before the run and kept in its
        summary. None by default."""
        return []

    def warnings(self, state: dict) -> list[str]:
        """Things the user must be told when the run starts (e.g. a planner fallback)."""
        return []

    def busy_clients(self, state: dict, round_index: int) -> set[int]:
        """The clients still at work on a task of an earlier round in round ``round_index``
        (server state ``state``): a straggler that trains its whole work past the deadline
        (AsyncFL, REFL) is sent no new task until its update is in, and the energy account,
        which charged that work when it began, charges such a client nothing in the rounds it
        spans (:mod:`fedhet.system.energy`). None by default."""
        return set()

    def round_metrics(self, state: dict) -> dict[str, float]:
        """Numbers of the round just aggregated (server state ``state``) that become
        columns of its metrics row (metrics.csv, reports, trackers); none by default."""
        return {}

    # -- server: planning and tasks ------------------------------------------------------
    def plan(self, round_index: int, state: dict, system: SystemModel, deadline: float | None) -> RoundPlan:
        """Default plan: every client, the configured batch and steps, the configured deadline
        (or ``None`` for algorithms that wait for all)."""
        same = ClientAssignment(self.train.batch_size, self.train.local_steps)  # frozen: one shared
        assignment = [same] * system.num_clients
        return RoundPlan(
            round=round_index,
            deadline=deadline if self.uses_deadline else None,
            lr=self.lr_at(round_index),
            assignments=assignment,
        )

    def client_task(self, context: RoundContext, client: int, state: dict) -> ClientTask | None:
        """The task for ``client`` given its sampled outcome (see ``partial_work``). Engines
        call it only for clients that are asked and present this round (the cost of a round
        follows its participants, not the population); others get no task."""
        plan, outcomes = context.plan, context.outcomes
        assignment = plan.assignments[client]
        if not (assignment.asked and outcomes.participates[client]):
            return None
        depth, steps_done = int(outcomes.depth[client]), int(outcomes.steps_done[client])
        steps, coverage = assignment.local_steps, Coverage(assignment.depth)
        if self.partial_work == "layers":
            if depth > context.num_layers:
                return None  # reached no layer: nothing to send
            coverage = Coverage(depth)
        elif self.partial_work == "steps":
            if steps_done < 1:
                return None
            steps = min(steps_done, steps)
        elif steps_done < steps:
            return None  # would not finish by the deadline: its work would be thrown away
        return self.make_task(plan, client, steps, coverage, state)

    def make_task(
        self, plan: RoundPlan, client: int, steps: int, coverage: Coverage, state: dict
    ) -> ClientTask:
        """The task of ``client`` in ``plan`` for ``steps`` local steps over ``coverage``."""
        return ClientTask(
            round=plan.round,
            client=int(client),
            lr=plan.lr,
            batch_size=plan.assignments[client].batch_size,
            local_steps=steps,
            coverage=coverage,
            deadline=plan.deadline,
            model_round=plan.round,
            payload=self.task_payload(int(client), state),
        )

    def task_payload(self, client: int, state: dict) -> Payload:
        """Algorithm data sent with a client's task (default: nothing)."""
        return {}

    def upload_payload(self, covered: int) -> dict[str, int]:
        """The payload tensors that travel as part of every trained update covering
        ``covered`` parameter elements, by key, with their element counts (SCAFFOLD's control
        change: ``covered``). They pass through the postprocessors with the delta and count
        in the upload's bytes on the clock. Default: none (scalars and statistics that
        :meth:`finish_local_work` adds are metadata, neither processed nor counted)."""
        return {}

    # -- client --------------------------------------------------------------------------
    # Capabilities follow from the hooks a class defines (check_algorithm_class sets them
    # when the class is registered or resolved): corrects_gradients <- gradient_correction,
    # tracks_gradient_differences <- observe_gradients, streams <- streaming_aggregator.
    corrects_gradients = False
    customises_loss = False
    selects_samples = False
    streams = False
    # Declared: this rule's local_loss differs per client beyond the group's shared task
    # fields (it draws from the client's stream, reads its state or a per-client payload
    # tensor), so a group computes it one client at a time. Found out on the first call where
    # a rule does not declare it; declaring it saves that try.
    local_loss_per_client: ClassVar[bool] = False

    def gradient_correction(
        self, task: ClientTask, state: OwnState, region: slice, local: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor | None:
        """Added to every local step's gradient over ``region`` (``local``: the client's
        current parameters, ``anchor``: the global ones it started from). Plain SGD: none."""
        return None

    def local_loss(
        self,
        task: ClientTask,
        state: OwnState,
        model: torch.nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        depth: int,
        loss: Any,
        rng: np.random.Generator,
    ) -> torch.Tensor:
        """The loss one local step differentiates on the batch (``x``, ``y``): by default the
        task's ``loss(model(x, depth), y)``. A rule that trains differently (FjORD's ordered
        dropout and self-distillation) overrides it; ``rng`` is the client's own stream."""
        return loss(model(x, depth), y)

    def select_samples(
        self, task: ClientTask, state: OwnState, losses: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray | None:
        """Before the local steps: the positions, in the client's data, of the examples it
        trains on this round, from each example's loss at the received model (``losses``;
        FedBalancer's sample selection); ``rng`` is the client's own stream. A rule that
        defines this hook selects samples (``selects_samples``, derived); None: all."""
        return None

    def finish_local_work(
        self,
        task: ClientTask,
        update: ClientUpdate,
        state: OwnState,
        region: slice,
        local: torch.Tensor,
        anchor: torch.Tensor,
    ) -> None:
        """After the local steps: update the client's own ``state`` and ``update.payload``."""

    def observe_gradients(
        self,
        task: ClientTask,
        state: OwnState,
        local_grad: torch.Tensor,
        anchor_grad: torch.Tensor,
        distance: float,
    ) -> None:
        """With ``tracks_gradient_differences``: each local step's gradient at the client's
        current parameters and at the received ones on the same batch, and the distance
        ||w_t - w^(k)|| between them (AMSFL Sec. 3.2)."""

    # -- server: aggregation -------------------------------------------------------------
    def preset_server_optimizer(self) -> Any:
        """The server optimizer this rule is a preset for (FedAdam: FedAvg with ``[server]
        optimizer = "adam"``), built from its options; None (the default): the run's
        ``[server]`` section decides."""
        return None

    def aggregator(
        self,
        params: torch.Tensor,
        buffers: torch.Tensor,
        tasks: list[ClientTask],
        state: dict,
        context: RoundContext,
        layout: ModelLayout,
    ) -> Aggregator:
        """The round's aggregation, fed one update at a time (``tasks``: what was sent, in
        client order): the rule's :meth:`streaming_aggregator` where the class streams
        (:attr:`streams`, derived from the hooks it defines), else collect the list and call
        :meth:`aggregate`."""
        if self.streams:
            streaming = self.streaming_aggregator(params, buffers, tasks, state, context, layout)
            if streaming is not None:
                return streaming
        return ListAggregator(
            lambda updates: self.aggregate(params, buffers, updates, state, context, layout)
        )

    def streaming_aggregator(self, params, buffers, tasks, state, context, layout) -> Aggregator | None:
        """A rule that can sum updates as they arrive returns its aggregator here (memory =
        one update, not the cohort); None = it needs the list."""
        return None

    def aggregate(
        self,
        params: torch.Tensor,
        buffers: torch.Tensor,
        updates: list[ClientUpdate],
        state: dict,
        context: RoundContext,
        layout: ModelLayout,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


def require_time_law(system: SystemModel, rule: str) -> None:
    """Refuse, in one line, a system model with no law of time for a rule that plans its
    deadline from clients' times (TimelyFL, FedBalancer): a depth-only model's times are
    defined by the deadline itself, so a deadline set from them only feeds back on itself."""
    from fedhet.errors import ConfigError

    if system.time_law() is None:
        raise ConfigError(
            f"algorithm {rule!r} plans against time: system.model = {system.name!r} has "
            "no time law (use per-step, exponential or measured)"
        )


def _defined_in(cls: type, attribute: str) -> type:
    """The class of ``cls``'s method resolution order that defines ``attribute``."""
    return next(c for c in cls.__mro__ if attribute in c.__dict__)


def overrides(cls: type, hook: str, base: type | None = None) -> bool:
    """Whether ``cls`` (or a parent below ``base``, default :class:`Algorithm`) defines
    ``hook`` itself: the hooks a class defines are its capabilities."""
    return _defined_in(cls, hook) is not (base or Algorithm)


# capability flag -> the hook whose definition it stands for
CAPABILITY_HOOKS = {
    "corrects_gradients": "gradient_correction",
    "tracks_gradient_differences": "observe_gradients",
    "customises_loss": "local_loss",
    "selects_samples": "select_samples",
}


def _derived_capabilities(cls: type) -> dict[str, bool]:
    """The capability flags that follow from the hooks ``cls`` defines. A rule streams when
    it defines :meth:`Algorithm.streaming_aggregator` for the ``aggregate`` in effect (in
    the class that defines that ``aggregate``, or a subclass of it): a subclass that
    overrides ``aggregate`` alone is never bypassed by its parent's streaming rule, and one
    that overrides ``streaming_aggregator`` alone streams with it."""
    out = {flag: overrides(cls, hook) for flag, hook in CAPABILITY_HOOKS.items()}
    streaming, aggregate = _defined_in(cls, "streaming_aggregator"), _defined_in(cls, "aggregate")
    out["streams"] = streaming is not Algorithm and issubclass(streaming, aggregate)
    return out


def check_algorithm_class(cls: type, name: str) -> None:
    """Refuse, in one line naming the class, an algorithm plug-in whose declarations do not
    match its hooks: not an :class:`Algorithm`, an unknown ``partial_work`` or ``driver``, a
    capability flag a class sets against the hook it stands for (a ``gradient_correction``
    that would never be called), an event-driven rule that is not an :class:`AsyncAlgorithm`.
    Called for built-ins at registration and for plug-ins when they are resolved."""
    from fedhet.errors import ConfigError

    label = f"algorithm {name!r} ({cls.__module__}.{cls.__qualname__})"
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"{label}: not a subclass of fedhet.algorithms.Algorithm")
    if cls.partial_work not in PARTIAL_WORK:
        raise ConfigError(f"{label}: partial_work = {cls.partial_work!r}: one of {', '.join(PARTIAL_WORK)}")
    if cls.driver not in ("round", "event"):
        raise ConfigError(f"{label}: driver = {cls.driver!r}: one of round, event")
    if cls.driver == "event" and not issubclass(cls, AsyncAlgorithm):
        raise ConfigError(f"{label}: driver = 'event' needs a subclass of AsyncAlgorithm")
    if issubclass(cls, AsyncAlgorithm) and not (
        overrides(cls, "apply_buffer", AsyncAlgorithm) or overrides(cls, "apply_models", AsyncAlgorithm)
    ):
        raise ConfigError(f"{label}: an event-driven rule defines apply_buffer or apply_models")
    if cls.local_loss_per_client is not False and not (
        cls.local_loss_per_client is True and overrides(cls, "local_loss")
    ):
        raise ConfigError(f"{label}: local_loss_per_client = True is for a rule that defines local_loss")
    _check_hook_signatures(cls, label)
    _check_hyperparameters(cls, label)
    check_mechanisms(cls, set(registry.option_fields(cls)), label)
    derived = _derived_capabilities(cls)
    for flag, value in derived.items():
        declared = next(
            (c.__dict__["_declared_capabilities"][flag] for c in cls.__mro__
             if flag in c.__dict__.get("_declared_capabilities", {})),
            None,
        )  # fmt: skip
        if declared is not None and bool(declared) != value:
            hook = CAPABILITY_HOOKS.get(flag, "streaming_aggregator")
            what = "defines" if value else "does not define"
            raise ConfigError(
                f"{label}: {flag} = {declared!r} but the class {what} {hook} for the rule in effect "
                "(remove the flag: it follows from the hooks)"
            )


def _check_hyperparameters(cls: type, label: str) -> None:
    """The declared hyperparameters are options of the class, with ranges that parse."""
    from fedhet.errors import ConfigError
    from fedhet.search_space import declared_params

    params = declared_params(cls, label)
    fields = registry.option_fields(cls)
    for param in params:
        option = param.key.split(".", 1)[1]
        if option not in fields:
            raise ConfigError(
                f"{label}: hyperparameters: {option!r} is not one of its options "
                f"({', '.join(sorted(fields)) or 'it has none'})"
            )


HOOKS = (
    "plan", "client_task", "make_task", "task_payload", "upload_payload", "gradient_correction", "local_loss",
    "select_samples",
    "finish_local_work", "observe_gradients", "aggregator", "streaming_aggregator", "aggregate",
    "init_state", "probe_tasks", "round_metrics", "state_dict", "load_state_dict", "reports", "warnings",
    "caveats",
)  # fmt: skip


def _positional(function: Any) -> tuple[int, int, bool]:
    """(required, accepted, has *args) positional parameters of ``function`` (self counted)."""
    import inspect

    params = [
        p for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]  # fmt: skip
    star = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(function).parameters.values())
    return sum(1 for p in params if p.default is p.empty), len(params), star


def _check_hook_signatures(cls: type, label: str) -> None:
    """Every hook the class overrides accepts the arguments the engine passes (the base's
    positional parameters): a mismatch is one line naming the hook, not a TypeError in a
    later round."""
    from fedhet.errors import ConfigError

    for hook in HOOKS:
        mine, base = cls.__dict__.get(hook), getattr(Algorithm, hook, None)
        if mine is None or base is None or not callable(mine) or isinstance(mine, staticmethod | classmethod):
            continue
        _, given, _ = _positional(base)
        required, accepted, star = _positional(mine)
        if required > given or (accepted < given and not star):
            import inspect

            raise ConfigError(
                f"{label}: {hook}{inspect.signature(mine)} does not take the hook's arguments "
                f"{hook}{inspect.signature(base)}"
            )


class _BuiltinAlgorithms(Mapping):
    """The built-in algorithms by name, read from the registry (the one place that keeps
    them): ``ALGORITHMS["salf"]`` is the class."""

    def _classes(self) -> dict[str, type[Algorithm]]:
        return {name: entry.cls for name, entry in registry.builtins("algorithm").items()}

    def __getitem__(self, name: str) -> type[Algorithm]:
        return self._classes()[name]

    def __iter__(self):
        return iter(self._classes())

    def __len__(self) -> int:
        return len(self._classes())


ALGORITHMS: Mapping[str, type[Algorithm]] = _BuiltinAlgorithms()


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator adding a built-in algorithm to the registry under ``cls.name``."""
    return registry.register("algorithm")(cls)


class AsyncAlgorithm(Algorithm):
    """Base of event-driven rules (FedBuff, FedAsync): no rounds. The event driver asks the
    rule which idle clients start (:meth:`choose`, up to :meth:`concurrency` in flight), for
    each one's task (:meth:`start_task`) and local steps (:meth:`plan_starts`), tells it of
    each arrival (:meth:`arrive`: whether the client may start again at once), asks which
    buffered arrivals a server step applies (:meth:`take`, also at the times :meth:`due`
    names), and turns them into a server
    step: :meth:`apply_buffer` with each update and its staleness, or, for a rule that mixes
    the clients' models rather than adding their deltas, :meth:`apply_models` with the model
    each client was sent beside its update. A class that defines ``apply_models`` gets it
    (``keeps_sent_models``, derived): the driver then keeps one copy of each model version
    still in flight, and no more."""

    driver: ClassVar[str] = "event"
    uses_deadline = False
    keeps_sent_models = False  # derived: the class defines apply_models

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.keeps_sent_models = overrides(cls, "apply_models", AsyncAlgorithm)

    def concurrency(self, num_clients: int) -> int:
        return num_clients

    def buffer_size(self) -> int:
        """Arrivals per server step."""
        return 1

    def choose(self, idle: list[int], count: int, rng: np.random.Generator) -> list[int]:
        """``count`` idle clients to start, uniformly at random (all of them when enough)."""
        if count >= len(idle):
            return sorted(idle)
        return sorted(int(c) for c in rng.choice(idle, size=count, replace=False))

    def start_task(self, client: int, start: int, version: int) -> ClientTask:
        """The task of ``client``'s ``start``-th start, on model version ``version``: the
        configured batch and local steps over every layer, no deadline."""
        return ClientTask(
            round=start,
            client=int(client),
            lr=self.lr_at(version),
            batch_size=self.train.batch_size,
            local_steps=self.train.local_steps,
            coverage=Coverage(1),
            deadline=None,
            model_round=version,
        )

    def plan_starts(self, state: dict, clients: list[int], now: float) -> list[int]:
        """The local steps of each of ``clients``, starting at simulated time ``now`` on the
        current model (server state ``state``, which the rule may update: its start
        records). Default: the configured steps for everyone."""
        return [self.train.local_steps] * len(clients)

    def arrive(self, state: dict, client: int, now: float) -> bool:
        """``client``'s update arrived at ``now`` and joined the buffer. True (the default):
        the client is free to start again at once; False: it waits until a server step
        applies its update (a group that must arrive together, FedCompass)."""
        return True

    def take(self, state: dict, buffered: list[tuple[int, int]], now: float) -> list[int]:
        """The positions of the buffered arrivals, (client, staleness) each in arrival order,
        that a server step applies now; none: no step yet. Default: the whole buffer once
        it holds :meth:`buffer_size` arrivals."""
        return list(range(len(buffered))) if len(buffered) >= self.buffer_size() else []

    def due(self, state: dict) -> float | None:
        """A simulated time at which :meth:`take` is asked again though nothing arrives (a
        group's latest arrival time, FedCompass); None (the default): only arrivals."""
        return None

    def apply_buffer(self, params, buffers, entries, state: dict, version: int):
        """One server step from ``entries`` = [(update, staleness), ...], in arrival order;
        returns the new (params, buffers)."""
        raise NotImplementedError

    def apply_models(self, params, buffers, arrivals, state: dict, version: int):
        """One server step from ``arrivals`` = [(update, staleness, sent_params,
        sent_buffers), ...]: each client's update beside the global model it was sent (its
        local model is ``sent_params + update.delta``); returns the new (params, buffers)."""
        raise NotImplementedError

    def aggregate(self, params, buffers, updates, state, context, layout):
        raise RuntimeError(f"{self.name} runs on the event-driven driver (apply_buffer), not in rounds")
