"""The parts a rule is made of, each a small protocol with shared defaults.

A rule (:class:`fedhet.algorithms.Algorithm`) names its parts; a new paper replaces the one
it changes and keeps the others:

- :class:`Planner` (server, round driver): the round's plan, each client's task and payload,
  the learning-rate schedule, probes before round 1, the clients still busy.
- :class:`ClientPart` (device): what one local step differentiates and adds (local loss,
  gradient correction, sample selection, gradient tracking) and what it does after its
  steps. The trainer receives this part, never the rule.
- :class:`Aggregation` (server): the round's aggregation, streamed or over the list, and the
  server optimizer it is a preset for.
- :class:`EventScheduler` and :class:`EventAggregation` (server, event driver): who starts
  when with how many steps, which arrivals a server step applies, and that step.
- :class:`Reporting` (server): documents, metrics columns, warnings and caveats.

Every part is built with the rule it belongs to and reads its ``options`` and ``train``;
what a part does not define (a declaration such as ``partial_work``, a helper on the rule)
is read from the rule. The server parts share one server-state dict; each says what it
keeps with ``init_state`` and converts its own keys for the checkpoint
(``state_dict``/``load_state_dict``).

Who may know what: the planner plans before the round's outcomes are drawn (``plan`` sees
the round, the server state with what clients reported before, and the system model's
declared laws); ``client_task`` cuts each task to what the client's own outcome allows, as
the device lives it; the aggregation runs on what arrived by the deadline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedhet.algorithms.streaming import Aggregator, ListAggregator
from fedhet.algorithms.types import ClientAssignment, OwnState, RoundContext, RoundPlan, RunSetting
from fedhet.messages import ClientTask, ClientUpdate, Coverage, Payload
from fedhet.models.layers import ModelLayout
from fedhet.schedules import train_learning_rate
from fedhet.system.base import SystemModel


class Part:
    """A part of a rule: built with the rule (``self.rule``), whose ``options`` and ``train``
    it reads; an attribute the part lacks is the rule's."""

    # the public hooks a subclass may define: the engine calls these and no other
    hooks: ClassVar[tuple[str, ...]] = ()

    def __init__(self, rule: Any):
        self.rule = rule
        self.options = rule.options
        self.train = rule.train

    def __getattr__(self, name: str) -> Any:
        rule = self.__dict__.get("rule")
        if rule is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(rule, name)


class ServerPart(Part):
    """A server-side part: it may keep server state across rounds (checkpointed)."""

    hooks: ClassVar[tuple[str, ...]] = ("init_state", "state_dict", "load_state_dict")

    def init_state(self, setting: RunSetting) -> dict:
        """The keys of the server state this part keeps (checkpointed with the run)."""
        return {}

    def state_dict(self, state: dict, work_dir: Path | None = None) -> dict:
        """This part's keys of the server state as the checkpoint keeps them
        (``torch.save``-able; ``work_dir`` is the run's folder, for state kept in files).
        Default: as they are. FedStale's memory keeps itself in files."""
        return dict(state)

    def load_state_dict(self, saved: dict, work_dir: Path | None = None) -> dict:
        """This part's keys back from :meth:`state_dict`'s output, when a run resumes."""
        return dict(saved)


class Planner(ServerPart):
    """The server's decisions for a round (round driver). :meth:`plan` is pure: it reads the
    server state and never writes it (a plan may be priced and dropped); what the rule must
    remember of its decision goes in ``RoundPlan.record``, which the aggregation reads from
    ``context.plan``."""

    hooks = (*ServerPart.hooks, "probe_tasks", "plan", "client_task", "make_task", "task_payload",
             "lr_at", "busy_clients", "idle_clients")  # fmt: skip

    def lr_at(self, round_index: int) -> float:
        """The clients' learning rate in round ``round_index`` (``[train]``'s schedule)."""
        return train_learning_rate(self.train, round_index)

    def probe_tasks(self, setting: RunSetting) -> list[ClientTask]:
        """Tasks to send before round 1 whose replies arrive in ``setting.probes``."""
        return []

    def plan(self, round_index: int, state: dict, system: SystemModel, deadline: float | None) -> RoundPlan:
        """Before the round's outcomes are drawn: every client, the configured batch and
        steps, the configured deadline (``None`` for rules that wait for all)."""
        same = ClientAssignment(self.train.batch_size, self.train.local_steps)  # frozen: one shared
        return RoundPlan(
            round=round_index,
            deadline=deadline if self.rule.uses_deadline else None,
            lr=self.lr_at(round_index),
            assignments=[same] * system.num_clients,
        )

    def client_task(self, context: RoundContext, client: int, state: dict) -> ClientTask | None:
        """The task of ``client`` as its own outcome lets it work (the rule's
        ``partial_work``: ``"layers"`` keeps every step over the layers it reaches,
        ``"steps"`` the whole steps it finishes, ``"none"`` sends nothing to a client that
        would not finish). Called only for clients asked and present this round."""
        plan, outcomes = context.plan, context.outcomes
        assignment = plan.assignments[client]
        if not (assignment.asked and outcomes.participates[client]):
            return None
        depth, steps_done = int(outcomes.depth[client]), int(outcomes.steps_done[client])
        steps, coverage = assignment.local_steps, Coverage(assignment.depth)
        partial_work = self.rule.partial_work
        if partial_work == "layers":
            if depth > context.num_layers:
                return None  # reached no layer: nothing to send
            coverage = Coverage(depth)
        elif partial_work == "steps":
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
        """Rule data sent with a client's task (SCAFFOLD's c); default: nothing."""
        return {}

    def busy_clients(self, state: dict, round_index: int) -> set[int]:
        """The clients still at work on a task of an earlier round (AsyncFL's and REFL's
        stragglers): sent no new task, and charged no energy in the rounds their work spans
        (:mod:`fedhet.system.energy`). None by default."""
        return set()

    def idle_clients(self, state: dict, round_index: int) -> set[int]:
        """The present clients the rule told not to work in round ``round_index`` (no
        sub-model fits them): charged no energy. A present client without a task that is
        not among them did work the rule then discards (drop-stragglers' late clients, a
        sub-model that missed the deadline) and is charged up to the deadline or its
        failure. None by default."""
        return set()


# capability flag of a client part -> the hook whose definition it stands for
CLIENT_CAPABILITIES = {
    "corrects_gradients": "gradient_correction",
    "tracks_gradient_differences": "observe_gradients",
    "customises_loss": "local_loss",
    "selects_samples": "select_samples",
    "starts_elsewhere": "start_point",
}


def defined_in(cls: type, attribute: str) -> type:
    """The class of ``cls``'s method resolution order that defines ``attribute``."""
    return next(c for c in cls.__mro__ if attribute in c.__dict__)


class ClientPart(Part):
    """What a client does beyond plain SGD on the task's loss. Its capabilities follow from
    the hooks a class defines (``corrects_gradients`` <- :meth:`gradient_correction`, ...);
    a flag set against its hook is refused at registration. Declared:
    ``local_loss_per_client`` (its ``local_loss`` draws from the client's stream or reads
    its state, so a group computes it client by client) and ``scales_sub_models``."""

    hooks = ("gradient_correction", "local_loss", "select_samples", "finish_local_work", "observe_gradients",
             "upload_payload", "start_point")  # fmt: skip
    corrects_gradients: ClassVar[bool] = False
    tracks_gradient_differences: ClassVar[bool] = False
    customises_loss: ClassVar[bool] = False
    selects_samples: ClassVar[bool] = False
    starts_elsewhere: ClassVar[bool] = False
    local_loss_per_client: ClassVar[bool] = False
    # Whether a width-reduced sub-model divides its hidden outputs by its rate during local
    # training (HeteroFL's scaler); FjORD's ordered dropout does not.
    scales_sub_models: ClassVar[bool] = True
    _declared_capabilities: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._declared_capabilities = {f: cls.__dict__[f] for f in CLIENT_CAPABILITIES if f in cls.__dict__}
        for flag, hook in CLIENT_CAPABILITIES.items():
            setattr(cls, flag, defined_in(cls, hook) is not ClientPart)

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
        """The loss one local step differentiates on the batch: by default the task's
        ``loss(model(x, depth), y)`` (FjORD, DepthFL and FIARSE train differently); ``rng``
        is the client's own stream."""
        return loss(model(x, depth), y)

    def select_samples(
        self, task: ClientTask, state: OwnState, losses: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray | None:
        """Before the local steps: the positions, in the client's data, of the examples it
        trains on, from each example's loss at the received model (FedBalancer); None: all."""
        return None

    def start_point(self, task: ClientTask, state: OwnState) -> torch.Tensor | None:
        """The parameters (flat, all of them) the client's local steps start from instead of
        the received ones (FedAWE's x_i, the model of the round after its last
        participation); its delta is then w_u - start. None: the received ones."""
        return None

    def finish_local_work(self, task: ClientTask, update: ClientUpdate, state: OwnState, region: slice,
                          local: torch.Tensor, anchor: torch.Tensor) -> None:  # fmt: skip
        """After the local steps: update the client's own ``state`` and ``update.payload``
        (``anchor``: the parameters the steps started from)."""

    def observe_gradients(self, task: ClientTask, state: OwnState, local_grad: torch.Tensor,
                          anchor_grad: torch.Tensor, distance: float) -> None:  # fmt: skip
        """Each local step's gradient at the client's current parameters and at the received
        ones on the same batch, and the distance ||w_t - w^(k)|| (AMSFL Sec. 3.2)."""

    def upload_payload(self, covered: int) -> dict[str, int]:
        """The payload tensors that travel with every update covering ``covered`` parameter
        elements, by key, with their element counts (SCAFFOLD's control change): processed
        with the delta and counted in the upload's bytes. Default: none."""
        return {}


class Aggregation(ServerPart):
    """The round's aggregation: :meth:`streaming_aggregator` where the rule can sum updates
    as they arrive (``streams``, derived), else :meth:`aggregate` over the list."""

    hooks = (*ServerPart.hooks, "aggregator", "streaming_aggregator", "aggregate", "preset_server_optimizer")
    streams: ClassVar[bool] = False
    _declared_capabilities: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """``streams``: the class defines :meth:`streaming_aggregator` for the ``aggregate``
        in effect (a subclass overriding ``aggregate`` alone is never bypassed by its
        parent's streaming rule)."""
        super().__init_subclass__(**kwargs)
        cls._declared_capabilities = {"streams": cls.__dict__["streams"]} if "streams" in cls.__dict__ else {}
        streaming, aggregate = defined_in(cls, "streaming_aggregator"), defined_in(cls, "aggregate")
        cls.streams = streaming is not Aggregation and issubclass(streaming, aggregate)

    def preset_server_optimizer(self) -> Any:
        """The server optimizer this rule is a preset for (FedAdam: FedAvg with ``[server]
        optimizer = "adam"``); None: the run's ``[server]`` section decides."""
        return None

    def aggregator(self, params: torch.Tensor, buffers: torch.Tensor, tasks: list[ClientTask], state: dict,
                   context: RoundContext, layout: ModelLayout) -> Aggregator:  # fmt: skip
        """The round's aggregation, fed one update at a time (``tasks``: what was sent)."""
        if self.streams:
            streaming = self.streaming_aggregator(params, buffers, tasks, state, context, layout)
            if streaming is not None:
                return streaming
        return ListAggregator(
            lambda updates: self.aggregate(params, buffers, updates, state, context, layout)
        )

    def streaming_aggregator(self, params, buffers, tasks, state, context, layout) -> Aggregator | None:
        """A rule that sums updates as they arrive returns its aggregator here (memory: one
        update, not the cohort); None: it needs the list."""
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
        """The new global (params, buffers) from the round's updates, sorted by client."""
        raise NotImplementedError


class Reporting(Part):
    """What a rule tells the user: documents, metrics columns, warnings, caveats."""

    hooks = ("reports", "round_metrics", "warnings", "caveats")

    def reports(self, state: dict) -> dict[str, dict]:
        """Documents to write into the run directory as ``<name>.json`` (e.g. a plan)."""
        return {}

    def round_metrics(self, state: dict) -> dict[str, float]:
        """Numbers of the round just aggregated that become columns of its metrics row."""
        return {}

    def warnings(self, state: dict) -> list[str]:
        """Things the user must be told when the run starts (e.g. a planner fallback)."""
        return []

    def caveats(self) -> list[str]:
        """Settings under which this rule is provably another, simpler one: one line each,
        warned before the run and kept in its summary."""
        return []


class EventScheduler(ServerPart):
    """Who starts when, with how many local steps, and which buffered arrivals a server step
    applies (event driver: no rounds)."""

    hooks = (*ServerPart.hooks, "lr_at", "concurrency", "buffer_size", "choose", "start_task", "plan_starts",
             "arrive", "take", "due")  # fmt: skip

    def lr_at(self, version: int) -> float:
        """The clients' learning rate on model version ``version``."""
        return train_learning_rate(self.train, version)

    def concurrency(self, num_clients: int) -> int:
        """How many clients train at once."""
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
        """The task of ``client``'s ``start``-th start on model version ``version``: the
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
        """The local steps of each of ``clients`` starting at ``now`` (the part may record
        its starts in ``state``). Default: the configured steps."""
        return [self.train.local_steps] * len(clients)

    def arrive(self, state: dict, client: int, now: float) -> bool:
        """``client``'s update arrived and joined the buffer: True, it may start again at
        once; False, it waits until a server step applies its update (FedCompass)."""
        return True

    def take(self, state: dict, buffered: list[tuple[int, int]], now: float) -> list[int]:
        """The positions of the buffered arrivals ((client, staleness), arrival order) a
        server step applies now; none: no step yet. Default: all, once the buffer is full."""
        return list(range(len(buffered))) if len(buffered) >= self.buffer_size() else []

    def due(self, state: dict) -> float | None:
        """A simulated time at which :meth:`take` is asked again though nothing arrives."""
        return None


class EventAggregation(ServerPart):
    """One server step of the event driver: :meth:`apply_buffer` from each update and its
    staleness, or :meth:`apply_models` for a rule that mixes models (``keeps_sent_models``,
    derived: the driver then keeps one copy of each model version in flight)."""

    hooks = (*ServerPart.hooks, "apply_buffer", "apply_models", "preset_server_optimizer")
    keeps_sent_models: ClassVar[bool] = False
    streams: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.keeps_sent_models = defined_in(cls, "apply_models") is not EventAggregation

    def preset_server_optimizer(self) -> Any:
        """Event rules are presets of no server optimizer."""
        return None

    def apply_buffer(self, params, buffers, entries, state: dict, version: int):
        """One server step from ``entries`` = [(update, staleness), ...] in arrival order;
        returns the new (params, buffers)."""
        raise NotImplementedError

    def apply_models(self, params, buffers, arrivals, state: dict, version: int):
        """One server step from ``arrivals`` = [(update, staleness, sent_params,
        sent_buffers), ...]; returns the new (params, buffers)."""
        raise NotImplementedError


# slot -> the part base class a rule's part in it derives from
PART_BASES: dict[str, type[Part]] = {
    "planner": Planner,
    "scheduler": EventScheduler,
    "client": ClientPart,
    "aggregation": Aggregation,
    "reporting": Reporting,
}
