"""One method tuned in one scenario: an Optuna study run by the one trial runner
(:mod:`fedhet.studies.trials`), whose trials run in their order, each drawn by a sampler
seeded with the trial's index, so that a study gives the same trials
however the bench is parallelised and however often it was interrupted.

A trial's index is the number of trials before it that were not interrupted; a trial that
a kill interrupted (left RUNNING) is marked failed and ``interrupted``, and its values run
again as the next trial. The tuning trials are judged on the validation split
(``suite.validation_fraction``); a run that diverged scores the worst value, a failed run
does not count and ``suite.max_failures`` failures in a row stop the study with the last
one's reason. A configuration error before any trial finished (the method refuses the
scenario: ADEL-FL without its exponential time model) stops the study at once: the method
does not apply there, and the leaderboard says why.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.bench.suite import Method, Suite, Tuning
from fedhet.config import from_dict
from fedhet.errors import FedhetError
from fedhet.studies.trials import interrupted


@dataclass
class StudyResult:
    """Where a study stands: trials counted (finished or pruned), failed, the best trial's
    values and validation value, and why it stopped (empty when it did not)."""

    name: str
    counted: int = 0
    failed: int = 0
    best_params: dict[str, Any] = field(default_factory=dict)
    best_value: float | None = None
    best_trial: int | None = None
    stopped: str = ""
    not_applicable: str = ""  # the method refuses the scenario's settings (why)
    values: list[float | None] = field(default_factory=list)  # each counted trial's validation value
    # (None: pruned or not finite), in the order they were run

    def done(self, trials: int) -> bool:
        return bool(self.stopped) or self.counted >= trials


def _space(suite: Suite, params: list):
    from fedhet.studies.trials import SearchSpace

    return SearchSpace(objective=suite.objective, direction=suite.direction, pruner=suite.pruner,  # type: ignore[arg-type]
                       startup_trials=suite.startup_trials, warmup_steps=suite.warmup_steps,
                       params=params, path=suite.path)  # fmt: skip


def open_study(suite: Suite, tuning: Tuning, storage: str, prefix: str = ""):
    """The tuning's study (created, or loaded to resume), named ``prefix`` + its name. Its
    first creation stores the settings it tunes; a later bench with other settings for it
    is refused in one line."""
    from fedhet.studies import trials

    name = prefix + suite.study_name(tuning.scenario, tuning.method, tuning.repeat)
    study = trials.open_study(name, storage, _space(suite, suite.params_for(tuning.scenario, tuning.method)))
    settings = settings_of(suite, tuning)
    stored = study.user_attrs.get("settings")
    if stored is None:
        study.set_user_attr("settings", settings)
    elif stored != settings:
        changed = _first_difference(stored, settings)
        raise FedhetError(
            f"study {name}: its trials were run with other settings ({changed}); bench into another "
            "--out folder, or delete this one to start again"
        )
    return study


@functools.lru_cache(maxsize=256)
def _class_fingerprint(name: str, label: str) -> str:
    import hashlib
    import inspect
    import sys

    from fedhet.build import source_fingerprint
    from fedhet.registry import resolve

    cls = resolve("algorithm", name, f"method {label}").cls
    digest = hashlib.sha256(source_fingerprint().encode())
    own = [klass.__module__ for klass in cls.__mro__ if klass is not object]
    for module in dict.fromkeys([*own, *_helper_modules(cls.__module__)]):
        try:
            digest.update(inspect.getsource(sys.modules[module]).encode())
        except (OSError, TypeError, KeyError):  # no source to read (a compiled module)
            digest.update(module.encode())
    return digest.hexdigest()[:16]


def _helper_modules(module_name: str) -> list[str]:
    """The loaded modules of the package (or, for a module of its own, the folder) that a
    plug-in's class comes from: the helpers its module imports count in its fingerprint.
    fedhet's own modules are in :func:`fedhet.build.source_fingerprint` already; a module
    alone in site-packages brings no neighbours."""
    import sys

    module = sys.modules.get(module_name)
    top = module_name.split(".")[0]
    if module is None or top == "fedhet" or not getattr(module, "__file__", None):
        return []
    package = sys.modules.get(top)
    root_file = getattr(package, "__file__", None) if module_name != top else module.__file__
    if not root_file:
        return []
    root = Path(root_file).resolve().parent
    if module_name == top and root.name in ("site-packages", "dist-packages"):
        return []
    found = []
    for name, loaded in list(sys.modules.items()):
        file = getattr(loaded, "__file__", None)
        if file and not name.startswith("fedhet") and Path(file).resolve().is_relative_to(root):
            found.append(name)
    return sorted(found)


def code_fingerprint(method: Method) -> str:
    """A short hash of the code a method runs: the source of every module of its algorithm
    class's bases (its own module first), the other loaded modules of a plug-in's package
    (its helpers: :func:`_helper_modules`) and fedhet's sources
    (:func:`fedhet.build.source_fingerprint`). A re-run whose fingerprint differs tunes and
    runs the method again; ``--against`` merges only rows of the same fingerprint. Read once
    per process (a bench reads it when it starts)."""
    return _class_fingerprint(method.name, method.label)


def located_nowhere(config: dict) -> dict:
    """``config`` with each file or folder of a path key (:func:`fedhet.config.path_keys`)
    named by what it holds, not where it is: a file by its name and the SHA-256 of its
    bytes, a folder by its name. A study's identity then does not change when the suite is
    named by another path, the bench resumed from another folder or the clone moved, and
    does change when a file it reads is edited."""
    import hashlib

    from fedhet.config import path_keys

    out = dict(config)
    for section, names in path_keys().items():
        table = out.get(section)
        if not isinstance(table, dict):
            continue
        out[section] = dict(table)
        for key in names & set(table):
            value = table[key]
            path = Path(str(value)).expanduser() if isinstance(value, str) and value else None
            if path is not None and path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
                out[section][key] = f"file {path.name} sha256:{digest}"
            elif path is not None and path.is_dir():
                out[section][key] = f"folder {path.name}"
    return out


def sampler_seed(suite: Suite, tuning: Tuning) -> int:
    """The seed of a tuning's sampler: ``suite.sampler_seed + repeat - 1`` mixed with the
    method's label, so that the tunings of different methods are independent draws (with one
    seed for all, most methods' first trials took the same shared values, and a test over
    tunings counted correlated tunings as independent); the same for a method's tuning on
    every machine and build. Each trial's sampler adds its index (:func:`run_study`)."""
    import zlib

    base = suite.sampler_seed + tuning.repeat - 1
    return (base * 100_003 + zlib.crc32(tuning.method.label.encode()) * 1_009) % 2**32


def settings_of(suite: Suite, tuning: Tuning) -> dict:
    """What a study's trials depend on: the trial configuration without searched values
    (its files named by content, :func:`located_nowhere`), the searched ranges, the
    objective, the trial budget and the sampler (as JSON values)."""
    seed = sampler_seed(suite, tuning)
    settings = {
        "config": located_nowhere(suite.config(tuning.scenario, tuning.method, {}, "trial")),
        "params": {p.key: p.describe() for p in suite.params_for(tuning.scenario, tuning.method)},
        "objective": suite.objective,
        "sampler": {"seed": seed, "random_trials": suite.random_trials},
        "pruner": [suite.pruner, suite.startup_trials, suite.warmup_steps],
    }
    return json.loads(json.dumps(settings, default=str))


def settings_fingerprint(suite: Suite, scenario, method: Method) -> str:
    """A short hash of what a method's rows depend on besides its code: every tuning's study
    settings, the trial budget and the seeds the tuned settings run on."""
    import hashlib

    studies = [settings_of(suite, Tuning(scenario, method, r)) for r in range(1, suite.tuning_repeats + 1)]
    for study in studies:
        study["config"]["run"].pop("name", None)
    seed_runs = located_nowhere(suite.config(scenario, method, {}, "seed", seed=suite.seeds[0]))
    seed_runs["run"].pop("name", None)
    seed_runs["run"].pop("seed", None)
    what = {"studies": studies, "trials": suite.trials, "seeds": suite.seeds, "seed_runs": seed_runs,
            "max_failures": suite.max_failures}  # fmt: skip
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    return f"{where}: {a!r} then, {b!r} now"


def status(study, trials: int) -> StudyResult:
    """The study as it stands (read from its storage)."""
    from optuna.trial import TrialState

    result = StudyResult(study.study_name, stopped=study.user_attrs.get("stopped", ""),
                         not_applicable=study.user_attrs.get("not_applicable", ""))  # fmt: skip
    finite, killed = [], interrupted(study)
    for trial in study.get_trials(deepcopy=False):
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            result.counted += 1
        elif trial.state == TrialState.FAIL and trial.number not in killed:
            result.failed += 1
        if trial.state == TrialState.COMPLETE and trial.value is not None and math.isfinite(trial.value):
            finite.append(trial)
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):  # the trials the budget counts
            result.values.append(trial.value if finite and finite[-1] is trial else None)
    if finite:
        pick = max if study.direction.name == "MAXIMIZE" else min
        best = pick(finite, key=lambda t: (t.value, -t.number) if pick is max else (t.value, t.number))
        result.best_params, result.best_value, result.best_trial = dict(best.params), best.value, best.number
    return result


def _index(study) -> int:
    """The next trial's index: trials so far, less those a kill interrupted."""
    return len(study.get_trials(deepcopy=False)) - len(interrupted(study))


def _tuner(suite: Suite, tuning: Tuning, storage: str, out: str, prefix: str):
    """The tuning's study opened (trials a kill interrupted queued again, a stop lifted: it
    may have been fixed) with its trials' makings; each trial a run folder
    ``<out>/<scenario>/<method>[/tuning-r]/trial-<n>``."""
    import optuna

    from fedhet.studies.trials import requeue_interrupted

    scenario, method = tuning.scenario, tuning.method
    study = open_study(suite, tuning, storage, prefix)
    requeue_interrupted(study, frozenset(p.key for p in suite.params_for(scenario, method)))
    if study.user_attrs.get("stopped"):  # run again: it may have been fixed
        study.set_user_attr("stopped", "")
        study.set_user_attr("not_applicable", "")
    params = suite.params_for(scenario, method)  # less the knobs of mechanisms inert here

    def make_run(values: dict, number: int):
        name = tuning.run_name(f"trial-{number}")
        folder = tuning.folder(Path(out)) / f"trial-{number}"
        return from_dict(suite.config(scenario, method, values, name)), folder

    seed = sampler_seed(suite, tuning)

    def sampler_for(study):
        return optuna.samplers.TPESampler(seed=(seed + _index(study)) % 2**32,
                                          n_startup_trials=suite.random_trials)  # fmt: skip

    from fedhet.studies.trials import StudyTrials

    remaining = suite.trials - status(study, suite.trials).counted
    return StudyTrials(study, remaining, params, _space(suite, params), make_run, sampler_for)


def _finished(study, end, suite: Suite) -> StudyResult:
    """Where the study stands after its trial loop ended as ``end`` says (a method that
    does not apply, or too many failures in a row, recorded on the study)."""
    if end.not_applicable:
        study.set_user_attr("not_applicable", end.not_applicable)
        study.set_user_attr("stopped", f"does not run in this scenario: {end.not_applicable}")
    elif end.stopped(suite.max_failures):
        study.set_user_attr(
            "stopped", f"{end.failed_in_a_row} trials in a row failed; the last: {end.reason}"
        )
    return status(study, suite.trials)


def run_study(suite: Suite, tuning: Tuning, storage: str, out: str, prefix: str = "") -> StudyResult:
    """Run the tuning's remaining trials (in this process, one after another, each sampler
    seeded by the repeat's seed and the trial's index); return where it stands."""
    from fedhet.studies.trials import run_trial, run_trials

    tuner, group = _tuner(suite, tuning, storage, out, prefix), f"bench-{suite.name}"
    end = run_trials(tuner.study, tuner.trials,
                     lambda trial: run_trial(trial, tuner.params, tuner.space, tuner.make_run, group),
                     suite.max_failures, sampler_for=tuner.sampler_for, config_error_stops=True)  # fmt: skip
    return _finished(tuner.study, end, suite)


def run_studies_together(suite: Suite, tunings: list[Tuning], storage: str, out: str,
                         prefix: str = "") -> list[StudyResult]:  # fmt: skip
    """Run the remaining trials of several tunings of one method and scenario (its repeats)
    with the k-th trial of each in lockstep, as one computation
    (:func:`fedhet.engine.launch.run_together`): each study asks, is told and stops as
    :func:`run_study` would (the same samplers, so the same values for the same outcomes);
    the runs differ from runs alone only in the rounding of a bigger group. Trials are not
    pruned here (the bench does this with ``suite.pruner = "none"`` only)."""
    from fedhet.engine.cohort import CohortRun
    from fedhet.engine.launch import run_together
    from fedhet.studies.trials import run_trials_together

    def run_many(runs: list) -> list:
        results = run_together([CohortRun(config, folder) for config, folder in runs], f"bench-{suite.name}")
        return [r if isinstance(r, BaseException) else r.summary for r in results]

    loops = [_tuner(suite, t, storage, out, prefix) for t in tunings]
    run_trials_together(loops, run_many, suite.max_failures, config_error_stops=True)
    return [_finished(loop.study, loop.end, suite) for loop in loops]
