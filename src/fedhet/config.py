"""Typed, validated run configuration: TOML in, one clear error line out.

Sections: ``[run] [data] [model] [train] [system] [algorithm]`` and, for several
algorithms on the same setting, ``[compare] algorithms = [...]``. ``[algorithm]`` holds
``name`` plus that algorithm's options (validated by the algorithm's ``Options``).
Command-line overrides use ``section.key=value`` with TOML values (``0.5``, ``true``,
``"x"``; bare words are read as strings).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError

MAX_ROUNDS = 10_000_000
MAX_THREADS = 1024
MAX_CLIENTS = 1_000_000
MAX_HIDDEN = 65_536
MAX_NAME = 100
MAX_CONFIG_BYTES = 10_000_000
NON_FINITE_POLICIES = ("stop", "skip-client")
ENGINES = ("embedded", "flower")


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
class RunConfig:
    name: str = "run"
    seed: int = 0
    rounds: int = 100
    time_budget: float = 0.0  # simulated seconds; 0 = no budget (stop after `rounds`)
    eval_every: int = 1
    threads: Any = "auto"  # torch threads: "auto" (work size, free cores), 0 = torch default, or a count
    memory_format: str = "contiguous"  # conv weights, images: contiguous | channels_last (faster)
    client_eval: bool = False  # also evaluate on each client's held-out part of its data
    client_eval_fraction: float = 0.2  # share of each client's data held out for it
    targets: list = field(default_factory=list)  # accuracies whose first round and time are recorded
    on_non_finite: str = "stop"  # a NaN/inf loss or update: stop the run, or skip that client's update
    engine: str = "embedded"  # embedded (one process) | flower (Flower's simulation runtime)
    round_timeout: float = 0.0  # flower: wall-clock seconds to wait for replies (0 = no limit)
    flower_cpus_per_client: float = 1.0  # flower simulation: CPUs Ray reserves per client

    def validate(self) -> None:
        _at_least("run.seed", self.seed, 0)
        _at_least("run.rounds", self.rounds, 1)
        _at_most("run.rounds", self.rounds, MAX_ROUNDS)
        _at_least("run.eval_every", self.eval_every, 1)
        if self.threads != "auto":
            if isinstance(self.threads, bool) or not isinstance(self.threads, int):
                raise ConfigError(f'run.threads = {self.threads!r}: expected "auto" or an integer')
            _at_least("run.threads", self.threads, 0)
            _at_most("run.threads", self.threads, MAX_THREADS)
        if self.time_budget < 0:
            raise ConfigError(f"run.time_budget = {self.time_budget}: must be >= 0 (0 = none)")
        check_name("run.name", self.name)
        _one_of("run.on_non_finite", self.on_non_finite, NON_FINITE_POLICIES)
        _one_of("run.engine", self.engine, ENGINES)
        _one_of("run.memory_format", self.memory_format, ("contiguous", "channels_last"))
        if self.round_timeout < 0:
            raise ConfigError(f"run.round_timeout = {self.round_timeout}: must be >= 0 (0 = no limit)")
        _in_range("run.flower_cpus_per_client", self.flower_cpus_per_client, 0.0, 1024.0, low_open=True)
        _in_range(
            "run.client_eval_fraction", self.client_eval_fraction, 0.0, 1.0, low_open=True, high_open=True
        )
        for target in self.targets:
            if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1:
                raise ConfigError(f"run.targets: {target!r} is not an accuracy in (0, 1]")


@dataclass
class DataConfig:
    dataset: str = "digits"
    data_dir: str = ""
    partition: str = "iid"
    num_clients: int = 10
    fraction: float = 1.0  # keep this random fraction of train and test examples
    alpha: float = 0.5  # dirichlet concentration
    shards_per_client: int = 2
    swap_fraction: float = 0.0  # label-swap: fraction of each label of a pair relabelled
    swap_pairs: list = field(default_factory=lambda: [[0, 1], [8, 9]])
    swap_clients: str = "all"  # "all" or "second-half"
    label_mode: str = "binary"  # nsl-kdd: "binary" or "5-class"
    normalize: str = "dataset"  # image pixels: "dataset" (train mean/std), "half" ((x-0.5)/0.5), "none"

    def validate(self) -> None:
        from fedhet.data import DATASETS, PARTITIONERS

        _one_of("data.dataset", self.dataset, DATASETS)
        _one_of("data.partition", self.partition, PARTITIONERS)
        _one_of("data.swap_clients", self.swap_clients, ("all", "second-half"))
        _one_of("data.label_mode", self.label_mode, ("binary", "5-class"))
        _one_of("data.normalize", self.normalize, ("dataset", "half", "none"))
        if self.dataset == "nsl-kdd" and self.normalize != "dataset":
            raise ConfigError(
                f"data.normalize = {self.normalize!r}: nsl-kdd is tabular; its features are "
                "always standardised (only 'dataset' applies)"
            )
        _at_least("data.num_clients", self.num_clients, 1)
        _at_most("data.num_clients", self.num_clients, MAX_CLIENTS)
        _at_least("data.shards_per_client", self.shards_per_client, 1)
        _in_range("data.fraction", self.fraction, 0.0, 1.0, low_open=True)
        _in_range("data.swap_fraction", self.swap_fraction, 0.0, 1.0)
        if self.alpha <= 0:
            raise ConfigError(f"data.alpha = {self.alpha}: must be > 0")
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
class ModelConfig:
    name: str = "mlp"
    hidden: list = field(default_factory=lambda: [32, 16])

    def validate(self) -> None:
        from fedhet.models import MODELS

        _one_of("model.name", self.name, MODELS)
        if not all(
            isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= MAX_HIDDEN for h in self.hidden
        ):
            raise ConfigError(f"model.hidden = {self.hidden!r}: must be integers in 1..{MAX_HIDDEN}")


@dataclass
class TrainConfig:
    lr: float = 0.05
    lr_schedule: str = "constant"
    lr_rho_c: float = 1.0
    lr_gamma: float = 1.0
    batch_size: int = 16
    local_steps: int = 1
    momentum: float = 0.0
    weight_decay: float = 0.0
    keep_momentum: bool = False

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"train.lr = {self.lr}: must be > 0")
        from fedhet.schedules import SCHEDULES

        _one_of("train.lr_schedule", self.lr_schedule, SCHEDULES)
        _at_least("train.batch_size", self.batch_size, 1)
        _at_least("train.local_steps", self.local_steps, 1)
        _in_range("train.momentum", self.momentum, 0.0, 1.0, high_open=True)
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay = {self.weight_decay}: must be >= 0")
        if self.lr_rho_c <= 0:
            raise ConfigError(f"train.lr_rho_c = {self.lr_rho_c}: must be > 0")
        if self.lr_gamma <= 0:
            raise ConfigError(f"train.lr_gamma = {self.lr_gamma}: must be > 0")


@dataclass
class SystemConfig:
    model: str = "straggler-ratio"
    deadline: float = 1.0  # per-round deadline (simulated seconds); 0 = run.time_budget / run.rounds
    # straggler-ratio
    straggler_ratio: float = 0.5
    fixed_stragglers: bool = False
    straggler_min_depth: int = 2
    # exponential
    time_per_sample_layer: float = 1.0
    # per-step (AMSFL Sec. 3.4): c_i = time_per_sample_step * batch / capability, b_i = comm_time
    time_per_sample_step: float = 1.0
    comm_time: float = 0.0
    step_jitter: float = 0.0  # sigma of a per-round lognormal factor on c_i (0 = none)
    capability_profile: str = "constant"
    capability_low: float = 0.5
    capability_high: float = 1.5
    capability_mu: float = 0.0
    capability_sigma: float = 0.5
    capabilities: list = field(default_factory=list)
    # Bernoulli participation (FedStale Assumption 4), on top of any model above
    participation: str = "always"  # always | two-group | uniform | list
    participation_min: float = 0.1  # two-group: p of the rarely participating half
    participation_group: str = "random"  # two-group: which half is rare (random | second-half)
    participation_low: float = 0.1  # uniform
    participation_high: float = 1.0
    participation_probs: list = field(default_factory=list)  # list
    cohort_size: int = 10  # cohort: clients drawn per round, uniformly without replacement
    measured_times: str = ""  # measured: a calibration file to reuse (fedhet calibrate --out)
    availability: str = "always"  # always | trace (availability_trace: a trace file)
    availability_trace: str = ""

    def validate(self) -> None:
        from fedhet.system import (
            CAPABILITY_PROFILES,
            PARTICIPATION_GROUPS,
            PARTICIPATION_PROFILES,
            SYSTEM_MODELS,
        )

        _one_of("system.model", self.model, SYSTEM_MODELS)
        _one_of("system.capability_profile", self.capability_profile, CAPABILITY_PROFILES)
        _one_of("system.participation", self.participation, PARTICIPATION_PROFILES)
        _one_of("system.participation_group", self.participation_group, PARTICIPATION_GROUPS)
        _one_of("system.availability", self.availability, ("always", "trace"))
        if self.availability == "trace" and not self.availability_trace:
            raise ConfigError("system.availability = 'trace' needs system.availability_trace (a trace file)")
        _in_range("system.participation_min", self.participation_min, 0.0, 1.0, low_open=True)
        _in_range("system.participation_low", self.participation_low, 0.0, 1.0, low_open=True)
        _in_range("system.participation_high", self.participation_high, 0.0, 1.0, low_open=True)
        _in_range("system.straggler_ratio", self.straggler_ratio, 0.0, 1.0)
        if self.deadline < 0:
            raise ConfigError(f"system.deadline = {self.deadline}: must be >= 0 (0 = time_budget / rounds)")
        if self.time_per_sample_layer <= 0:
            raise ConfigError(f"system.time_per_sample_layer = {self.time_per_sample_layer}: must be > 0")
        if self.time_per_sample_step <= 0:
            raise ConfigError(f"system.time_per_sample_step = {self.time_per_sample_step}: must be > 0")
        if self.comm_time < 0:
            raise ConfigError(f"system.comm_time = {self.comm_time}: must be >= 0")
        _in_range("system.step_jitter", self.step_jitter, 0.0, 10.0)
        _at_least("system.straggler_min_depth", self.straggler_min_depth, 1)
        if not 0 < self.capability_low <= self.capability_high:
            raise ConfigError(
                f"system.capability_low/high = {self.capability_low}/{self.capability_high}: "
                "need 0 < low <= high"
            )
        if self.capability_sigma < 0:
            raise ConfigError(f"system.capability_sigma = {self.capability_sigma}: must be >= 0")
        if abs(self.capability_mu) > 50 or self.capability_sigma > 10:
            raise ConfigError(
                f"system.capability_mu/sigma = {self.capability_mu}/{self.capability_sigma}: "
                "need |mu| <= 50 and sigma <= 10 (capabilities exp(mu + sigma z) must stay finite)"
            )
        number_list("system.capabilities", self.capabilities, 0.0, 1e12, low_open=True)
        if self.participation_low > self.participation_high:
            raise ConfigError(
                f"system.participation_low/high = {self.participation_low}/{self.participation_high}: "
                "need low <= high"
            )
        number_list("system.participation_probs", self.participation_probs, 0.0, 1.0, low_open=True)


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
            out[f.name] = value.to_dict() if isinstance(value, AlgorithmConfig) else dataclasses.asdict(value)
        if not out["compare"]["algorithms"]:
            del out["compare"]
        return out

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


SECTIONS = {
    "run": RunConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "system": SystemConfig,
    "compare": CompareConfig,
}


MAX_MAGNITUDE = 1e30  # beyond it numbers overflow single-precision tensors


def finite(key: str, value: float) -> float:
    """``value`` as a float; NaN, infinities and magnitudes above 1e30 are refused (no key
    takes them: they overflow the single-precision tensors the numbers meet)."""
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value}: must be a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise ConfigError(f"{key} = {value}: must be within ±{MAX_MAGNITUDE:g}")
    return value


def number_list(key: str, values: list, low: float, high: float, low_open: bool = False) -> list[float]:
    """Check a list of numbers, each finite and in [low, high] (or (low, high])."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: {value!r} is not a number")
        _in_range(key, finite(key, value), low, high, low_open=low_open)
    return values


def _at_most(key: str, value: int, high: int) -> None:
    if value > high:
        raise ConfigError(f"{key} = {value}: must be <= {high}")


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} = {value}: must be >= {low}")


def _in_range(key, value, low, high, low_open=False, high_open=False) -> None:
    bad = value < low or value > high or (low_open and value == low) or (high_open and value == high)
    if bad:
        lb, hb = "(" if low_open else "[", ")" if high_open else "]"
        raise ConfigError(f"{key} = {value}: must be in {lb}{low}, {high}{hb}")


def _one_of(key: str, value: str, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key} = {value!r}: unknown (known: {', '.join(choices)})")


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field's type; ints are accepted where floats are expected."""
    if isinstance(annotation, str):
        annotation = {"str": str, "int": int, "float": float, "bool": bool, "list": list}.get(
            annotation, annotation
        )
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return coerce_value(key, value, args[0])
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}: expected true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} = {value!r}: expected an integer")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} = {value!r}: expected a number")
        return finite(key, value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r}: expected a string")
        return value
    if annotation is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} = {value!r}: expected a list")
        return value
    return value


def _section(name: str, cls: type, values: Any):
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
        if key not in known:
            raise ConfigError(f"[{key}]: unknown section (known: {', '.join(sorted(known))})")
    parts = {name: _section(name, cls, raw.get(name, {})) for name, cls in SECTIONS.items()}
    algorithm = raw.get("algorithm", {"name": "salf"})
    if not isinstance(algorithm, dict):
        raise ConfigError("[algorithm] must be a table")
    algorithm = dict(algorithm)
    default_name = parts["compare"].algorithms[0] if parts["compare"].algorithms else "salf"
    name = algorithm.pop("name", default_name)
    if not isinstance(name, str):
        raise ConfigError(f"algorithm.name = {name!r}: expected a string")
    config = Config(algorithm=AlgorithmConfig(name, None, algorithm), **parts)
    validate(config)
    return config


def build_options(name: str, values: dict) -> Any:
    """Validate ``[algorithm]`` keys for algorithm ``name`` into its ``Options`` dataclass."""
    from fedhet.algorithms import ALGORITHMS

    try:
        cls = ALGORITHMS[name]
    except KeyError:
        raise ConfigError(
            f"algorithm.name = {name!r}: unknown (known: {', '.join(sorted(ALGORITHMS))})"
        ) from None
    fields = {f.name: f for f in dataclasses.fields(cls.Options)}
    for key in values:
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(f"algorithm.{key}: unknown option for {name} (known: {known})")
    typed = {key: coerce_value(f"algorithm.{key}", v, fields[key].type) for key, v in values.items()}
    options = cls.Options(**typed)
    check = getattr(options, "validate", None)
    if check:
        check()
    return options


def validate(config: Config) -> None:
    """Check every section, parse the algorithm's options (once) and cross-section rules."""
    from fedhet.algorithms import ALGORITHMS

    for name in SECTIONS:
        check = getattr(getattr(config, name), "validate", None)
        if check:
            check()
    config.algorithm.options = build_options(config.algorithm_name, config.algorithm_options)
    system, clients = config.system, config.data.num_clients
    if system.capability_profile == "list" and len(system.capabilities) != clients:
        raise ConfigError(
            f"system.capabilities: {len(system.capabilities)} values given for {clients} clients "
            "(capability_profile = 'list')"
        )
    if system.participation == "cohort" and not 1 <= system.cohort_size <= clients:
        raise ConfigError(
            f"system.cohort_size = {system.cohort_size}: must be in 1..{clients} (data.num_clients)"
        )
    if system.participation == "list" and len(system.participation_probs) != clients:
        raise ConfigError(
            f"system.participation_probs: {len(system.participation_probs)} values given for "
            f"{clients} clients (participation = 'list')"
        )
    if config.system.deadline == 0 and not config.run.time_budget:
        raise ConfigError("system.deadline = 0 (equal share of the budget) needs run.time_budget > 0")
    for name in config.compare.algorithms:
        if not isinstance(name, str):
            raise ConfigError(f"compare.algorithms: {name!r} is not an algorithm name (a string)")
        if config.compare.algorithms.count(name) > 1:
            raise ConfigError(f"compare.algorithms: {name!r} listed twice")
        if name not in ALGORITHMS:
            raise ConfigError(
                f"compare.algorithms: {name!r} unknown (known: {', '.join(sorted(ALGORITHMS))})"
            )


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


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Return a copy of ``raw`` with ``section.key=value`` overrides applied."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for text in overrides:
        (section, key), value = parse_override(text)
        out.setdefault(section, {})
        if not isinstance(out[section], dict):
            raise ConfigError(f"--set {text!r}: [{section}] is not a table")
        out[section][key] = value
    return out


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
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None


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
