"""A rule (:class:`Algorithm`) is a name, its options, a few declarations and its parts.

The parts (:mod:`fedhet.algorithms.parts`) each hold a handful of hooks: a ``Planner``
(round driver) or an ``EventScheduler`` (event driver), a ``ClientPart``, an
``Aggregation`` (or ``EventAggregation``) and a ``Reporting``. A rule names the part
classes it uses; the defaults are shared, so FedProx is FedAvg with another client part and
FedAdam is FedAvg with a preset server step::

    @register
    class FedProx(FedAvg):
        name = "fedprox"
        Options = FedProxOptions
        Client = ProximalClient

A rule class that defines a part's hook itself (the single-class style of earlier versions:
``def aggregate(self, ...)`` on the rule) has it moved into a new part derived from the
parent's, so such plug-ins keep running; ``super()`` inside the hook reaches the parent's part.

Round numbers count from 0 in this API (``plan(round_index, ...)``, ``RoundPlan.round``,
``lr_at``) and from 1 in everything a user reads (messages, ``metrics.csv``, ``--resume``).

Algorithms depend only on the messages, the model layout and the system model's marginals:
they never import an engine, the local trainer or the data.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from fedhet import registry
from fedhet.algorithms.mechanisms import check_mechanisms
from fedhet.algorithms.parts import (
    CLIENT_CAPABILITIES,
    PART_BASES,
    Aggregation,
    ClientPart,
    EventAggregation,
    EventScheduler,
    Part,
    Planner,
    Reporting,
    defined_in,
)
from fedhet.algorithms.types import (  # noqa: F401  (re-exported: the rule's vocabulary)
    PARTIAL_WORK,
    SERVER_LR_RANGE,
    AlgorithmContext,
    ClientAssignment,
    OwnState,
    RoundContext,
    RoundPlan,
    RunSetting,
)
from fedhet.registry import NoOptions
from fedhet.system.base import SystemModel

# a part's slot -> the attribute naming its class on a rule (as ``Options`` names the options)
SLOT_CLASSES = {"planner": "Planner", "scheduler": "Scheduler", "client": "Client",
                "aggregation": "Aggregation", "reporting": "Reporting"}  # fmt: skip
SERVER_SLOTS = ("planner", "scheduler", "aggregation")
PART_KEYS = "_part_keys"  # in a saved server state: slot -> the keys its part saved
# capability flags a part derives or declares, mirrored on its rule's class (read-only)
PART_FLAGS = {
    **{flag: "client" for flag in CLIENT_CAPABILITIES},
    "local_loss_per_client": "client",
    "scales_sub_models": "client",
    "streams": "aggregation",
    "keeps_sent_models": "aggregation",
}


class Algorithm:
    """Base of every rule: its ``name``, ``Options``, declarations and part classes.

    **Parts** (class attributes naming classes, as ``Options`` does): ``Planner``
    (round driver) or ``Scheduler`` (event driver), ``Client``, ``Aggregation``,
    ``Reporting``. A built rule holds one instance of each as ``planner``, ``scheduler``,
    ``client``, ``aggregation`` and ``reporting``; the engine calls the parts, the trainer
    receives ``client``.

    **Declarations**: ``partial_work``, one of ``"none"`` (a client that would not finish
    gets no task), ``"layers"`` (it trains the layers it reaches, SALF's back-to-front cut)
    or ``"steps"`` (it sends the whole local steps it finished); ``driver`` (``"round"`` or
    ``"event"``); ``uses_deadline``; ``hyperparameters`` and ``mechanisms``. The parts'
    capability flags (``corrects_gradients``, ``streams``, ...) are mirrored on the class.

    The server parts share one server-state dict (:meth:`init_state`), each keeping and
    checkpointing its own keys (:meth:`state_dict`)."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    driver: ClassVar[str] = "round"  # "round" (Planner) or "event" (Scheduler: AsyncAlgorithm)
    uses_deadline: ClassVar[bool] = True
    partial_work: ClassVar[str] = "none"
    # Static BatchNorm (HeteroFL): None = the global model's BatchNorm statistics are the
    # aggregated ones; an integer = before each evaluation, recompute them on the full model
    # from that many of the clients' training examples (0 = all of them).
    static_batchnorm_examples: ClassVar[int | None] = None
    # Whether the rule works on weights stored channels-last (run.memory_format); rules that
    # index parameter elements by their contiguous position (width masks) say False.
    supports_channels_last: ClassVar[bool] = True
    # The options worth tuning, with default ranges (``fedhet bench`` tunes them beside the
    # learning rate): option name -> { low, high[, log][, int] } or { choices = [...] }.
    hyperparameters: ClassVar[dict[str, dict]] = {}
    # What the rule does beyond averaging, each with the settings under which it acts and the
    # options only it reads (:mod:`fedhet.algorithms.mechanisms`).
    mechanisms: ClassVar[tuple] = ()

    Planner: ClassVar[type | None] = Planner
    Scheduler: ClassVar[type | None] = None
    Client: ClassVar[type] = ClientPart
    Aggregation: ClassVar[type] = Aggregation
    Reporting: ClassVar[type] = Reporting

    def __init__(self, options: Any, train: Any):
        self.options = options
        self.train = train
        self._owners: dict[str, str] = {}  # server-state key -> the slot of the part keeping it
        for slot, attribute in SLOT_CLASSES.items():
            part_class = getattr(type(self), attribute)
            setattr(self, slot, part_class(self) if part_class is not None else None)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Move the part hooks the class defines itself into parts derived from its
        parent's, then mirror its parts' capability flags on the class."""
        super().__init_subclass__(**kwargs)
        lift_part_hooks(cls)
        mirror_part_flags(cls)

    def __getattr__(self, name: str) -> Any:
        """A hook of one of the parts, for callers that hold the rule (``rule.aggregate``)."""
        if name.startswith("_") or "_owners" not in self.__dict__:
            raise AttributeError(name)
        for slot in SLOT_CLASSES:
            part = self.__dict__.get(slot)
            if part is not None and hasattr(type(part), name):
                return getattr(part, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def build(cls, options: Any, ctx: Any) -> Algorithm:
        """The rule for a run: its options and the run's ``[train]`` section (``ctx.train``)."""
        return cls(options, ctx.train)

    def server_parts(self) -> dict[str, Any]:
        """The parts that keep server state, by slot."""
        return {slot: part for slot in SERVER_SLOTS if (part := getattr(self, slot)) is not None}

    def init_state(self, setting: RunSetting) -> dict:
        """The server state: every server part's keys (a key two parts keep is refused)."""
        from fedhet.errors import ConfigError

        state: dict = {}
        self._owners = {}
        for slot, part in self.server_parts().items():
            for key, value in part.init_state(setting).items():
                if key in self._owners:
                    raise ConfigError(
                        f"algorithm {self.name!r}: server state key {key!r} is kept by both its "
                        f"{self._owners[key]} and its {slot}"
                    )
                state[key], self._owners[key] = value, slot
        return state

    def _slot_keeping(self, key: str) -> str:
        """The part that keeps ``key``: the one that set it up, else (a key written during the
        rounds) the aggregation."""
        return self._owners.get(key) or ("aggregation" if self.aggregation is not None else SERVER_SLOTS[0])

    def state_dict(self, state: dict, work_dir: Path | None = None) -> dict:
        """The server state as the checkpoint keeps it: each part's keys through its own
        ``state_dict``, side by side, with which part saved which (``PART_KEYS``)."""
        own: dict[str, dict] = {slot: {} for slot in self.server_parts()}
        for key, value in state.items():
            own[self._slot_keeping(key)][key] = value
        saved: dict = {}
        keys: dict[str, list[str]] = {}
        for slot, part in self.server_parts().items():
            out = part.state_dict(own[slot], work_dir)
            saved.update(out)
            keys[slot] = list(out)
        return {**saved, PART_KEYS: keys}

    def load_state_dict(self, saved: dict, work_dir: Path | None = None) -> dict:
        """The server state back from :meth:`state_dict`'s output."""
        state: dict = {}
        self._owners = {}
        keys = saved.get(PART_KEYS, {})
        for slot, part in self.server_parts().items():
            mine = {key: saved[key] for key in keys.get(slot, ())}
            for key, value in part.load_state_dict(mine, work_dir).items():
                state[key], self._owners[key] = value, slot
        return state


def mirror_part_flags(cls: type) -> None:
    """The capability flags of ``cls``'s parts, mirrored on the rule class (read them from
    the parts; these are for a reader holding the class)."""
    for flag, slot in PART_FLAGS.items():
        setattr(cls, flag, bool(getattr(getattr(cls, SLOT_CLASSES[slot]), flag, False)))


mirror_part_flags(Algorithm)


def hook_slot(name: str, event: bool) -> str | None:
    """The slot of the part whose hook (or capability flag) ``name`` is, for a rule of the
    event driver or not; None: not a part's."""
    slots = ("scheduler" if event else "planner", "client", "aggregation", "reporting")
    for slot in slots:
        base = EventAggregation if (slot == "aggregation" and event) else PART_BASES[slot]
        if name in base.hooks and name not in ("init_state", "state_dict", "load_state_dict"):
            return slot
    if name in ("init_state", "state_dict", "load_state_dict"):
        return "aggregation"
    return PART_FLAGS.get(name)


def _with_class_cell(function: Any, cell: Any) -> Any:
    """``function`` with its ``__class__`` cell (zero-argument ``super()``) replaced by
    ``cell``, so that a hook moved into a part reaches the parent's part."""
    if not isinstance(function, types.FunctionType) or "__class__" not in function.__code__.co_freevars:
        return function
    closure = tuple(
        cell if name == "__class__" else old
        for name, old in zip(function.__code__.co_freevars, function.__closure__ or (), strict=True)
    )
    moved = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                               function.__defaults__, closure)  # fmt: skip
    moved.__kwdefaults__, moved.__qualname__ = function.__kwdefaults__, function.__qualname__
    moved.__doc__, moved.__dict__ = function.__doc__, dict(function.__dict__)
    return moved


def lift_part_hooks(cls: type) -> None:
    """The part hooks ``cls`` defines itself (the single-class style) move into new part
    classes derived from the parts it inherits; the hooks leave the rule class."""
    event = cls.__dict__.get("driver", getattr(cls, "driver", "round")) == "event"
    moved: dict[str, dict[str, Any]] = {}
    for name, value in list(cls.__dict__.items()):
        slot = hook_slot(name, event)
        if slot is not None:
            moved.setdefault(slot, {})[name] = value
    for slot, body in moved.items():
        attribute = SLOT_CLASSES[slot]
        parent = getattr(cls, attribute, None) or (
            EventAggregation if event and slot == "aggregation" else PART_BASES[slot]
        )
        cell = types.CellType()
        namespace = {name: _with_class_cell(value, cell) for name, value in body.items()}
        namespace.update(
            __module__=cls.__module__,
            __qualname__=cls.__qualname__,
            moved_from=cls,
        )  # named as the rule class the author wrote
        metaclass: Any = type(parent)
        part_class = metaclass(f"{cls.__name__}{attribute}", (parent,), namespace)
        cell.cell_contents = part_class
        for name in body:
            delattr(cls, name)
        setattr(cls, attribute, part_class)


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


def overrides(cls: type, hook: str, base: type | None = None) -> bool:
    """Whether the part class ``cls`` defines ``hook`` below ``base`` (default: the part base
    of its kind): the hooks a part defines are its capabilities."""
    kinds: tuple[type, ...] = (EventAggregation, *PART_BASES.values())
    kind = base or next(b for b in kinds if issubclass(cls, b))
    return defined_in(cls, hook) is not defined_in(kind, hook)


def part_classes(cls: type) -> dict[str, type]:
    """The part classes of the rule class ``cls``, by slot (slots it leaves empty omitted)."""
    return {slot: part for slot, attribute in SLOT_CLASSES.items() if (part := getattr(cls, attribute, None))}


def check_algorithm_class(cls: type, name: str) -> None:
    """Refuse, in one line naming the class, a rule whose declarations do not match its
    parts: not an :class:`Algorithm`, an unknown ``partial_work`` or ``driver``, a part that
    is not of its kind, a capability flag set against the hook it stands for (a
    ``gradient_correction`` that would never be called), an event-driven rule without a
    scheduler or a server step. Called for built-ins at registration and for plug-ins when
    they are resolved."""
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
    _check_parts(cls, label)
    _check_hyperparameters(cls, label)
    check_mechanisms(cls, set(registry.option_fields(cls)), label)


def _check_parts(cls: Any, label: str) -> None:
    """Each part is of its kind, its hooks take the engine's arguments and its declared
    flags match its hooks."""
    from fedhet.errors import ConfigError

    event = cls.driver == "event"
    kinds = {**PART_BASES, "aggregation": EventAggregation if event else Aggregation}
    needed = ("scheduler" if event else "planner", "client", "aggregation", "reporting")
    parts: dict[str, Any] = part_classes(cls)
    for slot in needed:
        part = parts.get(slot)
        if not (isinstance(part, type) and issubclass(part, kinds[slot])):
            raise ConfigError(
                f"{label}: {SLOT_CLASSES[slot]} = {part!r} is not a "
                f"fedhet.algorithms.parts.{kinds[slot].__name__}"
            )
        _check_hook_signatures(part, kinds[slot], label)
    aggregation, client = parts["aggregation"], parts["client"]
    if event and not (overrides(aggregation, "apply_buffer") or overrides(aggregation, "apply_models")):
        raise ConfigError(f"{label}: an event-driven rule defines apply_buffer or apply_models")
    if client.local_loss_per_client is not False and not (
        client.local_loss_per_client is True and overrides(client, "local_loss")
    ):
        raise ConfigError(f"{label}: local_loss_per_client = True is for a rule that defines local_loss")
    hooks = {**CLIENT_CAPABILITIES, "streams": "streaming_aggregator"}
    for part in (client, aggregation):
        for flag, declared in _declared(part).items():
            if bool(declared) != getattr(part, flag):
                what = "defines" if getattr(part, flag) else "does not define"
                raise ConfigError(
                    f"{label}: {flag} = {declared!r} but the class {what} {hooks[flag]} for the rule in "
                    "effect (remove the flag: it follows from the hooks)"
                )


def _declared(part: type) -> dict[str, Any]:
    """The capability flags a part class or its parents set themselves, nearest first."""
    found: dict[str, Any] = {}
    for c in reversed(part.__mro__):
        found.update(c.__dict__.get("_declared_capabilities", {}))
    return found


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


def _positional(function: Any) -> tuple[int, int, bool]:
    """(required, accepted, has *args) positional parameters of ``function`` (self counted)."""
    import inspect

    params = [
        p for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]  # fmt: skip
    star = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(function).parameters.values())
    return sum(1 for p in params if p.default is p.empty), len(params), star


def _check_hook_signatures(part: type, kind: type[Part], label: str) -> None:
    """Every hook the part defines below its kind accepts the arguments the engine passes
    (the kind's positional parameters): a mismatch is one line naming the hook, not a
    TypeError in a later round."""
    import inspect

    from fedhet.errors import ConfigError

    for hook in kind.hooks:
        mine, base = inspect.getattr_static(part, hook, None), getattr(kind, hook)
        if defined_in(part, hook) is defined_in(kind, hook) or not callable(mine):
            continue
        if isinstance(mine, staticmethod | classmethod):
            continue
        _, given, _ = _positional(base)
        required, accepted, star = _positional(mine)
        if required > given or (accepted < given and not star):
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
    """Base of event-driven rules (FedBuff, FedAsync, FedCompass): no rounds. Its
    ``Scheduler`` (:class:`~fedhet.algorithms.parts.EventScheduler`) says which idle clients
    start, with what task and steps, and which buffered arrivals a server step applies; its
    ``Aggregation`` (:class:`~fedhet.algorithms.parts.EventAggregation`) is that step."""

    driver: ClassVar[str] = "event"
    uses_deadline = False
    Planner: ClassVar[type | None] = None
    Scheduler: ClassVar[type | None] = EventScheduler
    Aggregation: ClassVar[type] = EventAggregation
