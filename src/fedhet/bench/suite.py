"""Suite files: the scenarios a bench runs, the methods it compares and the budget each
method is tuned under.

::

    [suite]
    name = "smoke"
    description = "..."
    methods = ["fedavg", "salf", { name = "salf", normalize = "all", label = "salf-all" },
               { name = "depthfl", "model.name" = "mlp-exits" }]   # dotted keys: its settings
    trials = 4                  # tuning trials per method and scenario (finished or pruned)
    tuning_repeats = 2          # independent tunings of each (sampler seeds); the tests' unit
    seeds = 3                   # seeds 1..3 of each tuned setting on the test set (or a list)
    validation_fraction = 0.2   # the tuning trials are judged on this share of the training set
    objective = "final_test_accuracy"   # what a trial is judged by (as fedhet tune's objectives)
    target = 0.8                # the leaderboard's time-to-accuracy on the simulated clock
    reference = "fedavg"        # every method's effect is also stated against this one
                                # (default: fedavg, else drop, where the suite runs them)
    base = "base.toml"          # optional: a configuration the sections below add to

    [params]                    # the shared knobs, searched for every method alike
    "train.lr" = { low = 0.005, high = 0.5, log = true }    # the defaults: the client's and
    "server.lr" = { low = 0.25, high = 2.0, log = true }    # the [server] step's learning rate

    [algorithm_params.salf-all] # one method's ranges: replace or add to what it declares
    "algorithm.beta" = { low = 0.1, high = 0.9 }

    [run]                       # the base configuration: every scenario starts from it
    time_budget = 30.0
    [data]
    dataset = "digits"
    ...

    [selections.uniform]        # optional: every round rule crossed with each selection,
    rule = "uniform"            # as method <label>+uniform, ... (a [selection] section);
    clients_per_round = 5       # event-driven rules run once, without one

    [scenarios.random-50]       # a scenario: the settings that make it one (dotted keys)
    description = "half the clients are stragglers, drawn each round"
    "system.straggler_ratio" = 0.5
    options.amsfl = { round_budget = 4.0 }    # a method's fixed options in this scenario
    options.fedbuff = { "run.rounds" = 100000 }   # dotted keys: its settings in this scenario
    skip.heterofl = "why it does not run here"

Each method's searched keys are the suite's shared ``[params]`` (the same for every method,
whatever class it inherits: the client learning rate and the server learning rate of the
``[server]`` step by default), the hyperparameters its class declares
(:attr:`fedhet.algorithms.Algorithm.hyperparameters`) and the suite's
``[algorithm_params.<label>]``; an option a method's table fixes is not searched. One server
learning rate: a rule's own ``server_lr`` gives way to the shared ``server.lr``, except for a
server optimizer's preset (FedAdam), whose ``server_lr`` is its optimizer's rate and stands
for the shared knob. What a method searches beyond the shared keys is its own, flagged on the
leaderboard. Every configuration a bench would run is built and checked when the suite is
loaded, so a bad suite is refused in one line before anything runs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.config import GRID_SECTIONS, SECTIONS, apply_overrides, check_name, from_dict, read_toml
from fedhet.data.task import check_objective
from fedhet.errors import ConfigError
from fedhet.run_schema import objective_direction
from fedhet.search_space import Param, declared_params, parse_param

SERVER_LR = "server.lr"
DEFAULT_PARAMS = {
    "train.lr": {"low": 0.005, "high": 0.5, "log": True},
    SERVER_LR: {"low": 0.25, "high": 2.0, "log": True},  # the [server] step every rule has
}
SUITE_KEYS = {
    "name", "description", "methods", "trials", "seeds", "validation_fraction", "objective", "direction",
    "target", "base", "alpha", "random_trials", "pruner", "startup_trials", "warmup_steps",
    "max_failures", "threads", "sampler_seed", "tuning_repeats", "reference", "lockstep",
}  # fmt: skip
SCENARIO_KEYS = {"description", "options", "skip"}


@dataclass
class Method:
    """One compared method: its leaderboard ``label``, algorithm ``name`` (built-in, entry
    point or ``module:Class``), the options it fixes and the keys searched for it."""

    label: str
    name: str
    options: dict[str, Any]
    params: list[Param]
    own: list[str] = field(default_factory=list)  # searched keys beyond the suite's shared ones
    plugin: bool = False  # added with --method
    settings: dict[str, Any] = field(default_factory=dict)  # dotted keys it needs (its model)


@dataclass
class Scenario:
    """A base configuration's variant: ``settings`` (dotted keys), per-method fixed
    ``options`` and methods it ``skip``s (label -> why)."""

    name: str
    description: str
    settings: dict[str, Any]
    options: dict[str, dict] = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)


@dataclass
class Suite:
    """A parsed suite (see the module's docstring)."""

    name: str
    path: str
    description: str
    base: dict
    scenarios: list[Scenario]
    methods: list[Method]
    trials: int = 4
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    validation_fraction: float = 0.2
    objective: str = "final_test_accuracy"
    direction: str = "maximize"
    direction_given: bool = False  # set by the suite; else the runs' task decides (objective_direction)
    target: float | None = None
    alpha: float = 0.05
    random_trials: int = 3
    pruner: str = "median"
    startup_trials: int = 3
    warmup_steps: int = 0
    max_failures: int = 3
    threads: int = 1
    sampler_seed: int = 1
    tuning_repeats: int = 1
    reference: str | None = None  # the method every effect is also stated against
    # whether a tuned setting's seed runs train as one computation (engine.cohort), and so
    # do the k-th trials of a method's tuning repeats where trials are not pruned: true,
    # false, or "auto" (on a GPU, where a bigger group pays; on the CPU it measured slower,
    # docs/performance.md section 15)
    lockstep: bool | str = "auto"
    shared: list[Param] = field(default_factory=list)  # the knobs every method searches
    # (scenario, method label) -> keys a method searches that only its inert mechanisms read
    # there (:mod:`fedhet.algorithms.mechanisms`): not tuned in that scenario
    inert: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def params_for(self, scenario: Scenario, method: Method) -> list[Param]:
        """The keys ``method`` searches in ``scenario``: its own, less those only a mechanism
        that is inert there reads."""
        dropped = self.inert.get((scenario.name, method.label), [])
        return [p for p in method.params if p.key not in dropped]

    def own_for(self, scenario: Scenario, method: Method) -> list[str]:
        """The method's own searched keys (beyond the shared ones) in ``scenario``."""
        dropped = self.inert.get((scenario.name, method.label), [])
        return [key for key in method.own if key not in dropped]

    def pairs(self) -> list[tuple[Scenario, Method]]:
        """Every (scenario, method) that runs: the product, less each scenario's skips."""
        return [(s, m) for s in self.scenarios for m in self.methods if m.label not in s.skip]

    def in_lockstep(self) -> bool:
        """Whether runs train in lockstep (``lockstep``; ``"auto"``: when the base
        configuration's ``run.device`` is, or resolves to, a GPU)."""
        if isinstance(self.lockstep, bool):
            return self.lockstep
        from fedhet.device import resolve_device

        run = self.base.get("run", {})
        return resolve_device(str(run.get("device", "auto")), run.get("workers", 1)).type != "cpu"

    def tunings(self) -> list[Tuning]:
        """Every tuning a bench runs: each pair tuned ``tuning_repeats`` times."""
        return [Tuning(s, m, r) for s, m in self.pairs() for r in range(1, self.tuning_repeats + 1)]

    def study_name(self, scenario: Scenario, method: Method, repeat: int = 1) -> str:
        return f"{scenario.name}/{method.label}" + (f"/tuning-{repeat}" if repeat > 1 else "")

    def config(self, scenario: Scenario, method: Method, values: dict[str, Any], run_name: str,
               seed: int | None = None) -> dict:  # fmt: skip
        """The raw configuration of one run: the base, the scenario, the method and its
        fixed options, the searched ``values``; a tuning trial (``seed`` None) on the
        validation split, a seed run (``run.seed = seed``) on the test set."""
        raw = copy.deepcopy(self.base)
        where = f"{self.path}: scenarios.{scenario.name}"
        for key, value in scenario.settings.items():
            raw = _set(raw, key, value, where)
        fixed = scenario.options.get(method.label, {})  # its options here; dotted keys: settings
        raw["algorithm"] = {
            "name": method.name,
            **method.options,
            **{k: v for k, v in fixed.items() if "." not in k},
        }
        for key in [k for k in fixed if "." in k]:  # an event-driven rule's server steps, say
            raw = _set(raw, key, fixed[key], f"{where}.options.{method.label}")
        where = f"{self.path}: method {method.label}"
        for key, value in method.settings.items():  # what the method needs (DepthFL: its model)
            raw = _set(raw, key, value, where)
        for key, value in values.items():
            raw = _set(raw, key, value, where)
        run = raw.setdefault("run", {})
        run["name"] = run_name
        run["threads"] = self.threads
        if self.target is not None:
            run["targets"] = sorted({*run.get("targets", []), self.target})
        data = raw.setdefault("data", {})
        if seed is None:
            data["validation_fraction"] = self.validation_fraction
        else:
            data.pop("validation_fraction", None)
            run["seed"] = seed
        return raw


@dataclass
class Tuning:
    """One tuning of a method in a scenario: repeat ``repeat`` (1..``suite.tuning_repeats``),
    an independent study whose sampler is seeded by ``suite.sampler_seed + repeat - 1`` and
    the method (:func:`fedhet.bench.study.sampler_seed`); its
    best setting runs on the suite's seeds. The first keeps the plain names and folders."""

    scenario: Scenario
    method: Method
    repeat: int = 1

    @property
    def part(self) -> str:
        """Its folder under a method's (``""`` for the first) and its runs' name suffix."""
        return f"tuning-{self.repeat}" if self.repeat > 1 else ""

    def folder(self, root: Path) -> Path:
        """``root/<scenario>/<method>[/tuning-r]``."""
        base = root / self.scenario.name / self.method.label
        return base / self.part if self.part else base

    def run_name(self, what: str) -> str:
        """``<scenario>-<method>[-tuning-r]-<what>`` (what: trial-3, seed-2)."""
        return "-".join(x for x in (self.scenario.name, self.method.label, self.part, what) if x)


def _set(raw: dict, key: str, value: Any, where: str) -> dict:
    from fedhet.studies.expansion import _override_text

    try:
        return apply_overrides(raw, [_override_text(key, value)])
    except ConfigError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise ConfigError(f"{where}: {key} = {value!r}: {reason}") from None


def _int(table: dict, key: str, where: str, low: int, default: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{where}: suite.{key} = {value!r}: a whole number >= {low}")
    return value


def _label(name: str) -> str:
    return name.rsplit(":", 1)[-1] if ":" in name else name


def _methods(entries: Any, extra: list[str], where: str) -> list[Method]:
    from fedhet import registry

    if not isinstance(entries, list) or not all(isinstance(e, str | dict) for e in entries):
        raise ConfigError(f"{where}: suite.methods: a list of algorithm names or tables {{ name = .. }}")
    methods = []
    for entry in [*entries, *extra]:
        table = dict(entry) if isinstance(entry, dict) else {"name": entry}
        name = table.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: suite.methods: {entry!r}: a method needs a name")
        label = table.pop("label", _label(name))
        try:
            check_name("label", label)
        except ConfigError:
            raise ConfigError(f"{where}: method {label!r}: its label must be a plain folder name") from None
        cls = registry.resolve("algorithm", name, f"{where}: method").cls
        settings = {key: table.pop(key) for key in [k for k in table if "." in k]}
        methods.append(Method(label, name, table, [], plugin=entry in extra, settings=settings))
        methods[-1].params = declared_params(cls, f"{where}: method {label}")
    labels = [m.label for m in methods]
    doubled = sorted({x for x in labels if labels.count(x) > 1})
    if doubled:
        raise ConfigError(f"{where}: method {doubled[0]!r} is listed twice (give one a label = ..)")
    if not methods:
        raise ConfigError(f"{where}: suite.methods is empty: nothing to compare")
    return methods


def _cross(methods: list[Method], selections: Any, where: str) -> tuple[list[Method], dict[str, list[str]]]:
    """Every round rule crossed with every ``[selections.<name>]`` (a ``[selection]``
    section): one method ``<label>+<name>`` per selection; an event-driven rule (its class's
    ``driver``), which hands out work as clients come back, and a method whose table already
    sets ``selection.*`` run once as they are. Returns the methods and, per crossed label,
    the labels it became (a scenario's options and skips follow them)."""
    from fedhet import registry

    if selections is None:
        return methods, {}
    if (
        not isinstance(selections, dict)
        or not selections
        or not all(isinstance(v, dict) for v in selections.values())
    ):
        raise ConfigError(f"{where}: [selections.<name>]: tables of [selection] keys (rule = ..)")
    for name, table in selections.items():
        try:
            check_name("selection", name)
        except ConfigError:
            raise ConfigError(f"{where}: selections.{name}: the name must be a plain folder name") from None
        if "rule" not in table:
            raise ConfigError(f"{where}: selections.{name}: a selection needs a rule = ..")
    out: list[Method] = []
    derived: dict[str, list[str]] = {}
    for method in methods:
        cls = registry.resolve("algorithm", method.name, f"{where}: method").cls
        if cls.driver == "event" or any(k.startswith("selection.") for k in method.settings):
            out.append(method)
            continue
        derived[method.label] = []
        for name, table in selections.items():
            settings = {**method.settings, **{f"selection.{k}": v for k, v in table.items()}}
            label = f"{method.label}+{name}"
            out.append(Method(label, method.name, dict(method.options), list(method.params),
                              plugin=method.plugin, settings=settings))  # fmt: skip
            derived[method.label].append(label)
    labels = [m.label for m in out]
    doubled = sorted({x for x in labels if labels.count(x) > 1})
    if doubled:
        raise ConfigError(
            f"{where}: method {doubled[0]!r} comes twice once [selections] are crossed (a method's own "
            "label and a crossing's): give the method another label"
        )
    return out, derived


def _follow(scenarios: list[Scenario], derived: dict[str, list[str]]) -> None:
    """A scenario's options and skips of a crossed method apply to each of its crossings."""
    for scenario in scenarios:
        tables: tuple[dict[str, Any], ...] = (scenario.options, scenario.skip)
        for table in tables:
            for label in [k for k in table if k in derived]:
                value = table.pop(label)
                table.update({new: value for new in derived[label]})


def _search(methods: list[Method], shared: dict, own: dict, where: str) -> list[Param]:
    """Each method's searched keys: the suite's shared ones, the same for every method (the
    client and the server learning rate by default), then its declared ones and the suite's
    own for it; keys its table fixes are not searched. ``method.own`` lists what it searches
    beyond the shared keys."""
    common = [parse_param(k, v, f"{where}: params") for k, v in {**DEFAULT_PARAMS, **shared}.items()]
    _check_searchable(common, f"{where}: params")
    labels = {m.label for m in methods}
    for label in own:
        if label not in labels:
            raise ConfigError(f"{where}: [algorithm_params.{label}]: not a method of the suite")
    for method in methods:
        given = own.get(method.label, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{where}: algorithm_params.{method.label}: expected a table of keys")
        suite_own = [parse_param(k, v, f"{where}: algorithm_params.{method.label}") for k, v in given.items()]
        _check_searchable(suite_own, f"{where}: algorithm_params.{method.label}")
        keys: dict[str, Param] = {}
        for param in [*_server_rate(method, common), *suite_own]:
            keys[param.key] = param
        fixed = {f"algorithm.{k}" for k in method.options}
        if "server_lr" in method.options:  # its own server rate: the one server learning rate, fixed
            fixed.add(SERVER_LR)
        clash = sorted(fixed & {p.key for p in common})
        if clash:
            raise ConfigError(
                f"{where}: method {method.label} fixes {clash[0]}, which the suite searches for every method "
                "alike ([params]): drop it from the method's table or from [params]"
            )
        method.params = [p for k, p in keys.items() if k not in fixed]
        shared_keys = {p.key for p in common} | {OWN_SERVER_LR, SERVER_LR}
        method.own = [p.key for p in method.params if p.key not in shared_keys]
    return common


OWN_SERVER_LR = "algorithm.server_lr"

# keys a bench sets in every run itself: a search over them would search nothing
SET_BY_THE_BENCH = {
    "run.name": "each run's name",
    "run.threads": "suite.threads",
    "run.targets": "suite.target",
    "run.seed": "the seeds",
    "data.validation_fraction": "suite.validation_fraction",
}


def _check_searchable(params: list[Param], where: str) -> None:
    """Refuse, in one line, a searched key the bench sets in every run itself."""
    for param in params:
        if param.key in SET_BY_THE_BENCH:
            raise ConfigError(
                f"{where}: {param.key} is set by the bench itself ({SET_BY_THE_BENCH[param.key]}): "
                "searching it would search nothing"
            )


def _is_preset(method: Method) -> bool:
    """Whether the method's rule is a server optimizer's preset (FedAdam)."""
    from fedhet import registry
    from fedhet.algorithms.base import overrides

    cls = registry.resolve("algorithm", method.name, f"method {method.label}").cls
    return overrides(cls.Aggregation, "preset_server_optimizer")


def _server_rate(method: Method, common: list[Param]) -> list[Param]:
    """The shared keys and the method's declared ones with one server learning rate: the
    shared ``server.lr`` (the ``[server]`` step of every rule) in place of a rule's own
    ``server_lr``; for a server optimizer's preset (FedAdam), which steps with its own rate,
    ``server.lr`` is that rate (:func:`fedhet.config.one_server_rate`), searched in its
    declared range (the optimizer's). A suite that shares no server rate searches a rule's
    own ``server_lr`` as declared."""
    declared = {p.key: p for p in method.params}
    own = declared.pop(OWN_SERVER_LR, None)
    shared = {p.key: p for p in common}
    range_of = ("low", "high", "log", "integer", "choices")
    if SERVER_LR not in shared:  # the rule's own rate, as its key (the same arithmetic as ever)
        return [*common, *([own] if own else []), *declared.values()]
    if own is None or not _is_preset(method):
        return [*common, *declared.values()]
    rate = Param(SERVER_LR, **{k: getattr(own, k) for k in range_of})
    return [rate if p.key == SERVER_LR else p for p in common] + list(declared.values())


def _scenarios(raw: Any, where: str) -> list[Scenario]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: [scenarios.<name>]: a suite needs at least one scenario")
    out = []
    for name, table in raw.items():
        try:
            check_name("scenario", name)
        except ConfigError:
            raise ConfigError(f"{where}: scenarios.{name}: the name must be a plain folder name") from None
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: scenarios.{name}: expected a table of settings")
        settings = {k: v for k, v in table.items() if k not in SCENARIO_KEYS}
        for key in settings:
            if "." not in key:
                raise ConfigError(
                    f'{where}: scenarios.{name}.{key}: a setting looks like "section.key" = value '
                    "(or description, options, skip)"
                )
        options, skip = table.get("options", {}), table.get("skip", {})
        if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
            raise ConfigError(f"{where}: scenarios.{name}.options: a table of method label -> options")
        if not isinstance(skip, dict) or not all(isinstance(v, str) for v in skip.values()):
            raise ConfigError(f"{where}: scenarios.{name}.skip: a table of method label -> why")
        out.append(Scenario(name, str(table.get("description", "")), settings, options, skip))
    return out


def _base(raw: dict, path: Path, overrides: list[str]) -> dict:
    """The base configuration: ``suite.base``'s file (relative to the suite) with the
    suite's own sections added, then ``--set`` overrides."""
    for section in ("algorithm", "compare", *GRID_SECTIONS):
        if section in raw or section in raw.get("suite", {}):
            raise ConfigError(
                f"{path}: [{section}]: not part of a suite (methods come from suite.methods, "
                "scenarios from [scenarios.<name>])"
            )
    base: dict = {}
    if "base" in raw["suite"]:
        base_path = path.parent / str(raw["suite"]["base"])
        base = read_toml(base_path)
        for section in ("algorithm", "compare"):
            base.pop(section, None)
    for section in SECTIONS:
        if section in raw:
            base[section] = {**base.get(section, {}), **raw[section]}
    return apply_overrides(base, overrides)


def load_suite(
    path: str | Path,
    extra_methods: list[str] | None = None,
    trials: int | None = None,
    seeds: int | None = None,
    overrides: list[str] | None = None,
    repeats: int | None = None,
) -> Suite:
    """Read a suite; ``extra_methods`` (``--method``), ``trials``, ``seeds`` (a count:
    seeds 1..S) and ``repeats`` (tunings per pair) replace or add to the file's. Every
    configuration is checked (:func:`check`)."""
    path = Path(path)
    raw = read_toml(path)
    where = str(path)
    known = {"suite", "params", "algorithm_params", "scenarios", "selections", *SECTIONS}
    for section in raw:
        if section not in known and section not in ("algorithm", "compare", *GRID_SECTIONS):
            raise ConfigError(f"{where}: [{section}]: unknown section (known: {', '.join(sorted(known))})")
    table = raw.get("suite")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [suite] is missing (name, methods, trials, seeds, ...)")
    unknown = sorted(set(table) - SUITE_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: suite.{unknown[0]}: unknown key (known: {', '.join(sorted(SUITE_KEYS))})"
        )
    name = table.get("name", path.stem)
    try:
        check_name("suite.name", name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    methods = _methods(table.get("methods", []), list(extra_methods or []), where)
    scenarios = _scenarios(raw.get("scenarios"), where)
    _known_labels(scenarios, methods, where)
    methods, derived = _cross(methods, raw.get("selections"), where)
    _follow(scenarios, derived)
    own = raw.get("algorithm_params", {})
    if isinstance(own, dict):
        own = {new: table for label, table in own.items() for new in derived.get(label, [label])}
    shared = _search(methods, raw.get("params", {}), own, where)
    suite = Suite(name, where, str(table.get("description", "")), _base(raw, path, overrides or []),
                  scenarios, methods, shared=shared)  # fmt: skip
    _settings(suite, table, trials, seeds, repeats)
    suite.reference = _reference(table, methods, derived, where)
    check(suite)
    suite.inert = {(s.name, m.label): keys for s, m in suite.pairs() if (keys := _inert_knobs(suite, s, m))}
    return suite


def _inert_knobs(suite: Suite, scenario: Scenario, method: Method) -> list[str]:
    """The keys ``method`` searches that only mechanisms inert in ``scenario`` read, whatever
    value any searched key takes (each at both ends of its range): a search over them would
    tune nothing."""
    from fedhet.algorithms.base import AlgorithmContext
    from fedhet.algorithms.mechanisms import has_time_law, inert_knobs
    from fedhet.registry import resolve

    cls = resolve("algorithm", method.name, f"method {method.label}").cls
    if not getattr(cls, "mechanisms", ()):
        return []  # nothing declared: no configuration to build
    searched = {p.key for p in method.params}
    probes: list[dict] = [{}] + [{p.key: v} for p in method.params for v in p.ends()]
    common: set[str] | None = None
    for values in probes:
        config = from_dict(suite.config(scenario, method, values, "check"))
        rule = cls.build(config.algorithm.options, AlgorithmContext(config.train))
        timed = has_time_law(config.system.entry("model").cls)
        try:
            keys = inert_knobs(rule, timed) & searched
        except Exception as exc:  # noqa: BLE001 - a plug-in's test of its settings
            raise ConfigError(
                f"{suite.path}: scenario {scenario.name}, method {method.label}: its mechanisms' "
                f"test of the settings raised {type(exc).__name__}: {exc}"
            ) from None
        common = keys if common is None else common & keys
        if not common:
            return []  # a probe where every searched knob acts: nothing to leave out
    return sorted(common or ())


def _seeds(given: Any, from_command_line: bool, where: Any) -> list[int]:
    """``suite.seeds`` (or ``--seeds``): a count (seeds 1..n) or a list of distinct seeds."""
    if isinstance(given, list):
        if not given or not all(isinstance(s, int) and not isinstance(s, bool) for s in given):
            raise ConfigError(f"{where}: suite.seeds = {given!r}: a count >= 1 or a non-empty list of seeds")
        if len(set(given)) != len(given):
            raise ConfigError(f"{where}: suite.seeds = {given!r}: a seed is listed twice")
        return list(given)
    if isinstance(given, int) and not isinstance(given, bool) and given >= 1:
        return list(range(1, given + 1))
    what = f"--seeds {given}" if from_command_line else f"{where}: suite.seeds = {given!r}"
    raise ConfigError(f"{what}: the number of seeds must be >= 1")


def _settings(suite: Suite, table: dict, trials: int | None, seeds: int | None, repeats: int | None) -> None:
    """The suite's budget and statistics settings, checked."""
    where = suite.path
    suite.trials = trials if trials is not None else _int(table, "trials", where, 1, suite.trials)
    if suite.trials < 1:
        raise ConfigError(f"--trials {suite.trials}: must be >= 1")
    suite.seeds = _seeds(seeds if seeds is not None else table.get("seeds", 3), seeds is not None, where)
    fraction = table.get("validation_fraction", 0.2)
    if not isinstance(fraction, int | float) or not 0 < fraction < 1:
        raise ConfigError(f"{where}: suite.validation_fraction = {fraction!r}: in (0, 1)")
    suite.validation_fraction = float(fraction)
    suite.objective = table.get("objective", suite.objective)
    check_objective(f"{where}: suite.objective", suite.objective, plain=())
    _direction(suite, table)
    target = table.get("target")
    bad = target is not None and (
        isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target < float("inf")
    )
    if bad or (target is not None and suite.direction == "maximize" and target > 1):
        raise ConfigError(
            f"{where}: suite.target = {target!r}: a value of the task's score to reach (an accuracy "
            "in (0, 1], an RMSE > 0 to get below)"
        )
    suite.target = None if target is None else float(target)
    alpha = table.get("alpha", 0.05)
    if not isinstance(alpha, float) or not 0 < alpha < 1:
        raise ConfigError(f"{where}: suite.alpha = {alpha!r}: a significance level in (0, 1)")
    suite.alpha = alpha
    suite.lockstep = table.get("lockstep", "auto")
    if not isinstance(suite.lockstep, bool) and suite.lockstep != "auto":
        raise ConfigError(f'{where}: suite.lockstep = {suite.lockstep!r}: true, false or "auto"')
    suite.pruner = table.get("pruner", "median")
    if suite.pruner not in ("median", "none"):
        raise ConfigError(f"{where}: suite.pruner = {suite.pruner!r}: median or none")
    suite.random_trials = _int(table, "random_trials", where, 0, 3)
    suite.startup_trials = _int(table, "startup_trials", where, 0, 3)
    suite.warmup_steps = _int(table, "warmup_steps", where, 0, 0)
    suite.max_failures = _int(table, "max_failures", where, 1, 3)
    suite.threads = _int(table, "threads", where, 1, 1)
    suite.sampler_seed = _int(table, "sampler_seed", where, 0, 1)
    suite.tuning_repeats = repeats if repeats is not None else _int(table, "tuning_repeats", where, 1, 1)
    highest = 2**32 - suite.tuning_repeats  # each tuning's sampler is seeded sampler_seed + repeat - 1
    if suite.sampler_seed > highest:
        raise ConfigError(f"{where}: suite.sampler_seed = {suite.sampler_seed}: at most {highest}")


def _reference(table: dict, methods: list[Method], derived: dict[str, list[str]], where: str) -> str | None:
    """``suite.reference``: a method label of the suite (a rule crossed with ``[selections]``:
    its first crossing); without it, FedAvg, else drop-stragglers, where the suite runs them
    (:func:`fedhet.bench.leaderboard.default_reference`)."""
    from fedhet.bench.leaderboard import default_reference

    labels = [m.label for m in methods]
    reference = table.get("reference")
    if isinstance(reference, str) and reference not in labels and derived.get(reference):
        reference = derived[reference][0]
    if reference is None:
        return default_reference(labels)
    if reference not in labels:
        raise ConfigError(
            f"{where}: suite.reference = {reference!r}: not a method of the suite "
            f"(methods: {', '.join(labels)})"
        )
    return str(reference)


def _direction(suite: Suite, table: dict) -> None:
    """``suite.direction``, checked; without it, the objective's natural direction until the
    runs' task says (:meth:`fedhet.bench.runner.Bench.run`)."""
    suite.direction = table.get("direction", objective_direction(suite.objective))
    suite.direction_given = "direction" in table
    if suite.direction not in ("maximize", "minimize"):
        raise ConfigError(f"{suite.path}: suite.direction = {suite.direction!r}: maximize or minimize")


def _known_labels(scenarios: list[Scenario], methods: list[Method], where: str) -> None:
    """A scenario's options and skips name methods of the suite."""
    for scenario in scenarios:
        for label in [*scenario.options, *scenario.skip]:
            if label not in {m.label for m in methods}:
                raise ConfigError(
                    f"{where}: scenarios.{scenario.name}: {label!r} is not a method of the suite"
                )


def check(suite: Suite) -> None:
    """Build every configuration the bench would run — each scenario with each method, each
    searched key at both ends of its range (every choice) — and refuse the first that fails,
    in one line naming the scenario, the method and the key."""
    _known_labels(suite.scenarios, suite.methods, suite.path)
    for scenario, method in suite.pairs():
        label = f"{suite.path}: scenario {scenario.name}, method {method.label}"
        probes: list[tuple[str, dict, list]] = [("", {}, suite.seeds)]  # every seed of the test runs
        probes += [(f"{p.key} = {v!r}", {p.key: v}, suite.seeds[:1]) for p in method.params for v in p.ends()]
        for what, values, seeds in probes:
            try:
                from_dict(suite.config(scenario, method, values, "check"))
                for seed in seeds:
                    from_dict(suite.config(scenario, method, values, "check", seed=seed))
            except ConfigError as exc:
                text = str(exc)
                if text.startswith(suite.path):
                    raise
                if not what and any(text.startswith(key) for key in scenario.settings):
                    label = f"{suite.path}: scenarios.{scenario.name}"  # the scenario's own setting
                raise ConfigError(f"{label}{': ' + what if what else ''}: {text}") from None
