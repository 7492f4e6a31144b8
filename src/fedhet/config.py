"""Typed, validated run configuration: TOML in, one clear error line out.

Sections: ``[run] [data] [model] [train] [system] [algorithm]`` and, for several
algorithms on the same setting, ``[compare] algorithms = [...]``. ``[algorithm]`` holds
``name`` plus that algorithm's options (validated by the algorithm's ``Options``).
Command-line overrides use ``section.key=value`` with TOML values (``0.5``, ``true``,
``"x"``; bare words are read as strings).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fedhet.checks import (  # noqa: F401  (finite, number_list: used by callers of this module)
    at_least,
    at_most,
    coerce_value,
    finite,
    in_range,
    number_list,
    one_of,
    option_types,
    resumable,
    typed_options,
)
from fedhet.errors import ConfigError

log = logging.getLogger("fedhet")

MAX_ROUNDS = 10_000_000
MAX_THREADS = 1024
CHECKPOINT_EVERY = 2.0  # run.checkpoint_every: seconds of wall time between checkpoints
MAX_CLIENTS = 1_000_000
MAX_HIDDEN = 65_536
MAX_NAME = 100
MAX_CONFIG_BYTES = 10_000_000
NON_FINITE_POLICIES = ("stop", "skip-client")


def check_name(key: str, name: str) -> None:
    """A run or experiment name becomes a folder name: printable, at most 100 characters,
    no path separators, not hidden."""
    if (
        not name
        or len(name) > MAX_NAME
        or not name.isprintable()
        or any(c in name for c in "/\\:")
        or name.startswith(".")
        or name != name.strip()
    ):
        raise ConfigError(
            f"{key} = {name[:40]!r}{'...' if len(name) > 40 else ''}: must be a plain folder name "
            f"(1-{MAX_NAME} printable characters, no / \\ : and not starting with a dot)"
        )


@dataclass
class PluginSection:
    """A section made of its own keys and the options of the plug-ins it names.

    Subclasses are dataclasses of the section's own keys; ``SLOTS`` maps the keys that name a
    plug-in to the plug-in kind (``[system] model = "per-step"`` -> kind ``system_model``).
    Every other key of the table belongs to one of the named plug-ins' ``Options`` and is
    validated there, once; ``section.key`` reads it back like a key of the section."""

    SECTION: ClassVar[str] = ""
    SLOTS: ClassVar[dict[str, str]] = {}
    MOVED: ClassVar[dict[str, str]] = {}  # keys that moved elsewhere: the one line that says where

    @classmethod
    def legacy(cls, values: dict) -> dict:
        """The section's table with old spellings read as today's (none by default)."""
        return values

    @property
    def plugins(self) -> dict:
        """slot -> (registry entry, typed options); the defaults when never parsed."""
        found = self.__dict__.get("_plugins")
        if found is None:
            found = _plugin_options(self, {})
            self.__dict__["_plugins"] = found
        return found

    def entry(self, slot: str):
        """The registry entry of the plug-in named by ``slot``."""
        return self.plugins[slot][0]

    def options(self, slot: str):
        """The typed options of the plug-in named by ``slot``."""
        return self.plugins[slot][1]

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        for _, options in self.plugins.values():
            if name in {f.name for f in dataclasses.fields(options)}:
                return getattr(options, name)
        raise AttributeError(f"{self.SECTION}.{name}: not a key of this section or of its plug-ins")

    def get(self, key: str, default: Any = None) -> Any:
        """A key of the section or of its plug-ins' options, or as given for another choice
        (``default`` when none of these)."""
        try:
            return getattr(self, key)
        except AttributeError:
            unused = self.__dict__.get("_unused", {})
            return unused[key] if key in unused and key != "__options__" else default

    def given_options(self, options_class: type) -> Any | None:
        """The typed options of a plug-in the section does not name (another choice's keys,
        kept), of ``options_class``; None when none of its keys were given."""
        found = self.__dict__.get("_unused", {}).get("__options__", [])
        return next((options for options in found if isinstance(options, options_class)), None)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for _, options in self.plugins.values():
            out.update(dataclasses.asdict(options))
        for key, value in self.__dict__.get("_unused", {}).items():
            if key != "__options__":
                out.setdefault(key, value)
        return out


def _plugin_options(section: PluginSection, values: dict) -> dict:
    from fedhet.registry import KIND_LABELS, resolve

    out = {}
    for slot, kind in section.SLOTS.items():
        entry = resolve(kind, getattr(section, slot), f"{section.SECTION}.{slot}")
        label = f"{KIND_LABELS[kind]} {entry.name}"
        out[slot] = (entry, typed_options(entry.cls.Options, values.get(slot, {}), section.SECTION, label))
    return out


def _owner_elsewhere(section: type[PluginSection], key: str, value: Any) -> tuple[str, str] | None:
    """(slot, plug-in name) of a built-in plug-in of one of ``section``'s slots with option
    ``key``, for the message that says the key belongs to another choice: the first whose
    options accept ``value`` (mlp's ``hidden = [32, 16]`` is mlp's, not char-mlp's integer),
    else the first (whose check then says what is wrong)."""
    from fedhet.registry import builtins, option_fields

    first = None
    for slot, kind in section.SLOTS.items():
        accepting = _owners_accepting(kind, key, value, section.SECTION)
        if accepting:
            return slot, accepting[0]
        owners = [name for name, entry in sorted(builtins(kind).items()) if key in option_fields(entry.cls)]
        first = first or ((slot, owners[0]) if owners else None)
    return first


def parse_plugin_section(cls: type[PluginSection], values: Any) -> PluginSection:
    """Build section ``cls`` from its TOML table: its own keys typed and the rest handed to
    the options of the plug-ins its slots name."""
    from fedhet.registry import option_fields

    name = cls.SECTION
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}] must be a table")
    values = cls.legacy(values)
    own = {f.name: f for f in dataclasses.fields(cls)}
    types_ = option_types(cls)
    kwargs = {k: coerce_value(f"{name}.{k}", v, types_[k]) for k, v in values.items() if k in own}
    section = cls(**kwargs)
    from fedhet.registry import resolve

    entries = {
        slot: resolve(kind, getattr(section, slot), f"{name}.{slot}") for slot, kind in cls.SLOTS.items()
    }
    fields_of = {slot: option_fields(entry.cls) for slot, entry in entries.items()}
    per_slot: dict[str, dict] = {slot: {} for slot in entries}
    unused: dict[tuple[str, str], dict] = {}
    for key, value in values.items():
        if key in own:
            continue
        slot = next((s for s in entries if key in fields_of[s]), None)
        if slot is not None:
            per_slot[slot][key] = value
            continue
        owner = _owner_elsewhere(cls, key, value)
        if owner is not None:  # another choice's option: checked there, kept, not used
            unused.setdefault(owner, {})[key] = value
            continue
        if key in cls.MOVED:
            raise ConfigError(f"{name}.{key}: {cls.MOVED[key]}")
        known = [*own, *(k for s in entries for k in fields_of[s])]
        raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(known)})")
    section.__dict__["_plugins"] = _plugin_options(section, per_slot)
    section.__dict__["_unused"] = _unused_options(cls, entries, unused)
    return section


_WARNED: set[tuple] = set()


def _unused_options(cls: type[PluginSection], entries: dict, unused: dict) -> dict:
    """Keys of plug-ins other than the chosen ones (a grid's base for several system models,
    say): each checked by its owner's ``Options`` and kept for the resolved configuration,
    with a warning that the chosen plug-in does not use it."""
    from fedhet.registry import KIND_LABELS, builtins

    kept = {}
    for (slot, owner), values in sorted(unused.items()):
        kind = cls.SLOTS[slot]
        options = typed_options(
            builtins(kind)[owner].cls.Options, values, cls.SECTION, f"{KIND_LABELS[kind]} {owner}"
        )
        kept.update(values)
        kept.setdefault("__options__", []).append(options)
        chosen = entries[slot].name
        if owner in getattr(entries[slot].cls, "delegates_to", ()):
            continue  # the chosen plug-in reads them where it picks their owner (run.pool = "auto")
        for key in values:
            if (cls.SECTION, key, chosen) not in _WARNED:
                _WARNED.add((cls.SECTION, key, chosen))
                accepting = _owners_accepting(kind, key, values[key], cls.SECTION) or [owner]
                owners = [repr(name) for name in accepting]
                label = KIND_LABELS[kind] + ("s " + ", ".join(owners) if len(owners) > 1 else f" {owners[0]}")
                log.warning(
                    "%s.%s is an option of %s; %s.%s = %r does not use it",
                    cls.SECTION, key, label, cls.SECTION, slot, chosen,
                )  # fmt: skip
    return kept


def _owners_accepting(kind: str, key: str, value: Any, section: str) -> list[str]:
    """The built-in plug-ins of ``kind`` with option ``key`` whose options accept ``value``
    (mlp's ``hidden = [32, 16]`` is mlp's and mlp-exits', not char-mlp's)."""
    from fedhet.registry import KIND_LABELS, builtins, option_fields

    accepting = []
    for name, entry in sorted(builtins(kind).items()):
        if key not in option_fields(entry.cls):
            continue
        try:
            typed_options(entry.cls.Options, {key: value}, section, f"{KIND_LABELS[kind]} {name}")
        except ConfigError:
            continue
        accepting.append(name)
    return accepting


def _listed_plugins(section: Any, kind: str, key: str, items: list) -> list:
    """A list of plug-in tables parsed once and kept on ``section``."""
    cache = section.__dict__.setdefault("_listed", {})
    if key not in cache:
        cache[key] = [_listed_plugin(kind, f"{key}[{i}]", item) for i, item in enumerate(items)]
    return cache[key]


def _listed_plugin(kind: str, key: str, item: Any):
    """A plug-in given as a table in a list: ``{ name = "...", ...options }``."""
    from fedhet.registry import KIND_LABELS, resolve

    if not isinstance(item, dict) or "name" not in item:
        raise ConfigError(f'{key} = {item!r}: expected a table with a name, e.g. {{ name = "..." }}')
    values = dict(item)
    entry = resolve(kind, values.pop("name"), f"{key}.name")
    return entry, typed_options(entry.cls.Options, values, key, f"{KIND_LABELS[kind]} {entry.name}")


@dataclass
class RunConfig(PluginSection):
    """``[run]``: the run's name, seed, length, evaluation, threads and processes, and the
    engine (a plug-in: ``embedded``, ``flower``, ...) with its options in the same table
    (``round_timeout`` and ``flower_cpus_per_client`` are the Flower engine's)."""

    SECTION: ClassVar[str] = "run"
    SLOTS: ClassVar[dict[str, str]] = {"engine": "engine", "pool": "pool"}
    MOVED: ClassVar[dict[str, str]] = {
        "mlflow_uri": 'now the MLflow tracker\'s own option: track = [{ name = "mlflow", uri = "..." }]'
    }

    name: str = "run"  # the run folder's name (runs/<name> unless --out)
    seed: int = 0  # fixes the data split, the model's start, every random stream
    rounds: int = resumable(100)  # the number of rounds R (a time budget may stop it sooner)
    time_budget: float = 0.0  # simulated seconds; 0 = no budget (stop after `rounds`)
    energy_budget: float = 0.0  # joules spent by all clients together; 0 = no budget
    # epsilon of clip-noise's privacy accounting (fedhet.engine.privacy); 0 = no budget; a
    # resume may raise it, and a run it stopped goes on
    epsilon_budget: float = resumable(0.0)
    eval_every: int = resumable(1)  # evaluate the global model every this many rounds (and the last)
    # or, > 0: evaluate at the first round (server step) ending at or after each multiple of
    # this many simulated seconds (and the last): every rule on one time grid, whatever its
    # round lengths (an event-driven rule's server steps are short)
    eval_interval: float = resumable(0.0)
    # torch threads: "auto" (work size, free cores), 0 = torch default, or a count
    threads: Any = resumable("auto")
    memory_format: str = "contiguous"  # conv weights, images: contiguous | channels_last (faster)
    # where tensors live: auto (a GPU if torch sees one) | cpu | cuda | cuda:N
    device: str = resumable("auto")
    client_eval: bool = False  # also evaluate on each client's held-out part of its data
    client_eval_fraction: float = 0.2  # share of each client's data held out for it
    targets: list = field(default_factory=list)  # accuracies whose first round and time are recorded
    # a NaN/inf loss or update: stop the run, or skip that client's update
    on_non_finite: str = resumable("stop")
    # an exception in client code: stop the run (a bug), or "skip" the client
    on_client_error: str = resumable("stop")
    # stop after this many rounds in a row without a participant (0 = never,
    # and a first round nobody can deliver in is run instead of refused: deadline sweeps)
    max_empty_rounds: int = resumable(10)
    # seconds of wall time between checkpoints (0 = after every round); a run always saves
    # when it stops, and a killed run resumes from its last checkpoint to the same metrics
    checkpoint_every: float = resumable(CHECKPOINT_EVERY)
    # embedded (one process) | flower (Flower's simulation runtime) | a plug-in
    engine: str = resumable("embedded")
    # where client tasks run: auto | in-process | batched | processes | a plug-in (embedded engine)
    pool: str = resumable("auto")
    callbacks: list = resumable(default_factory=list)  # run callback plug-ins: [{ name = "...", ... }]
    # trackers: "mlflow", "tensorboard", or { name = ..., options }
    track: list = resumable(default_factory=list)

    @property
    def workers(self) -> Any:
        """The worker processes of the run's pool: the process pool's ``run.workers``
        (a count or ``"auto"``); 1 for every other pool."""
        return getattr(self.options("pool"), "workers", 1)

    @property
    def torch_device(self) -> Any:
        """``run.device`` resolved, the one place it is (:func:`fedhet.device.resolve_device`:
        ``"auto"`` is a GPU when torch sees one and the clients run in this process)."""
        from fedhet.device import resolve_device

        return resolve_device(self.device, self.workers)

    @classmethod
    def legacy(cls, values: dict) -> dict:
        """``run.workers`` without ``run.pool`` (the process pool's option, once a key of
        ``[run]`` of its own) is still read: more than one worker means the process pool,
        with a one-line note; one worker is every other pool's meaning anyway (dropped)."""
        from fedhet.registry import resolve

        workers, pool = values.get("workers"), values.get("pool", "auto")
        if workers is None or pool == "processes":
            return values
        if type(workers) is int and workers == 1:  # one worker: any pool's own meaning
            return {k: v for k, v in values.items() if k != "workers"}
        if pool != "auto":  # another pool named: its unused option is reported, not read
            return values
        engine = resolve("engine", values.get("engine", "embedded"), "run.engine")
        if workers != 1 and not engine.cls.runs_workers:
            raise ConfigError(
                f"run.workers = {workers!r}: the {engine.name} engine places clients itself; "
                "run.workers applies to the embedded engine (set run.workers = 1)"
            )
        if ("run.workers", repr(workers)) not in _WARNED:
            _WARNED.add(("run.workers", repr(workers)))
            log.warning('run.workers = %r is the process pool\'s option: read as run.pool = "processes" '
                        '(write that to say so)', workers)  # fmt: skip
        return {**values, "pool": "processes"}

    def validate(self) -> None:
        at_least("run.seed", self.seed, 0)
        at_least("run.rounds", self.rounds, 1)
        at_most("run.rounds", self.rounds, MAX_ROUNDS)
        self._check_evaluation()
        if self.threads != "auto":
            if isinstance(self.threads, bool) or not isinstance(self.threads, int):
                raise ConfigError(f'run.threads = {self.threads!r}: expected "auto" or an integer')
            at_least("run.threads", self.threads, 0)
            at_most("run.threads", self.threads, MAX_THREADS)
        at_least("run.max_empty_rounds", self.max_empty_rounds, 0)
        in_range("run.checkpoint_every", finite("run.checkpoint_every", self.checkpoint_every), 0.0, 86400.0)
        if self.time_budget < 0:
            raise ConfigError(f"run.time_budget = {self.time_budget}: must be >= 0 (0 = none)")
        in_range("run.energy_budget", self.energy_budget, 0.0, 1e30)
        in_range("run.epsilon_budget", finite("run.epsilon_budget", self.epsilon_budget), 0.0, 1e6)
        check_name("run.name", self.name)
        one_of("run.on_non_finite", self.on_non_finite, NON_FINITE_POLICIES)
        one_of("run.on_client_error", self.on_client_error, ("stop", "skip"))
        self._check_track()
        self.callback_plugins  # noqa: B018  (parse the callbacks now: their errors are configuration errors
        one_of("run.memory_format", self.memory_format, ("contiguous", "channels_last"))
        from fedhet.device import check_device

        check_device(self.device)
        workers = self.__dict__.get("_unused", {}).get("workers", self.workers)  # given to another pool too
        if self.device.startswith("cuda") and workers != 1:
            raise ConfigError(
                f"run.device = {self.device!r} with run.workers = {workers!r}: worker processes would "
                "each hold the model and the data on one GPU; use run.workers = 1 (run.pool = "
                '"batched" trains many clients at once there) or run.device = "cpu"'
            )
        in_range(
            "run.client_eval_fraction", self.client_eval_fraction, 0.0, 1.0, low_open=True, high_open=True
        )
        for target in self.targets:  # values of the task's score: accuracies, RMSEs (checked with the task)
            if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target < math.inf:
                raise ConfigError(f"run.targets: {target!r} is not a value of a score (> 0)")

    def _check_evaluation(self) -> None:
        """``run.eval_every`` (rounds) or ``run.eval_interval`` (simulated seconds): one
        cadence."""
        at_least("run.eval_every", self.eval_every, 1)
        in_range("run.eval_interval", finite("run.eval_interval", self.eval_interval), 0.0, 1e12)
        if self.eval_interval > 0 and self.eval_every != 1:
            raise ConfigError(
                f"run.eval_interval = {self.eval_interval:g} with run.eval_every = {self.eval_every}: "
                "evaluation follows one cadence; leave run.eval_every out (or 1) with a simulated-time "
                "interval, or set run.eval_interval = 0"
            )

    def _check_track(self) -> None:
        """``run.track``: tracker callbacks by name (``"mlflow"``) or as a table with their
        options (``{ name = "mlflow", uri = "sqlite:///runs.db" }``); each once."""
        import importlib.util

        if not isinstance(self.track, list):
            raise ConfigError(f'run.track = {self.track!r}: expected a list, e.g. ["mlflow", "tensorboard"]')
        from fedhet.registry import builtins, resolve

        names = [item.get("name") if isinstance(item, dict) else item for item in self.track]
        for name in names:
            try:  # a tracker is any callback plug-in: a built-in's name, an entry point, a module path
                cls = resolve("callback", str(name), "run.track").cls
            except ConfigError:
                trackers = builtins("callback").items()
                known = ", ".join(n for n, e in trackers if getattr(e.cls, "package", None))
                raise ConfigError(f"run.track: {name!r} is not a tracker (known: {known})") from None
            package = getattr(cls, "package", None)  # declared by the tracker: what it imports
            if package and importlib.util.find_spec(package) is None:
                raise ConfigError(f"run.track: {name!r} needs its package: pip install 'fedhet[track]'")
        if len(set(names)) < len(names):
            raise ConfigError(f"run.track = {self.track!r}: a tracker listed twice")
        self.tracker_plugins  # noqa: B018  (their options' errors are configuration errors)

    @property
    def tracker_plugins(self) -> list:
        """The trackers of ``run.track``: (registry entry, typed options) in order."""
        tables = [item if isinstance(item, dict) else {"name": item} for item in self.track]
        return _listed_plugins(self, "callback", "run.track", tables)

    @property
    def callback_plugins(self) -> list:
        """The configured run callbacks: (registry entry, typed options) in order."""
        return _listed_plugins(self, "callback", "run.callbacks", self.callbacks)


@dataclass
class DataConfig(PluginSection):
    """``[data]``: the dataset (a plug-in, with its own options: ``data_dir``, ``normalize``,
    ``label_mode``, ...) and how it is split over clients (``partition``, a plug-in with its
    own options: dirichlet's ``alpha``, shards' ``shards_per_client``)."""

    SECTION: ClassVar[str] = "data"
    SLOTS: ClassVar[dict[str, str]] = {"dataset": "dataset", "partition": "partitioner"}

    dataset: str = "digits"  # a dataset plug-in: digits, fmnist, mnist, cifar10, nsl-kdd, leaf, ...
    partition: str = "iid"  # how the training examples are split over clients (a plug-in)
    num_clients: int = 10  # the number of clients U (or N)
    fraction: float = 1.0  # keep this random fraction of train and test examples
    validation_fraction: float = 0.0  # hold out this share of the training examples; evaluate on it
    swap_fraction: float = 0.0  # label-swap: fraction of each label of a pair relabelled
    swap_pairs: list = field(default_factory=lambda: [[0, 1], [8, 9]])  # label-swap: the label pairs swapped
    swap_clients: str = "all"  # "all" or "second-half"

    def validate(self) -> None:
        one_of("data.swap_clients", self.swap_clients, ("all", "second-half"))
        at_least("data.num_clients", self.num_clients, 1)
        at_most("data.num_clients", self.num_clients, MAX_CLIENTS)
        in_range("data.fraction", self.fraction, 0.0, 1.0, low_open=True)
        in_range("data.validation_fraction", self.validation_fraction, 0.0, 1.0, high_open=True)
        in_range("data.swap_fraction", self.swap_fraction, 0.0, 1.0)
        if self.partition == "label-swap" and not self.swap_pairs:
            raise ConfigError("data.swap_pairs = []: label-swap needs at least one pair of labels")
        for pair in self.swap_pairs:
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)
                and pair[0] != pair[1]
            ):
                raise ConfigError(f"data.swap_pairs: {pair!r} is not a pair of two different labels >= 0")


@dataclass
class ModelConfig(PluginSection):
    """``[model]``: ``name`` (a model plug-in) and its options (``hidden`` for mlp)."""

    SECTION: ClassVar[str] = "model"
    SLOTS: ClassVar[dict[str, str]] = {"name": "model"}

    name: str = "mlp"


@dataclass
class TrainConfig(PluginSection):
    """``[train]``: learning rate and schedule, batch, local steps, the local optimizer (a
    plug-in: ``sgd`` with momentum / weight_decay / keep_momentum, ``adam``, ...) and the
    chain of update postprocessors, ``postprocess = [{ name = "clip-noise", ... }, ...]``
    (applied in order to each client's update before it is sent)."""

    SECTION: ClassVar[str] = "train"
    SLOTS: ClassVar[dict[str, str]] = {"optimizer": "local_optimizer"}

    lr: float = 0.05  # the client learning rate eta (its value in round 1)
    # constant | inverse (eta / (1 + t), ADEL-FL) | salf-theorem (2 / (rho_c (gamma + t)), SALF Thm. 1)
    # | step (eta times lr_decay at each of lr_milestones)
    lr_schedule: str = "constant"
    lr_rho_c: float = 1.0  # salf-theorem: rho_c
    lr_gamma: float = 1.0  # salf-theorem: the offset gamma
    lr_milestones: list = field(default_factory=list)  # step: rounds (from 1) where eta decays once more
    lr_decay: float = 0.5  # step: the factor applied at each milestone, in (0, 1]
    batch_size: int = 16  # examples per local step
    local_steps: int = 1  # local steps K asked of each client per round
    optimizer: str = "sgd"  # the local optimizer (a plug-in: sgd, adam, ...) with its options here
    # update postprocessors applied in order: [{ name = "clip-noise", ... }, ...]
    postprocess: list = field(default_factory=list)

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"train.lr = {self.lr}: must be > 0")
        from fedhet.schedules import SCHEDULES

        one_of("train.lr_schedule", self.lr_schedule, SCHEDULES)
        at_least("train.batch_size", self.batch_size, 1)
        at_least("train.local_steps", self.local_steps, 1)
        if self.lr_rho_c <= 0:
            raise ConfigError(f"train.lr_rho_c = {self.lr_rho_c}: must be > 0")
        if self.lr_gamma <= 0:
            raise ConfigError(f"train.lr_gamma = {self.lr_gamma}: must be > 0")
        self._check_step_schedule()
        self.postprocessors  # noqa: B018  (parse the chain now: its errors are configuration errors

    def _check_step_schedule(self) -> None:
        """``lr_milestones``: whole rounds >= 1, increasing; ``lr_decay`` in (0, 1]."""
        milestones = self.lr_milestones
        if not isinstance(milestones, list) or not all(
            isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in milestones
        ):
            raise ConfigError(f"train.lr_milestones = {milestones!r}: a list of rounds, whole numbers >= 1")
        if milestones != sorted(set(milestones)):
            raise ConfigError(f"train.lr_milestones = {milestones!r}: must be increasing")
        if isinstance(self.lr_decay, bool) or not 0.0 < self.lr_decay <= 1.0:
            raise ConfigError(f"train.lr_decay = {self.lr_decay!r}: must be in (0, 1]")

    @property
    def postprocessors(self) -> list:
        """The postprocessor chain: (registry entry, typed options) in order."""
        return _listed_plugins(self, "postprocessor", "train.postprocess", self.postprocess)


@dataclass
class SystemConfig(PluginSection):
    """``[system]``: the system model (``model``), the mid-round dropout, availability and
    participation wrappers around it, each a plug-in with its own options in the same table, and the
    per-round ``deadline`` (simulated seconds; 0 = run.time_budget / run.rounds)."""

    SECTION: ClassVar[str] = "system"
    SLOTS: ClassVar[dict[str, str]] = {
        "model": "system_model",
        "participation": "participation",
        "availability": "availability",
        "dropout": "dropout",
    }

    model: str = "straggler-ratio"
    deadline: float = 1.0
    # who takes part each round: always | uniform | two-group | list | cohort (a plug-in)
    participation: str = "always"
    availability: str = "always"  # who is online: always | trace (a plug-in)
    dropout: str = "none"  # mid-round failures: none | hazard | trace (a plug-in)
    compute_watts: float = 2.0  # a client's power draw while training (W; a device file's column wins)
    upload_watts: float = 1.0  # while communicating, the download included (W)
    idle_watts: float = 0.27  # while waiting, asked, for the round to close (W)
    # Gaussian-copula correlation of each client's data size, speed and availability
    # (participation = "uniform"); 0 = independent; in [-0.5, 1]
    device_correlation: float = 0.0

    def validate(self) -> None:
        if self.deadline < 0:
            raise ConfigError(f"system.deadline = {self.deadline}: must be >= 0 (0 = time_budget / rounds)")
        from fedhet.system.energy import MAX_WATTS

        for key in ("compute_watts", "upload_watts", "idle_watts"):
            in_range(f"system.{key}", getattr(self, key), 0.0, MAX_WATTS)
        in_range("system.device_correlation", self.device_correlation, -0.5, 1.0)
        if self.device_correlation and (self.participation not in ("always", "uniform")
                                        or self.availability != "always"):  # fmt: skip
            raise ConfigError(
                f"system.device_correlation = {self.device_correlation:g}: correlates availability through "
                f'participation = "uniform" (participation is {self.participation!r}, availability '
                f'{self.availability!r}); use participation = "uniform" or "always", availability = "always"'
            )

    @property
    def watts(self) -> dict[str, float]:
        """The power draws every client has unless its device says otherwise."""
        return {k: getattr(self, k) for k in ("compute_watts", "upload_watts", "idle_watts")}


@dataclass
class ServerConfig(PluginSection):
    """``[server]``: the server optimizer applied to every rule's global update
    (``optimizer``: sgd, momentum, adam, yogi, adagrad, a plug-in; its options in the same
    table: ``lr``, ``momentum``, ``beta1``, ``beta2``, ``tau``)."""

    SECTION: ClassVar[str] = "server"
    SLOTS: ClassVar[dict[str, str]] = {"optimizer": "server_optimizer"}

    optimizer: str = "sgd"


@dataclass
class SelectionConfig(PluginSection):
    """``[selection]``: which of the present clients the server asks each round (``rule``:
    all, uniform, power-of-choice, a plug-in; its options in the same table, e.g.
    ``clients_per_round``)."""

    SECTION: ClassVar[str] = "selection"
    SLOTS: ClassVar[dict[str, str]] = {"rule": "selection"}

    rule: str = "all"


@dataclass
class CompareConfig:
    algorithms: list = field(default_factory=list)


@dataclass
class AlgorithmConfig:
    """``[algorithm]``: the algorithm's ``name``, its typed ``options`` (the algorithm's
    ``Options`` dataclass, validated once) and the keys as ``given`` in the file."""

    name: str = "salf"
    options: Any = None
    given: dict = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """The name or a given option (as written in the file), like ``dict.get``."""
        return self.name if key == "name" else self.given.get(key, default)

    def to_dict(self) -> dict:
        return {"name": self.name, **self.given}


@dataclass
class Config:
    """A whole run's configuration."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)

    @property
    def algorithm_name(self) -> str:
        return self.algorithm.name

    @property
    def round_deadline(self) -> float:
        """The fixed per-round deadline: ``system.deadline``, or T_max / R when it is 0 (the
        equal-deadline schedule of ADEL-FL Sec. 4's baselines)."""
        if self.system.deadline > 0:
            return self.system.deadline
        return self.run.time_budget / self.run.rounds

    @property
    def algorithm_options(self) -> dict:
        """The ``[algorithm]`` options as given in the file (without ``name``)."""
        return dict(self.algorithm.given)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
        if not out["compare"]["algorithms"]:
            del out["compare"]
        # plug-ins that change nothing at their defaults are left out, so that a run's
        # resolved configuration reads as it did before they existed (resume, bench studies)
        if out["run"].get("checkpoint_every") == CHECKPOINT_EVERY:
            del out["run"]["checkpoint_every"]
        if out["run"].get("epsilon_budget") == 0.0:
            del out["run"]["epsilon_budget"]
        if out["system"].get("dropout") == "none":
            del out["system"]["dropout"]
        if out["system"].get("dropout_keeps") == "nothing":
            del out["system"]["dropout_keeps"]
        if out["system"].get("comm_times") == []:
            del out["system"]["comm_times"]
        if out["model"].get("classifier") == "one":
            del out["model"]["classifier"]
        if self._preset_takes_server_rate() and "server_lr" in out["algorithm"]:
            out["server"]["lr"] = out["algorithm"].pop("server_lr")  # its one key (one_server_rate)
        if out["server"] == {"optimizer": "sgd", "lr": 1.0}:
            del out["server"]
        if out["selection"] == {"rule": "all"}:
            del out["selection"]
        return out

    def _preset_takes_server_rate(self) -> bool:
        """Whether the rule is a server optimizer's preset stepping with ``server.lr``."""
        from fedhet.algorithms.base import overrides
        from fedhet.registry import resolve

        rule = resolve("algorithm", self.algorithm.name, "algorithm.name").cls
        return self.server.optimizer == "sgd" and overrides(rule.Aggregation, "preset_server_optimizer")

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


SECTIONS = {
    "run": RunConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "system": SystemConfig,
    "server": ServerConfig,
    "selection": SelectionConfig,
    "compare": CompareConfig,
}
PLUGIN_SECTIONS = ("run", "data", "model", "train", "system", "server", "selection")


def _section(name: str, cls: Any, values: Any):
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}] must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(fields)})")
        kwargs[key] = coerce_value(f"{name}.{key}", value, fields[key].type)
    return cls(**kwargs)


def from_dict(raw: dict) -> Config:
    """Build and validate a :class:`Config` from a parsed TOML document."""
    known = set(SECTIONS) | {"algorithm"}
    for key in raw:
        if key in GRID_SECTIONS:
            raise ConfigError(
                f"[{key}]: an experiment file's section: run the grid with fedhet reproduce FILE (fedhet run "
                "takes one configuration)"
            )
        if key not in known:
            raise ConfigError(f"[{key}]: unknown section (known: {', '.join(sorted(known))})")
    parts: dict[str, Any] = {
        name: parse_plugin_section(cls, raw.get(name, {})) if name in PLUGIN_SECTIONS
        else _section(name, cls, raw.get(name, {}))
        for name, cls in SECTIONS.items()
    }  # fmt: skip
    algorithm = raw.get("algorithm", {"name": "salf"})
    if not isinstance(algorithm, dict):
        raise ConfigError("[algorithm] must be a table")
    algorithm = dict(algorithm)
    default_name = parts["compare"].algorithms[0] if parts["compare"].algorithms else "salf"
    name = algorithm.pop("name", default_name)
    if not isinstance(name, str):
        raise ConfigError(f"algorithm.name = {name!r}: expected a string")
    if isinstance(raw.get("server", {}), dict):
        server = dict(raw.get("server", {}))
        one_server_rate(name, algorithm, server)
        parts["server"] = parse_plugin_section(ServerConfig, server)
    config = Config(algorithm=AlgorithmConfig(name, None, algorithm), **parts)
    validate(config)
    return config


def one_server_rate(name: str, algorithm: dict, server: dict) -> None:
    """``server.lr``, the one server learning rate eta_s (in place, in the raw
    ``[algorithm]`` and ``[server]`` tables): the ``[server]`` step's rate, and for a rule
    that is a server optimizer's preset (FedAdam: FedAvg with the adam step) its optimizer's
    rate. The older ``algorithm.server_lr``, a rule's own eta_s (FedAvg's w_t + eta_s sum_u
    a_u Delta_u), is still read as it always was, with one line saying that ``server.lr`` is
    the key (the same update, up to rounding); beside a ``server.lr`` other than 1 it is
    refused (:func:`fedhet.world.server_optimizer`: two rates would multiply)."""
    from fedhet.algorithms.base import overrides
    from fedhet.registry import resolve

    try:
        cls = resolve("algorithm", name, "algorithm.name").cls
    except ConfigError:
        return  # an unknown rule: named by validation
    preset = overrides(cls.Aggregation, "preset_server_optimizer")
    if preset and "lr" in server and server.get("optimizer", "sgd") == "sgd":
        if "server_lr" in algorithm and algorithm["server_lr"] != server["lr"]:
            raise ConfigError(
                f"algorithm.server_lr = {algorithm['server_lr']!r} and server.lr = {server['lr']!r}: one "
                f"server learning rate ({name} steps with it); write server.lr only"
            )
        algorithm["server_lr"] = server.pop("lr")  # the preset's optimizer steps with it
    elif "server_lr" in algorithm:
        _note_older_server_rate(repr(algorithm["server_lr"]))  # any value, validated later


@functools.cache
def _note_older_server_rate(value: str) -> None:
    log.warning(
        "algorithm.server_lr = %s: the older key of the one server learning rate, server.lr "
        "(the same update, up to rounding); read as before",
        value,
    )


def build_options(name: str, values: dict) -> Any:
    """Validate ``[algorithm]`` keys for algorithm ``name`` (a built-in name,
    ``"package.module:Class"`` or an installed plug-in) into its ``Options`` dataclass."""
    from fedhet.registry import resolve

    entry = resolve("algorithm", name, "algorithm.name")
    return typed_options(entry.cls.Options, values, "algorithm", name)


def _check_device_correlation(config: Config) -> None:
    """``system.device_correlation`` must have something to tie (client speeds the system
    model draws, or availability from ``participation = "uniform"``) and must not undo an
    assignment the configuration gives (devices in order, one capability per client)."""
    rho = config.system.device_correlation
    if not rho:
        return
    model = config.system.options("model")
    profile = getattr(model, "capability_profile", None)  # models with a time law draw speeds
    given = (
        "device_assignment = 'in-order'" if profile == "devices" and model.device_assignment == "in-order"
        else "capability_profile = 'list'" if profile == "list" else None
    )  # fmt: skip
    if given is not None:
        raise ConfigError(
            f"system.device_correlation = {rho:g}: hands speeds out by rank, which would undo {given} "
            "(each client's own); use a drawn profile, or device_correlation = 0"
        )
    if profile in (None, "constant") and config.system.participation != "uniform":
        speeds = (
            f"system.model = {config.system.model!r} draws no client speeds" if profile is None
            else "capability_profile = 'constant' gives every client one speed"
        )  # fmt: skip
        raise ConfigError(
            f"system.device_correlation = {rho:g}: ties nothing here: {speeds} and participation = "
            f"{config.system.participation!r} gives every client one availability; draw speeds "
            '(capability_profile) or use participation = "uniform"'
        )


def validate(config: Config) -> None:
    """Check every section, parse the plug-ins' options (once) and cross-section rules."""
    from fedhet.registry import resolve

    for name in SECTIONS:
        check = getattr(getattr(config, name), "validate", None)
        if check:
            check()
    config.algorithm.options = build_options(config.algorithm_name, config.algorithm_options)
    check_algorithm = getattr(config.algorithm.options, "validate_in", None)
    if check_algorithm:  # options that need other sections (e.g. no more than the clients)
        check_algorithm(config)
    for name in PLUGIN_SECTIONS:  # rules that need other sections (e.g. one value per client)
        section = getattr(config, name)
        unused = section.__dict__.get("_unused", {}).get("__options__", [])
        for options in [options for _, options in section.plugins.values()] + unused:
            check = getattr(options, "validate_in", None)
            if check:
                check(config)
    _check_device_correlation(config)
    if config.system.deadline == 0 and not config.run.time_budget:
        raise ConfigError("system.deadline = 0 (equal share of the budget) needs run.time_budget > 0")
    for name in config.compare.algorithms:
        if not isinstance(name, str):
            raise ConfigError(f"compare.algorithms: {name!r} is not an algorithm name (a string)")
        if config.compare.algorithms.count(name) > 1:
            raise ConfigError(f"compare.algorithms: {name!r} listed twice")
        try:
            resolve("algorithm", name, "compare.algorithms")
        except ConfigError as exc:
            raise ConfigError(
                str(exc).replace(f"compare.algorithms = {name!r}:", f"compare.algorithms: {name!r}")
            ) from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` (value in TOML syntax; bare words become strings)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    path, raw_value = text.split("=", 1)
    keys = path.strip().split(".")
    if len(keys) != 2 or not all(keys):
        raise ConfigError(f"--set {text!r}: key must look like section.key")
    try:
        value = tomllib.loads(f"v = {raw_value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw_value.strip()
    return keys, value


GRID_SECTIONS = ("experiment", "grid", "cases", "report")  # an experiment file's (studies.spec)
UNSET = "-"  # an override ``-section.key`` removes the key (``--unset section.key``)
_SWITCH_WARNED: set[tuple] = set()


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Return a copy of ``raw`` with ``section.key=value`` overrides applied; ``-section.key``
    removes a key. Setting ``algorithm.name`` to another algorithm drops the options the
    table held for the old one (with one warning line): they are not the new one's."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for text in overrides:
        if text.startswith(UNSET):
            section, key = _dotted(text[len(UNSET) :], "--unset")
            if not isinstance(out.get(section), dict) or key not in out[section]:
                raise ConfigError(f"--unset {section}.{key}: the configuration has no such key")
            del out[section][key]
            continue
        (section, key), value = parse_override(text)
        out.setdefault(section, {})
        if not isinstance(out[section], dict):
            raise ConfigError(f"--set {text!r}: [{section}] is not a table")
        if (section, key) == ("algorithm", "name"):
            _switch_algorithm(out["algorithm"], value)
        out[section][key] = value
    return out


def _dotted(text: str, flag: str) -> tuple[str, str]:
    keys = text.strip().split(".")
    if len(keys) != 2 or not all(keys):
        raise ConfigError(f"{flag} {text!r}: key must look like section.key")
    return keys[0], keys[1]


def _switch_algorithm(table: dict, name: Any) -> None:
    """``table`` ([algorithm]) switched to ``name``: the old algorithm's options go."""
    old = table.get("name")
    options = sorted(k for k in table if k != "name")
    if old is None or old == name or not options:
        return
    for key in options:
        del table[key]
    if (old, name, tuple(options)) not in _SWITCH_WARNED:
        _SWITCH_WARNED.add((old, name, tuple(options)))
        log.warning(
            "algorithm.name: %r -> %r: the options of %r (%s) are dropped", old, name, old, ", ".join(options)
        )


def read_toml(path: str | Path) -> dict:
    """Parse a TOML file; errors name the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a TOML file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1_000_000} MB; not a configuration")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); not a TOML file") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    return resolve_paths(raw, path)


@functools.cache
def path_keys() -> dict[str, frozenset[str]]:
    """section -> the keys of it that name a file or folder (declared with
    :func:`fedhet.checks.path_option` by a section or one of its slots' built-in plug-ins)."""
    from fedhet.checks import is_path_option
    from fedhet.registry import builtins

    keys: dict[str, frozenset[str]] = {}
    for name in PLUGIN_SECTIONS:
        section: Any = SECTIONS[name]
        classes = [section] + [
            e.cls.Options for kind in section.SLOTS.values() for e in builtins(kind).values()
        ]
        found = {f.name for cls in classes for f in dataclasses.fields(cls) if is_path_option(f)}
        keys[name] = frozenset(found)
    return keys


def resolve_paths(raw: dict, path: Path) -> dict:
    """``raw`` (a configuration, experiment or suite file read from ``path``) with every
    relative file or folder of a path key read against ``path``'s folder: in sections, in
    ``[[cases]]``, ``[grid]``, a suite's ``[scenarios.<name>]`` and its method tables
    (dotted keys). A value
    found only against the current folder, as fedhet read it before, is kept with a warning;
    one found against both, where they differ, is the file's, with a warning naming both."""
    keys, folder = path_keys(), path.parent
    out = dict(raw)
    for section, names in keys.items():
        table = out.get(section)
        if isinstance(table, dict):
            out[section] = {k: _resolved(v, folder, f"{path}: {section}.{k}") if k in names else v
                            for k, v in table.items()}  # fmt: skip
    dotted = {f"{section}.{k}" for section, names in keys.items() for k in names}
    if isinstance(out.get("cases"), list):
        out["cases"] = [
            _resolved_settings(case, dotted, folder, f"{path}: cases[{i}]: ")
            for i, case in enumerate(out["cases"], 1)
        ]
    if isinstance(out.get("grid"), dict):
        out["grid"] = _resolved_settings(out["grid"], dotted, folder, f"{path}: grid.", listed=True)
    if isinstance(out.get("scenarios"), dict):
        out["scenarios"] = {
            name: _resolved_settings(table, dotted, folder, f"{path}: scenarios.{name}.")
            for name, table in out["scenarios"].items()
        }
    suite = out.get("suite")
    if isinstance(suite, dict) and isinstance(suite.get("methods"), list):  # a method's own settings
        methods = [_resolved_settings(m, dotted, folder, f"{path}: suite.methods[{i}].")
                   for i, m in enumerate(suite["methods"], 1)]  # fmt: skip
        out["suite"] = {**suite, "methods": methods}
    return out


def _resolved_settings(table: Any, dotted: set[str], folder: Path, where: str, listed: bool = False) -> Any:
    """A table of dotted settings with its path keys resolved (``listed``: a grid's lists of
    values, each resolved)."""
    if not isinstance(table, dict):
        return table
    out = dict(table)
    for key in dotted & set(table):
        value = table[key]
        if listed and isinstance(value, list):
            out[key] = [_resolved(item, folder, f"{where}{key}") for item in value]
        else:
            out[key] = _resolved(value, folder, f"{where}{key}")
    return out


def _resolved(value: Any, folder: Path, where: str) -> Any:
    """``value`` read against ``folder`` (see :func:`resolve_paths`)."""
    if not isinstance(value, str) or not value or Path(value).is_absolute() or value.startswith("~"):
        return value
    in_file_folder = os.path.normpath(folder / value)
    here, there = Path(value).exists(), Path(in_file_folder).exists()
    if here and not there:
        log.warning("%s = %r: read against the current folder, as before; fedhet reads a relative path in a "
                    "file against the file's folder (%s), where it is not: write it relative to that folder",
                    where, value, folder)  # fmt: skip
        return value
    if here and there and Path(value).resolve() != Path(in_file_folder).resolve():
        log.warning("%s = %r: read against the file's folder (%s), not the current folder (%s, also there)",
                    where, value, in_file_folder, Path(value).resolve())  # fmt: skip
    return in_file_folder


def require_algorithm(raw: dict, where: str | Path) -> None:
    """A configuration file must say what to run: refuse an empty one (or one without an
    algorithm) instead of running defaults."""
    if not raw:
        raise ConfigError(
            f'{where}: empty configuration; it needs at least [algorithm] name = "..." '
            "(or [compare] algorithms = [...]); see examples/quickstart.toml"
        )
    algorithm, compare = raw.get("algorithm"), raw.get("compare")
    named = isinstance(algorithm, dict) and "name" in algorithm
    compared = isinstance(compare, dict) and compare.get("algorithms")
    if not (named or compared):
        raise ConfigError(f"{where}: no algorithm given; set [algorithm] name (or [compare] algorithms)")


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read, override and validate a configuration file."""
    raw = apply_overrides(read_toml(path), overrides or [])
    require_algorithm(raw, path)
    return from_dict(raw)
