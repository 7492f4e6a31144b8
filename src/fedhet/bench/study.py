"""One method tuned in one scenario: an Optuna study whose trials run in their order, each
drawn by a sampler seeded with the trial's index, so that a study gives the same trials
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

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.bench.suite import Method, Scenario, Suite
from fedhet.errors import ConfigError, FedhetError

INTERRUPTED = "interrupted"


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

    def done(self, trials: int) -> bool:
        return bool(self.stopped) or self.counted >= trials


def _space(suite: Suite, method: Method):
    from fedhet.studies.tune import SearchSpace

    return SearchSpace(objective=suite.objective, direction=suite.direction, pruner=suite.pruner,  # type: ignore[arg-type]
                       startup_trials=suite.startup_trials, warmup_steps=suite.warmup_steps,
                       params=method.params, path=suite.path)  # fmt: skip


def open_study(suite: Suite, scenario: Scenario, method: Method, storage: str):
    """The study (created, or loaded to resume). Its first creation stores the settings it
    tunes; a later bench with other settings for it is refused in one line."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = _space(suite, method)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=space.startup_trials, n_warmup_steps=space.warmup_steps)
        if space.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    name = suite.study_name(scenario, method)
    study = optuna.create_study(study_name=name, storage=storage, direction=space.direction, pruner=pruner,
                                load_if_exists=True)  # fmt: skip
    settings = json.loads(json.dumps(_settings(suite, scenario, method), default=str))
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


def _settings(suite: Suite, scenario: Scenario, method: Method) -> dict:
    """What a study's trials depend on: the trial configuration without searched values,
    the searched ranges, the objective and the sampler."""
    return {
        "config": suite.config(scenario, method, {}, "trial"),
        "params": {p.key: p.describe() for p in method.params},
        "objective": suite.objective,
        "sampler": {"seed": suite.sampler_seed, "random_trials": suite.random_trials},
        "pruner": [suite.pruner, suite.startup_trials, suite.warmup_steps],
    }


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    return f"{where}: {a!r} then, {b!r} now"


def requeue_interrupted(study) -> None:
    """Trials a kill left RUNNING: marked failed and interrupted, their values queued again."""
    from optuna.trial import TrialState

    storage = study._storage
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


def status(study, trials: int) -> StudyResult:
    """The study as it stands (read from its storage)."""
    from optuna.trial import TrialState

    result = StudyResult(study.study_name, stopped=study.user_attrs.get("stopped", ""),
                         not_applicable=study.user_attrs.get("not_applicable", ""))  # fmt: skip
    finite = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            result.counted += 1
        elif trial.state == TrialState.FAIL and not trial.user_attrs.get(INTERRUPTED):
            result.failed += 1
        if trial.state == TrialState.COMPLETE and trial.value is not None and math.isfinite(trial.value):
            finite.append(trial)
    if finite:
        pick = max if study.direction.name == "MAXIMIZE" else min
        best = pick(finite, key=lambda t: (t.value, -t.number) if pick is max else (t.value, t.number))
        result.best_params, result.best_value, result.best_trial = dict(best.params), best.value, best.number
    return result


def _index(study) -> int:
    """The next trial's index: trials so far, less those a kill interrupted."""
    return sum(1 for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(INTERRUPTED))


def run_study(suite: Suite, scenario: Scenario, method: Method, storage: str, out: str) -> StudyResult:
    """Run the study's remaining trials (in this process, one after another); return where
    it stands. Each trial is a run folder ``<out>/<scenario>/<method>/trial-<n>``."""
    import optuna
    from optuna.trial import TrialState

    from fedhet.studies.tune import failure_reason

    study = open_study(suite, scenario, method, storage)
    requeue_interrupted(study)
    if study.user_attrs.get("stopped"):  # run again: it may have been fixed
        study.set_user_attr("stopped", "")
        study.set_user_attr("not_applicable", "")
    space = _space(suite, method)
    failures, reason = 0, ""
    while status(study, suite.trials).counted < suite.trials:
        index = _index(study)
        study.sampler = optuna.samplers.TPESampler(seed=suite.sampler_seed * 100_003 + index,
                                                   n_startup_trials=suite.random_trials)  # fmt: skip
        trial = study.ask()
        try:
            value = _run_trial(trial, suite, scenario, method, space, Path(out))
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
            failures = 0
            continue
        except Exception as exc:  # noqa: BLE001  (the trial fails with its reason; K in a row stop)
            reason = failure_reason(exc)
            trial.set_user_attr("error", reason)
            study.tell(trial, state=TrialState.FAIL)
            if isinstance(exc, ConfigError) and status(study, suite.trials).counted == 0:
                study.set_user_attr("not_applicable", reason)
                study.set_user_attr("stopped", f"does not run in this scenario: {reason}")
                break
            failures += 1
            if failures >= suite.max_failures:
                study.set_user_attr("stopped", f"{failures} trials in a row failed; the last: {reason}")
                break
            continue
        study.tell(trial, value)
        failures = 0
    return status(study, suite.trials)


def _run_trial(trial, suite: Suite, scenario: Scenario, method: Method, space, out: Path) -> float:
    import optuna

    from fedhet.config import from_dict
    from fedhet.engine.launch import run
    from fedhet.studies.tune import TrialPruning, objective_value

    values = {p.key: p.suggest(trial) for p in method.params}
    folder = out / scenario.name / method.label / f"trial-{trial.number}"
    name = f"{scenario.name}-{method.label}-trial-{trial.number}"
    config = from_dict(suite.config(scenario, method, values, name))
    trial.set_user_attr("run_folder", str(folder))
    pruning = TrialPruning(trial, space)
    summary = run(config, folder, overwrite=True, group=f"bench-{suite.name}", callbacks=[pruning]).summary
    if pruning.pruned:
        raise optuna.TrialPruned(pruning.pruned)
    if summary.get("stopped_by") == "non_finite":  # diverged: the worst outcome
        trial.set_user_attr("diverged", True)
        return 0.0 if suite.direction == "maximize" else math.inf
    value = objective_value(summary, space)
    if math.isnan(value):
        raise FedhetError(f"the run has no {suite.objective} (no evaluation?)")
    return value
