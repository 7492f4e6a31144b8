"""``fedhet tune``: hyperparameter search on Optuna, each trial a normal fedhet run.

A search space file (TOML)::

    [objective]
    value = "final_test_accuracy"   # a summary number, or "time_to:0.8" (simulated time to reach it)
    direction = "maximize"          # or "minimize"

    [sampler]
    name = "tpe"                    # tpe (default) | random
    seed = 1

    [pruner]
    name = "median"                 # median (default) | none
    startup_trials = 3              # trials that are never pruned
    warmup_steps = 0                # rounds before a run can be pruned

    [params]                        # every algorithm
    "train.lr" = { low = 0.001, high = 0.5, log = true }
    "train.local_steps" = { low = 1, high = 5, int = true }
    "train.batch_size" = { choices = [8, 16, 32] }

    [algorithm_params.fedprox]      # one algorithm's own keys, for a [compare] configuration
    "algorithm.mu" = { low = 0.0001, high = 1.0, log = true }

Each trial runs the configuration with its sampled values in ``<out>/<study>/trial-<n>``
(a run folder like any other). The median pruner gets every evaluation of a run
(``run.eval_every``, ``run.eval_interval``) for objectives that are accuracies or losses;
a pruned run stops at once and its folder says so (``pruned.json``). A run that stops on a
non-finite value (diverged) scores the worst value (accuracy 0, or infinity when
minimising). A
``[compare]`` configuration gives one study per algorithm. The studies live in a real
database: SQLite ``<out>/study.db`` by default, or any Optuna storage URL (``--storage``).
An interrupted tune resumes its studies: finished and pruned trials count, and a trial a
kill interrupted is run again with the same values. ``--jobs J`` runs trials in J
processes that share the storage and the machine's cores. The best trial of each study is
written as a runnable ``best.toml`` (the configuration with its values; a validation split,
``data.validation_fraction``, is removed so it runs on the test set). ``fedhet report
<out>`` shows the trials, the optimisation history and Optuna's parameter importances.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path

from fedhet.config import apply_overrides, from_dict, read_toml
from fedhet.data.task import check_objective
from fedhet.errors import ConfigError, FedhetError
from fedhet.run_schema import objective_direction
from fedhet.search_space import parse_param
from fedhet.studies.trials import (  # noqa: F401  (objective_value, TrialPruning: this module's API too)
    PRUNED_FILE,
    SearchSpace,
    TrialPruning,
    check_objective_metric,
    counted,
    failure_reason,
    objective_value,
    open_study,
    rdb_storage,
    requeue_interrupted,
    run_trial,
    run_trials,
    storage_url,
)

log = logging.getLogger("fedhet")


def check_space(space: SearchSpace, studies: list[tuple[str | None, dict]]) -> None:
    """Every key of the space, at both ends of its range (every choice), accepted by each
    study's configuration before trial 0; refused in one line naming the key (and, for a
    ``[compare]``, the algorithm) otherwise. ``[algorithm_params.X]`` must name an algorithm
    being tuned."""
    names = [algorithm or raw.get("algorithm", {}).get("name", "salf") for algorithm, raw in studies]
    for name in space.per_algorithm:
        if name not in names:
            raise ConfigError(
                f"{space.path}: [algorithm_params.{name}]: {name!r} is not an algorithm tuned here "
                f"(tuned: {', '.join(map(str, names))})"
            )
    for (algorithm, raw), name in zip(studies, names, strict=True):
        for param in space.params_for(name):
            for value in space.values_to_check(param):
                try:
                    from_dict(_trial_config(raw, {param.key: value}, 0, "check"))
                except ConfigError as exc:
                    shared = param in space.params
                    where = f"params.{param.key!r}" if shared else f"algorithm_params.{name}.{param.key!r}"
                    hint = ""
                    if shared and algorithm is not None and param.key.startswith("algorithm."):
                        hint = "; an option of some algorithms only goes under [algorithm_params.<name>]"
                    study = f" (algorithm {name})" if algorithm is not None else ""
                    raise ConfigError(f"{space.path}: {where} = {value!r}{study}: {exc}{hint}") from None


def load_space(path: str | Path) -> SearchSpace:
    """Read and check a search space file; errors name the file and the key."""
    raw = read_toml(path)
    known = {"objective", "sampler", "pruner", "params", "algorithm_params"}
    for section in raw:
        if section not in known:
            raise ConfigError(f"{path}: [{section}]: unknown section (known: {', '.join(sorted(known))})")
    space = SearchSpace(path=str(path))
    objective = raw.get("objective", {})
    space.objective = objective.get("value", space.objective)
    space.direction_given = "direction" in objective
    space.direction = objective.get("direction", objective_direction(str(space.objective)))
    if space.direction not in ("maximize", "minimize"):
        raise ConfigError(f"{path}: objective.direction = {space.direction!r}: maximize or minimize")
    if space.objective.startswith("time_to:"):
        try:
            target = space.target
        except ValueError:
            raise ConfigError(f"{path}: objective.value = {space.objective!r}: time_to:ACCURACY") from None
        if target is None or not 0 < target <= 1:
            raise ConfigError(f"{path}: objective.value = {space.objective!r}: an accuracy in (0, 1]")
    else:
        check_objective(f"{path}: objective.value", space.objective)
    sampler = raw.get("sampler", {})
    space.sampler, space.seed = sampler.get("name", "tpe"), sampler.get("seed")
    if space.sampler not in ("tpe", "random"):
        raise ConfigError(f"{path}: sampler.name = {space.sampler!r}: tpe or random")
    pruner = raw.get("pruner", {})
    space.pruner = pruner.get("name", "median")
    if space.pruner not in ("median", "none"):
        raise ConfigError(f"{path}: pruner.name = {space.pruner!r}: median or none")
    space.startup_trials = pruner.get("startup_trials", 3)
    space.warmup_steps = pruner.get("warmup_steps", 0)
    space.params = [parse_param(k, v, f"{path}: params") for k, v in raw.get("params", {}).items()]
    for algorithm, table in raw.get("algorithm_params", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: algorithm_params.{algorithm}: expected a table of keys")
        space.per_algorithm[algorithm] = [
            parse_param(k, v, f"{path}: algorithm_params.{algorithm}") for k, v in table.items()
        ]
    if not space.params and not space.per_algorithm:
        raise ConfigError(f"{path}: [params] is empty: nothing to search")
    return space


def _study_name(base_name: str, algorithm: str | None) -> str:
    return base_name if algorithm is None else f"{base_name}-{algorithm}"


def _storage_url(out: Path, storage: str | None) -> str:
    """The storage URL: ``storage``, or SQLite ``<out>/study.db`` made whole before use."""
    return storage_url(out / "study.db", storage)


def _studies(config_path: str | Path, overrides: list[str]) -> list[tuple[str | None, dict]]:
    """(algorithm or None, raw configuration) per study: one per algorithm of a [compare]."""
    raw = apply_overrides(read_toml(config_path), overrides)
    algorithms = raw.get("compare", {}).get("algorithms", [])
    if not algorithms:
        from_dict(raw)  # one-line errors now, before any trial
        return [(None, raw)]
    out = []
    base = {k: v for k, v in raw.items() if k not in ("compare", "algorithm")}
    given = raw.get("algorithm", {})
    for name in algorithms:
        options = {k: v for k, v in given.items() if k != "name"} if given.get("name") == name else {}
        cell = {**base, "algorithm": {"name": name, **options}}
        from_dict(cell)
        out.append((name, cell))
    return out


def _trial_config(raw: dict, values: dict, trial_number: int, study: str) -> dict:
    import tomli_w

    texts = [f"{key}={tomli_w.dumps({'v': value})[4:].strip()}" for key, value in values.items()]
    texts.append(f'run.name="{study}-trial-{trial_number}"')
    return apply_overrides(raw, texts)


def _prepare(storage: str, study_name: str, space: SearchSpace, salt: int = 0):
    """The study (created, or loaded to resume). The sampler's seed is ``seed + salt``:
    parallel workers and resumed tunes salt it (worker index, trials already held) so that
    they do not propose the points proposed before."""
    import optuna

    seed = None if space.seed is None else space.seed + salt
    sampler = (
        optuna.samplers.TPESampler(seed=seed)
        if space.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    return open_study(study_name, storage, space, sampler)


class StudyStopped(FedhetError):
    """A study stopped by failed trials in a row (the message says why)."""


def _worker(storage: str, study_name: str, space: SearchSpace, raw: dict, algorithm: str | None,
            out: str, trials: int, worker: int = 0, max_failures: int = 3,
            on_trial: Callable[[str, bool], None] | None = None) -> None:  # fmt: skip
    """Run trials of one study until ``trials`` of them finished or were pruned (failed
    ones, e.g. a run that diverged, do not count and are replaced); ``max_failures`` failed
    trials in a row stop the study with the last one's reason. ``on_trial`` gets one line
    per finished trial and whether it counts (finished or pruned; default: the log)."""
    held = len(_prepare(storage, study_name, space).get_trials(deepcopy=False))
    study = _prepare(storage, study_name, space, worker + 1000 * held)
    params = space.params_for(algorithm or raw.get("algorithm", {}).get("name", ""))

    def make_run(values: dict, number: int):
        config = from_dict(_trial_config(raw, values, number, study_name))
        return config, Path(out) / study_name / f"trial-{number}"

    end = run_trials(study, trials, lambda trial: run_trial(trial, params, space, make_run, study_name),
                     max_failures, on_trial=on_trial or _log_line)  # fmt: skip
    if end.stopped(max_failures):
        raise StudyStopped(
            f"study {study_name}: {end.failed_in_a_row} trials in a row failed, the study stops; "
            f"the last: {end.reason}"
        )


def _log_line(line: str, counts: bool) -> None:
    """A trial's line in the log (failed trials as warnings)."""
    (log.info if counts else log.warning)("%s", line)


def _stderr_line(line: str, counts: bool) -> None:
    """A trial's line on stderr (worker processes of ``--jobs``)."""
    print(line, file=sys.stderr, flush=True)


def tune(
    config_path: str | Path,
    space_path: str | Path,
    trials: int,
    out: str | Path,
    jobs: int = 1,
    storage: str | None = None,
    overrides: list[str] | None = None,
    max_failures: int = 3,
    allow_test_set: bool = False,
    on_trial: Callable[[str, bool], None] | None = None,
    ray: str | None = None,
) -> list[dict]:
    """Run (or resume) the studies; return, per study, its best trial and where it was
    written (``best.toml``). Before trial 0 the space is checked against every study
    (:func:`check_space`), the engines against ``jobs``, and a configuration without a
    validation split is refused unless ``allow_test_set``; ``max_failures`` failed trials in
    a row stop a study; ``on_trial`` gets one line per finished trial; ``ray`` (``"local"``
    or a cluster address) runs the trial workers as Ray tasks (the storage must be one every
    node reaches)."""
    from fedhet.results import make_folder

    _require_optuna()
    if max_failures < 1:
        raise FedhetError(f"--max-failures {max_failures}: must be >= 1")
    space, studies = load_space(space_path), _studies(config_path, overrides or [])
    out = Path(out)
    make_folder(out, "tune folder")
    url, base_name = _storage_url(out, storage), Path(config_path).stem
    results: list[dict] = []
    _check_before_trials(space, studies, jobs, ray, config_path, allow_test_set)
    for algorithm, raw in studies:
        name = _study_name(base_name, algorithm)
        study = _prepare(url, name, space)
        for number in requeue_interrupted(study):
            log.warning("%s: trial %d was interrupted; it runs again", name, number)
        make_folder(out / name, "study folder")
        remaining = max(0, trials - counted(study))
        try:
            _run_study(url, name, space, raw, algorithm, out, remaining, jobs, max_failures, on_trial, ray)
        except StudyStopped as stopped:  # the report shows the study and its trials' reasons
            results.append({"study": name, "stopped": str(stopped), "best_trial": None, "value": None})
            _write_summary(out, url, results)
            raise
        results.append(_write_best(study, name, raw, out, space))
    _write_summary(out, url, results)
    return results


def _check_before_trials(
    space, studies, jobs: int, ray: str | None, config_path, allow_test_set: bool
) -> None:
    """What tune refuses before trial 0: the space against every study, the engines against
    ``jobs``/``ray``, a study judged on the test set, an objective the task does not report."""
    check_space(space, studies)
    _check_engines(studies, jobs, ray)
    _check_validation(studies, config_path, allow_test_set)
    labelled = [(f"{config_path}: study {algorithm or 'tune'}", from_dict(raw)) for algorithm, raw in studies]
    task = check_objective_metric(space.objective, labelled)
    if not space.direction_given:  # the task says which way its metrics go (a plug-in's F1 up)
        space.direction = objective_direction(str(space.objective), task)


def _require_optuna() -> None:
    try:
        import optuna
    except ImportError:
        raise FedhetError("fedhet tune needs Optuna: pip install 'fedhet[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _write_summary(out: Path, storage_url: str, results: list[dict]) -> None:
    (out / "tune.json").write_text(json.dumps({"storage": storage_url, "studies": results}, indent=2))


def _run_study(
    storage_url, name, space, raw, algorithm, out, remaining, jobs, max_failures, on_trial, ray=None
) -> None:
    """The ``remaining`` trials of one study, here or in ``jobs`` processes (here when one
    process would run them all: a process of its own would only add its start)."""
    if remaining and ray is None and min(jobs, remaining) <= 1:
        _worker(storage_url, name, space, raw, algorithm, str(out), remaining, 0, max_failures, on_trial)
    elif remaining:
        _parallel(storage_url, name, space, raw, algorithm, str(out), remaining, jobs, max_failures,
                  on_trial is not None, ray)  # fmt: skip


def _check_engines(studies: list[tuple[str | None, dict]], jobs: int, ray: str | None = None) -> None:
    """Every study's engine accepts its configuration, ``--jobs`` and ``--ray``, before trial 0."""
    from fedhet.engine.launch import check_placement

    configs = [(f"study {algorithm or 'tune'}", from_dict(raw)) for algorithm, raw in studies]
    check_placement(configs, parallel=jobs > 1, ray=ray is not None, command="tune")


def _check_validation(studies: list[tuple[str | None, dict]], path, allow_test_set: bool) -> None:
    """Tuning judges trials on a validation split; on the test set only when asked."""
    if allow_test_set:
        return
    for _, raw in studies:
        if not from_dict(raw).data.validation_fraction:
            raise ConfigError(
                f"{path}: data.validation_fraction is not set, so the trials would be judged on the "
                "test set; set data.validation_fraction = 0.2 (a validation split of the training "
                "examples; best.toml drops it) or pass --allow-test-set"
            )


def _parallel(storage, name, space, raw, algorithm, out, trials, jobs, max_failures=3, lines=False,
              ray=None) -> None:  # fmt: skip
    """``jobs`` processes (or Ray tasks) sharing the storage, the ``trials`` split between
    them; each gets its share of the free cores (and prints its trials' lines on stderr with
    ``lines``)."""
    from fedhet.studies.executor import Executor, task_error

    jobs = min(jobs, trials)
    shares = [trials // jobs + (1 if i < trials % jobs else 0) for i in range(jobs)]
    with Executor(jobs, ray) as executor:
        futures = [
            executor.submit(
                _worker,
                storage,
                name,
                space,
                raw,
                algorithm,
                out,
                share,
                index,
                max_failures,
                _stderr_line if lines else None,
            )  # fmt: skip
            for index, share in enumerate(shares)
        ]
        for future in futures:
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001  (a Ray task wraps the study's stop)
                raise task_error(exc) from None


def _write_best(study, name: str, raw: dict, out: Path, space: SearchSpace) -> dict:
    import tomli_w
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    finite = [t for t in done if t.value is not None and math.isfinite(t.value)]
    if not finite:
        raise FedhetError(f"study {name}: no trial finished with a value; nothing to write")
    best = study.best_trial
    document = _trial_config(raw, best.params, best.number, name)
    document["run"]["name"] = f"{name}-best"
    document.get("data", {}).pop("validation_fraction", None)  # the tuned setting, on the test set
    path = out / name / "best.toml"
    path.write_text(
        f"# best of {len(done)} trials of study {name!r}: {space.objective} = {best.value:.6g} "
        f"(trial {best.number})\n" + tomli_w.dumps(document)
    )
    states = [t.state for t in study.get_trials(deepcopy=False)]
    return {"study": name, "best_trial": best.number, "value": best.value, "params": best.params,
            "best_toml": str(path), "finished": states.count(TrialState.COMPLETE),
            "pruned": states.count(TrialState.PRUNED), "failed": states.count(TrialState.FAIL)}  # fmt: skip


def read_trials(storage: str, study_name: str) -> list[dict]:
    """The trials of a study as rows (number, state, value, params), for reports."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=rdb_storage(storage))
    return [
        {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "error": t.user_attrs.get("error", ""),
            **{f"param {k}": v for k, v in t.params.items()},
        }
        for t in study.get_trials(deepcopy=False)
    ]
