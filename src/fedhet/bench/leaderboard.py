"""A bench's leaderboard: per scenario, each method's final test accuracy over the seeds
(mean with a 95% Student-t interval, the seed count stated), its simulated time to the
suite's target accuracy, its rank, and a paired t-test against the scenario's best method
over the seeds both ran, Holm-corrected within the scenario; across scenarios, each
method's mean rank and wins. Written as ``leaderboard.md``, ``leaderboard.csv`` and a
self-contained ``leaderboard.html`` with figures (test accuracy against simulated time per
scenario, a heat-map of the ranks).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.bench.aggregate import Friedman, detectable_difference, friedman, pooled_sd
from fedhet.bench.budget import budget_sentence
from fedhet.bench.model import Interval
from fedhet.checks import counted
from fedhet.data.task import Score
from fedhet.studies.stats import difference_p_value, holm

CSV_COLUMNS = (
    "scenario",
    "method",
    "status",
    "rank",
    "mean_accuracy",
    "ci_low",
    "ci_high",
    "tunings",
    "seeds",
    "accuracy_by_seed",
    "time_by_seed",
    "end_by_seed",
    "energy_by_seed",
    "mean_energy",
    "bytes_by_seed",
    "mean_bytes",
    "time_to_target",
    "target_reached",
    "p_vs_best",
    "p_holm",
    "worse_than_best",
    "vs_best",
    "vs_best_low",
    "vs_best_high",
    "reference",
    "vs_reference",
    "vs_reference_low",
    "vs_reference_high",
    "p_vs_reference",
    "p_holm_reference",
    "validation_value",
    "validation_by_trial",
    "tuned",
    "own_knobs",
    "reason",
    "caveats",
    "planner_knowledge",
    "fedhet",
    "failed_trials",
    "code",
    "settings",
    "canary",
    "higher_is_better",
)  # fmt: skip  (a classification's; another score names its own: mean_rmse, rmse_by_seed)
"""leaderboard.csv: per seed, ``seed:value`` (``tuning/seed:value`` when tuned more than
once); ``tuned`` the tuned values (a list, one per tuning, when more than once);
``own_knobs`` the searched keys beyond the suite's shared ones; ``code``, ``settings`` and
``canary`` the fingerprints that ``--against`` checks (:mod:`fedhet.bench.canary`)."""


def csv_columns(score: Score) -> tuple[str, ...]:
    """leaderboard.csv's columns for the suite's score."""
    rename = {"mean_accuracy": f"mean_{score.metric}", "accuracy_by_seed": f"{score.metric}_by_seed"}
    return tuple(rename.get(column, column) for column in CSV_COLUMNS)


@dataclass
class Tuned:
    """One tuning of a method in a scenario (repeat ``repeat`` of ``suite.tuning_repeats``):
    its tuned values, validation value and its setting's results on the test seeds."""

    repeat: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    validation: float | None = None
    scores: dict[int, float] = field(default_factory=dict)  # seed -> final test score
    times: dict[int, float | None] = field(default_factory=dict)  # seed -> time to target
    energies: dict[int, float | None] = field(default_factory=dict)  # seed -> joules the run spent
    moved: dict[int, float | None] = field(
        default_factory=dict
    )  # seed -> bytes its clients received and sent
    ends: dict[int, float | None] = field(default_factory=dict)  # seed -> the run's last simulated time
    folders: dict[int, str] = field(default_factory=dict)
    trials: list[float | None] = field(default_factory=list)  # its trials' validation values, in order

    @property
    def mean(self) -> float:
        return sum(self.scores.values()) / len(self.scores)


@dataclass
class Entry:
    """One method in one scenario: its tunings (one per repeat) and their statistics. The
    unit of its interval and tests is the seed when it was tuned once (paired by seed), the
    tuning (its seeds' mean) when it was tuned more than once (:meth:`units`)."""

    scenario: str
    method: str
    status: str = "ok"  # ok | failed | skipped
    reason: str = ""
    own: list[str] = field(default_factory=list)  # searched keys beyond the suite's shared ones
    tunings: list[Tuned] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # settings under which it is another rule
    knowledge: str = ""  # what its planner knew of clients' speeds (summary.json's planner_knowledge)
    builds: list[str] = field(default_factory=list)  # the fedhet builds its seed runs ran on
    failed_trials: int = 0  # tuning trials that failed (with the method's current code)
    code: str = ""  # the fingerprint of the code its studies ran (fedhet.bench.study)
    settings: str = ""  # the fingerprint of its studies' settings
    canary: str = ""  # the hash of its behaviour in a short run (fedhet.bench.canary)
    mean: float | None = None
    interval: Interval | None = None  # the mean's hierarchical-bootstrap interval (fedhet.bench.model)
    rank: int | None = None
    average_rank: float | None = None
    p: float | None = None
    p_holm: float | None = None
    worse: bool | None = None
    best: bool = False
    vs_best: Interval | None = None  # its mean less the best's, with the paired bootstrap interval
    vs_reference: Interval | None = None  # its mean less the reference's
    p_reference: float | None = None  # the test against the reference (as against the best)
    p_holm_reference: float | None = None  # Holm-corrected over the scenario's methods

    def units(self) -> dict[int, float]:
        """The values its statistics run over: seed -> score (tuned once), repeat -> the
        mean over its seeds (tuned R > 1 times: the tuning is the unit)."""
        scored = [t for t in self.tunings if t.scores]
        if len(self.tunings) == 1:
            return dict(scored[0].scores) if scored else {}
        return {t.repeat: t.mean for t in scored}

    @property
    def paired(self) -> bool:
        return len(self.tunings) == 1

    @property
    def mean_energy(self) -> float | None:
        """The joules its seed runs spent (summary.json's ``energy``), averaged over them."""
        spent = [e for t in self.tunings for e in t.energies.values() if e is not None]
        return sum(spent) / len(spent) if spent else None

    @property
    def mean_bytes(self) -> float | None:
        """The bytes its seed runs' clients received and sent (summary.json's ``bytes_down``
        and ``bytes_up``), averaged over the runs."""
        moved = [b for t in self.tunings for b in t.moved.values() if b is not None]
        return sum(moved) / len(moved) if moved else None

    @property
    def seed_count(self) -> int:
        return max((len(t.scores) for t in self.tunings), default=0)

    @property
    def reached(self) -> tuple[int, int]:
        times = [v for t in self.tunings for v in t.times.values()]
        return sum(1 for v in times if v is not None), len(times)

    @property
    def time_to_target(self) -> float | None:
        """The Kaplan-Meier median time to the target over its seed runs, a run that missed
        it censored at its end (:mod:`fedhet.bench.survival`)."""
        from fedhet.bench.survival import kaplan_meier

        seeds = [(t, seed) for t in self.tunings for seed in t.times]
        return kaplan_meier([t.times[s] for t, s in seeds], [t.ends.get(s) for t, s in seeds]).median

    @property
    def folders(self) -> list[str]:
        return [f for t in self.tunings for f in t.folders.values()]


def difference(a: Entry, b: Entry) -> float | None:
    """p of "a and b have the same mean": a paired t-test over the seeds both ran when each
    was tuned once, Welch's t-test over the tunings' means when tuned more than once."""
    return difference_p_value(a.units(), b.units(), paired=a.paired and b.paired)


@dataclass
class Overall:
    """One method across the scenarios it ran in."""

    method: str
    scenarios: int
    mean_rank: float | None
    wins: int
    not_worse: int  # scenarios where it is the best or not significantly worse (Holm)


@dataclass
class Leaderboard:
    scenarios: dict[str, list[Entry]]
    overall: list[Overall]
    alpha: float
    score: Score = field(default_factory=Score)  # what ranks the methods (the task's score)
    across: Friedman | None = None  # Friedman's test and Nemenyi's CD over the scenarios
    reference: str | None = None  # the method every other is compared with besides the best


def results_score(rows: list[dict]) -> Score:
    """The score the seed runs report (their task's; accuracy when none finished)."""
    for row in rows:
        for result in (r for tuning in row["tunings"] for r in tuning["seeds"].values()):
            if "score_metric" in result:
                return Score(result["score_metric"], bool(result["higher_is_better"]))
    return Score()


def default_reference(methods: list[str]) -> str | None:
    """The reference of a table that names none: FedAvg, else drop-stragglers, else none
    (as :func:`fedhet.bench.suite.load_suite`)."""
    return next((m for m in ("fedavg", "drop") if m in methods), None)


def build(rows: list[dict], alpha: float = 0.05, reference: str | None = None) -> Leaderboard:
    """The leaderboard of a bench's results (:meth:`fedhet.bench.runner.Bench.results`),
    ranked by the task's score in its direction (an accuracy up, an RMSE down); every method
    compared with the scenario's best and with ``reference`` (:func:`default_reference`
    when None)."""
    score = results_score(rows)
    reference = reference or default_reference([r["method"] for r in rows])
    scenarios: dict[str, list[Entry]] = {}
    for row in rows:
        entry = Entry(row["scenario"], row["method"], row["status"], row["reason"], list(row.get("own", [])),
                      failed_trials=int(row.get("failed_trials", 0)), code=row.get("code", ""),
                      settings=row.get("settings", ""), canary=row.get("canary", ""))  # fmt: skip
        for tuning in row["tunings"]:
            entry.tunings.append(_tuned(entry, tuning, score))
        if entry.status == "ok" and not entry.units():
            entry.status, entry.reason = "failed", entry.reason or "no seed finished"
        scenarios.setdefault(entry.scenario, []).append(entry)
    for entries in scenarios.values():
        rank_scenario(entries, alpha, score, reference)
    means = {name: {e.method: e.mean for e in entries if e.status == "ok" and e.mean is not None}
             for name, entries in scenarios.items()}  # fmt: skip
    across = friedman(means, score.higher_is_better, alpha)
    return Leaderboard(scenarios, overall(scenarios), alpha, score, across, reference)


def _tuned(entry: Entry, tuning: dict, score: Score) -> Tuned:
    """One tuning's results, read from a results row; failed seeds give the entry a reason."""
    tuned = Tuned(int(tuning.get("repeat", 1)), dict(tuning["params"]), tuning["validation"])
    tuned.trials = [None if v is None else float(v) for v in tuning.get("trials", [])]
    for seed, result in sorted(tuning["seeds"].items(), key=lambda item: int(item[0])):
        value = result.get("score", result.get("accuracy"))  # "accuracy": results written before
        if "failed" in result or value is None:
            entry.reason = entry.reason or f"seed {seed}: {result.get('failed', f'no {score.metric}')}"
            continue
        tuned.scores[int(seed)] = float(value)
        tuned.times[int(seed)] = result.get("time_to_target")
        tuned.energies[int(seed)] = result.get("energy")
        tuned.moved[int(seed)] = result.get("bytes")
        tuned.ends[int(seed)] = result.get("sim_time")
        tuned.folders[int(seed)] = result.get("folder", "")
        entry.caveats += [c for c in result.get("caveats", []) if c not in entry.caveats]
        entry.knowledge = entry.knowledge or str(result.get("planner_knowledge") or "")
        if result.get("fedhet") and result["fedhet"] not in entry.builds:
            entry.builds.append(result["fedhet"])
    return tuned


def rank_scenario(
    entries: list[Entry], alpha: float, score: Score | None = None, reference: str | None = None
) -> None:
    """Means and ranks (the best score first: the highest accuracy, the lowest RMSE; ties
    share the lower rank, and the mean-rank uses their average) over each entry's units
    (:meth:`Entry.units`), their hierarchical-bootstrap intervals and effects
    (:func:`bootstrap`); the best method (rank 1, the first listed among ties) and
    ``reference`` against each other method (:func:`difference`), each question
    Holm-corrected over the scenario's methods."""
    from scipy.stats import rankdata

    score = score or Score()
    ranked = [e for e in entries if e.status == "ok" and e.units()]
    if not ranked:
        return
    for entry in ranked:
        units = list(entry.units().values())
        entry.mean = sum(units) / len(units)
    sign = -1.0 if score.higher_is_better else 1.0
    means = [sign * (e.mean or 0.0) for e in ranked]
    for entry, low, average in zip(ranked, rankdata(means, "min"), rankdata(means, "average"), strict=True):
        entry.rank, entry.average_rank = int(low), float(average)
    best = next(e for e in ranked if e.rank == 1)
    best.best = True
    others = [e for e in ranked if e is not best]
    raw = [difference(best, e) for e in others]
    for entry, p, adjusted in zip(others, raw, holm(raw), strict=True):
        entry.p, entry.p_holm = p, adjusted
        entry.worse = None if adjusted is None else bool(adjusted < alpha)
    anchor = next((e for e in ranked if e.method == reference), None)
    if anchor is not None:
        compared = [e for e in ranked if e is not anchor]
        raw = [difference(e, anchor) for e in compared]
        for entry, p, adjusted in zip(compared, raw, holm(raw), strict=True):
            entry.p_reference, entry.p_holm_reference = p, adjusted
    bootstrap(ranked, best, anchor, score)


def bootstrap(ranked: list[Entry], best: Entry, anchor: Entry | None, score: Score) -> None:
    """Each entry's interval, and its effect against ``best`` and ``anchor`` (the
    reference), from the hierarchical bootstrap of :mod:`fedhet.bench.model` (seeds drawn
    once for all, paired; tunings drawn per method), clipped to the score's range."""
    from fedhet.bench.model import effects, mean_intervals, replicate_means, score_matrix
    from fedhet.run_schema import value_range

    seeds = sorted({seed for e in ranked for t in e.tunings for seed in t.scores})
    tables = {e.method: score_matrix([t for t in e.tunings if t.scores], seeds) for e in ranked}
    draws = replicate_means(tables, len(seeds), ranked[0].scenario)
    means = {e.method: float(e.mean) for e in ranked if e.mean is not None}
    span = value_range(score.metric)
    intervals = mean_intervals(draws, means, span)
    to_best = effects(draws, means, best.method, span)
    to_anchor = effects(draws, means, anchor.method, span) if anchor is not None else {}
    for entry in ranked:
        entry.interval = intervals[entry.method]
        entry.vs_best = to_best[entry.method]
        entry.vs_reference = to_anchor.get(entry.method)


def overall(scenarios: dict[str, list[Entry]]) -> list[Overall]:
    """Per method: its mean rank over the scenarios where it ran, its wins (rank 1), and the
    scenarios where it is not significantly worse than the best; best mean rank first."""
    methods: dict[str, list[Entry]] = {}
    for entries in scenarios.values():
        for entry in entries:
            methods.setdefault(entry.method, []).append(entry)
    out = []
    for method, entries in methods.items():
        ran = [e for e in entries if e.average_rank is not None]
        mean_rank = sum(e.average_rank for e in ran) / len(ran) if ran else None  # type: ignore[misc]
        out.append(Overall(method, len(ran), mean_rank, sum(1 for e in ran if e.rank == 1),
                           sum(1 for e in ran if e.best or e.worse is False)))  # fmt: skip
    order = {m: i for i, m in enumerate(methods)}
    return sorted(out, key=lambda o: (o.mean_rank is None, o.mean_rank or 0.0, order[o.method]))


# -- writing ---------------------------------------------------------------------------------
def _number(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _values(params: dict) -> str:
    """``lr=0.1, server.lr=0.8, mu=0.01``: a client (train) or algorithm key by its name,
    any other with its section."""

    def name(key: str) -> str:
        section, _, rest = key.partition(".")
        return rest if section in ("train", "algorithm") else key

    return ", ".join(
        f"{name(k)}={v:.3g}" if isinstance(v, float) else f"{name(k)}={v}" for k, v in params.items()
    )


def _by_seed(entry: Entry, values: str) -> str:
    """``seed:value;...`` over every tuning's seeds (``tuning/seed:value`` when several),
    each value as it was (its shortest exact text), so that the table reads back to the
    same statistics (``--against``)."""
    parts = []
    for t in entry.tunings:
        mapping: dict[int, Any] = getattr(t, values)  # scores, times, energies, bytes moved
        for seed, value in sorted(mapping.items()):
            key = f"{t.repeat}/{seed}" if not entry.paired else str(seed)
            text = "" if value is None else repr(float(value))
            parts.append(f"{key}:{text}")
    return ";".join(parts)


def csv_rows(board: Leaderboard) -> list[dict]:
    rows, metric = [], board.score.metric
    for entries in board.scenarios.values():
        for e in sorted(entries, key=_order):
            reached, seeds = e.reached
            tuned = [t.params for t in e.tunings]
            rows.append({
                "scenario": e.scenario, "method": e.method, "status": e.status,
                "rank": "" if e.rank is None else e.rank, f"mean_{metric}": _number(e.mean, 6),
                **_interval_columns("ci", e.interval, value=False),
                "tunings": len(e.tunings), "seeds": e.seed_count,
                f"{metric}_by_seed": _by_seed(e, "scores"), "time_by_seed": _by_seed(e, "times"),
                "end_by_seed": _by_seed(e, "ends"),
                "energy_by_seed": _by_seed(e, "energies"), "mean_energy": _number(e.mean_energy, 6),
                "bytes_by_seed": _by_seed(e, "moved"), "mean_bytes": _number(e.mean_bytes, 0),
                "time_to_target": _number(e.time_to_target, 3),
                "target_reached": f"{reached}/{seeds}" if seeds else "",
                "p_vs_best": _number(e.p, 6), "p_holm": _number(e.p_holm, 6),
                "worse_than_best": "" if e.worse is None else str(e.worse).lower(),
                **_interval_columns("vs_best", e.vs_best), "reference": board.reference or "",
                **_interval_columns("vs_reference", e.vs_reference),
                "p_vs_reference": _number(e.p_reference, 6),
                "p_holm_reference": _number(e.p_holm_reference, 6),
                "validation_value": ";".join(_number(t.validation, 6) for t in e.tunings),
                "validation_by_trial": _by_trial(e),
                "tuned": json.dumps(tuned[0] if len(tuned) == 1 else tuned, sort_keys=True),
                "own_knobs": " ".join(e.own), "reason": e.reason, "caveats": " | ".join(e.caveats),
                "planner_knowledge": e.knowledge, "fedhet": ";".join(sorted(e.builds)),
                "failed_trials": e.failed_trials,
                "code": e.code, "settings": e.settings, "canary": e.canary,
                "higher_is_better": str(board.score.higher_is_better).lower(),
            })  # fmt: skip
    return rows


def _by_trial(entry: Entry) -> str:
    """``repeat:v1 v2 ...;...``: each tuning's trials' validation values in order (``-``:
    pruned, or not finite)."""
    return ";".join(
        f"{t.repeat}:" + " ".join("-" if v is None else repr(v) for v in t.trials)
        for t in entry.tunings
        if t.trials
    )


def _interval_columns(name: str, interval: Interval | None, value: bool = True) -> dict[str, str]:
    """``name``, ``name_low``, ``name_high`` (without ``name`` itself when not ``value``)."""
    columns = {
        f"{name}_low": _number(interval.low if interval else None, 6),
        f"{name}_high": _number(interval.high if interval else None, 6),
    }
    return {name: _number(interval.value if interval else None, 6), **columns} if value else columns


def read_csv(path: Path) -> list[dict]:
    """A leaderboard.csv read back as the results rows :func:`build` takes (what a row
    keeps: per-seed scores and times to the target, tuned values, fingerprints; not the
    runs' folders; a table written before the fingerprints reads without them). Refused in
    one line when it is not a leaderboard's table."""
    from fedhet.errors import FedhetError

    try:
        with open(path, newline="", encoding="utf-8") as handle:
            table = list(csv.DictReader(handle))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise FedhetError(f"{path}: not a leaderboard.csv (not CSV text: {exc})") from None
    metric = next((c[5:] for c in (table[0] if table else {}) if c.startswith("mean_")), None)
    needed = ("scenario", "method", "status", "reason", "tuned", f"{metric}_by_seed")
    missing = [c for c in needed if not table or c not in table[0]]
    if metric is None or missing:
        column = missing[0] if missing else "mean_<score>"
        raise FedhetError(f"{path}: not a leaderboard.csv of this fedhet (no column {column})")
    rows, seen = [], set()
    for number, r in enumerate(table, start=1):
        where = f"{path}: row {number} (scenario {r['scenario']}, method {r['method']})"
        if (r["scenario"], r["method"]) in seen:
            raise FedhetError(f"{where}: appears twice")
        seen.add((r["scenario"], r["method"]))
        try:
            rows.append(_row_from_csv(r, metric))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise FedhetError(f"{where}: not a leaderboard row ({exc})") from None
    return rows


def _score(value: str, metric: str, key: str) -> float:
    """A per-seed score of a leaderboard.csv, checked: a finite number in the metric's range."""
    from fedhet.run_schema import value_range

    score = float(value)
    low, high = value_range(metric)
    if not (math.isfinite(score) and low <= score <= high):
        raise ValueError(f"{metric}_by_seed {key}: {value} is not a {metric} (in [{low:g}, {high:g}])")
    return score


def _row_from_csv(r: dict, metric: str) -> dict:
    """One leaderboard.csv row as a results row (see :func:`read_csv`)."""
    tuned = json.loads(r["tuned"] or "{}")
    params = tuned if isinstance(tuned, list) else [tuned]
    if not all(isinstance(p, dict) for p in params):
        raise ValueError(f"tuned: {r['tuned']!r} is not the tuned values (JSON objects)")
    validation = [float(v) if v else None for v in (r.get("validation_value") or "").split(";")]
    validation += [None] * len(params)
    trials = {int(k): [None if v == "-" else float(v) for v in text.split()]
              for k, text in _pairs(r.get("validation_by_trial") or "")}  # fmt: skip
    tunings = [{"repeat": i + 1, "params": p, "validation": validation[i], "seeds": {},
                "trials": trials.get(i + 1, [])} for i, p in enumerate(params)]  # fmt: skip
    higher = r.get("higher_is_better", "true") == "true"
    times = dict(_pairs(r.get("time_by_seed", "")))
    energies = dict(_pairs(r.get("energy_by_seed") or ""))  # a table written before energy: none
    moved = dict(_pairs(r.get("bytes_by_seed") or ""))
    ends = dict(_pairs(r.get("end_by_seed") or ""))
    for key, value in _pairs(r[f"{metric}_by_seed"]):
        repeat, _, seed = key.rpartition("/")
        result = {"score": _score(value, metric, key), "score_metric": metric, "higher_is_better": higher,
                  "time_to_target": float(times[key]) if times.get(key) else None,
                  "energy": float(energies[key]) if energies.get(key) else None,
                  "bytes": float(moved[key]) if moved.get(key) else None,
                  "sim_time": float(ends[key]) if ends.get(key) else None,
                  "caveats": [c for c in r.get("caveats", "").split(" | ") if c],
                  "planner_knowledge": r.get("planner_knowledge", ""),
                  "fedhet": r.get("fedhet", "")}  # fmt: skip
        tunings[int(repeat or 1) - 1]["seeds"][int(seed)] = result
    return {"scenario": r["scenario"], "method": r["method"], "status": r["status"], "reason": r["reason"],
            "own": r.get("own_knobs", "").split(), "failed_trials": int(r.get("failed_trials") or 0),
            "code": r.get("code", ""), "settings": r.get("settings", ""), "canary": r.get("canary", ""),
            "tunings": tunings}  # fmt: skip


def _pairs(text: str) -> list[tuple[str, str]]:
    return [tuple(part.split(":", 1)) for part in text.split(";") if part]  # type: ignore[misc]


def _order(entry: Entry) -> tuple:
    return (entry.rank is None, entry.rank or 0, entry.status != "ok")


def write_csv(board: Leaderboard, path: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns(board.score), lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(board))
    path.write_text(buffer.getvalue(), encoding="utf-8")
    return path


def scenario_lines(
    entries: list[Entry],
    target: float | None,
    alpha: float,
    metric: str = "accuracy",
    reference: str | None = None,
    tuned: bool = True,
) -> list[str]:
    """One scenario's table in markdown; ``tuned=False`` leaves out the column of each
    tuning's values (a page of many methods; the table's CSV keeps them)."""
    target_head = f"time to {target:g}: KM median (reached)" if target is not None else "time to target"
    against = f"vs {reference}" if reference else "vs reference"
    lines = [
        f"| rank | method | test {metric} [95% CI] (units) | vs best [95% CI] | {against} [95% CI] | "
        f"{target_head} | energy J | MB moved | p vs best | p Holm | p {against} | p Holm |"
        + (" tuned (validation) |" if tuned else ""),
        "|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---:|" + ("---|" if tuned else ""),
    ]
    for e in sorted(entries, key=_order):
        if e.status != "ok":
            lines.append(f"| – | {e.method} | {e.status}: {e.reason} |" + " |" * (10 if tuned else 9))
            continue
        marker = " **best**" if e.best else (" *worse*" if e.worse else "")
        marker += " ⚠" if e.caveats else ""
        marker += f" (+{len(e.own)} own)" if e.own else ""
        marker += f" (knew: {e.knowledge})" if e.knowledge else ""
        value = f"{e.interval.text() if e.interval else f'{e.mean:.4f}'} ({_units_text(e)})"
        effects = " | ".join(
            "–" if gap is None else gap.text(signed=True) for gap in (e.vs_best, e.vs_reference)
        )
        energy = "–" if e.mean_energy is None else f"{e.mean_energy:.4g}"
        moved = "–" if e.mean_bytes is None else f"{e.mean_bytes / 1e6:.4g}"
        tests = " | ".join(_p(p) for p in (e.p, e.p_holm, e.p_reference, e.p_holm_reference))
        cells = [str(e.rank), f"{e.method}{marker}", value, effects, _time_text(e), energy, moved, tests]
        cells += [_tuned_text(e)] if tuned else []
        lines.append(f"| {' | '.join(cells)} |")
    power = power_line(entries, alpha, metric)
    lines += ["", power] if power else []
    caveats = [(e.method, c) for e in sorted(entries, key=_order) for c in e.caveats]
    if caveats:
        lines += ["", *[f"- ⚠ {method}: {caveat}" for method, caveat in caveats]]
    return lines


def _time_text(entry: Entry) -> str:
    reached, seeds = entry.reached
    if entry.time_to_target is None:  # fewer than half its runs known to reach the target
        return f"> half missed ({reached}/{seeds})"
    return f"{entry.time_to_target:.1f} s ({reached}/{seeds})"


def power_line(entries: list[Entry], alpha: float, metric: str = "accuracy") -> str | None:
    """The smallest difference the scenario's test detects with 80% power, from the pooled
    spread of the methods' tunings (tuned more than once; a paired test over the seeds of one
    tuning has a power that depends on the pairing, not stated)."""
    ranked = [e for e in entries if e.status == "ok" and e.mean is not None and e.units()]
    if len(ranked) < 2 or any(e.paired for e in ranked):
        return None
    units = min(len(e.units()) for e in ranked)
    spread = pooled_sd([list(e.units().values()) for e in ranked])
    plain = None if spread is None else detectable_difference(spread, units, alpha)
    if spread is None or plain is None:
        return None
    tests = len(ranked) - 1
    first = detectable_difference(spread, units, alpha / tests) or plain
    return (
        f"Power: the tunings' means spread with a pooled standard deviation of {spread:.4f}; with "
        f"{units} tunings per method a t-test over them (Welch's, taken with equal variances) detects a "
        f"difference of {plain:.4f} in mean test {metric} with 80% power at {alpha:g}, and {first:.4f} "
        f"at Holm's first step ({alpha:g}/{tests}); smaller differences go unseen."
    )


def _units_text(entry: Entry) -> str:
    """``n=5`` seeds, or ``2 tunings × 5 seeds`` when the tuning is the unit."""
    if entry.paired:
        return f"n={entry.seed_count}"
    return f"{len(entry.units())} tunings × {entry.seed_count} seeds"


def _tuned_text(entry: Entry) -> str:
    """Each tuning's values and validation value, and the trials that failed."""
    failed = f"; {counted(entry.failed_trials, 'trial')} failed" if entry.failed_trials else ""
    parts = [f"{_values(t.params)} ({_number(t.validation)})" for t in entry.tunings]
    return " / ".join(parts) + failed


def across_lines(board: Leaderboard) -> list[str]:
    """The methods across scenarios: mean rank (among all that ran there), wins, and
    Friedman's test over the scenarios with Nemenyi's critical difference (its mean rank
    among the methods that ran everywhere, and whether that is within CD of the best)."""
    test = board.across
    lines = ["| method | mean rank | wins | scenarios | Friedman mean rank | within CD of the best |",
             "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for o in board.overall:
        mean_rank = f"{o.mean_rank:.2f}" if o.mean_rank is not None else "–"
        near = None if test is None else test.near_best(o.method)
        rank = "–" if near is None or test is None else f"{test.mean_ranks[o.method]:.2f}"
        verdict = {True: "yes", False: "no", None: "– (not in every scenario)"}[near] if test else "–"
        lines.append(f"| {o.method} | {mean_rank} | {o.wins} | {o.scenarios} | {rank} | {verdict} |")
    return [*lines, "", friedman_sentence(test)]


def friedman_sentence(test: Friedman | None) -> str:
    """What the test over the scenarios found, with its power (the critical difference)."""
    if test is None:
        return "Friedman's test needs 3 methods that ran in every scenario of 2 or more: not run here."
    outcome = (
        "every scenario ranks them alike" if test.p is None
        else f"chi-square = {test.statistic:.2f}, p = {test.p:.3g}"
    )  # fmt: skip
    left = f" Left out (not in every scenario): {', '.join(test.left_out)}." if test.left_out else ""
    return (
        f"Friedman's test over the {len(test.scenarios)} scenarios (blocks) of the {len(test.methods)} "
        f"methods that ran in all of them, ranked by mean test score: {outcome}. Nemenyi's critical "
        f"difference at {test.alpha:g}: {test.critical_difference:.2f} mean ranks (Demšar, JMLR 2006): "
        "two methods whose mean ranks differ by less are not told apart, the smallest difference "
        f"these scenarios can detect.{left}"
    )


def markdown(board: Leaderboard, header: dict) -> str:
    """The leaderboard page in markdown (``header``: what the bench was, see :func:`write`)."""
    lines = [f"# Leaderboard: suite {header['suite']}", ""]
    if header.get("description"):
        lines += [header["description"], ""]
    lines += [f"- {k}: {v}" for k, v in header["settings"].items()] + [""]
    lines += [*model_lines(board), "", "## Across scenarios", "", *across_lines(board)]
    for name, entries in board.scenarios.items():
        description = header.get("scenarios", {}).get(name, "")
        lines += ["", f"## {name}", ""] + ([description, ""] if description else [])
        lines += scenario_lines(
            entries, header.get("target"), board.alpha, board.score.metric, board.reference
        )
        budget = budget_sentence(budget_curves(board, name), board.score.higher_is_better)
        lines += ["", budget] if budget else []
    return "\n".join(lines) + "\n"


def model_lines(board: Leaderboard) -> list[str]:
    """How the tables are read: the statistical model, the intervals, the tests, the Holm
    families and what survives a correction over all of them."""
    repeated = any(not e.paired for entries in board.scenarios.values() for e in entries if e.tunings)
    metric, reference = board.score.metric, board.reference or "the reference"
    test = (
        "Welch's t-test over the tunings' means (each tuning's mean runs over the same seeds as "
        "every other's, so the seeds' shared effects cancel)"
        if repeated
        else "a paired t-test over the seeds both ran"
    )
    return [
        "## How to read the tables",
        "",
        f"Model: a method's final test {metric} is its mean, plus its tuning's draw (tunings nested "
        "in the method, random), plus the seed's draw (seed s is the same split, devices and "
        "availability for every method: paired), plus noise. A method's mean is the mean over its "
        "tunings of each one's mean over the seeds. Its 95% interval, and each effect (a method's "
        f"mean less the scenario's best's, and less {reference}'s, in {metric} units), come from a "
        "hierarchical bootstrap (2,000 draws: the seeds drawn once for all methods, each "
        "method's tunings drawn on their own), percentile intervals clipped to the score's "
        "range; with few tunings they are "
        "somewhat too narrow, so read them with the tests' p. "
        f"p vs best and p vs {reference}: {test}; p Holm: Holm-corrected within its family; "
        f"*worse*: Holm-corrected p vs best < {board.alpha:g}. Time to target: the Kaplan-Meier "
        "median over the seed runs on the simulated clock, a run that missed the target censored "
        "at its end; none where fewer than half are known to reach it. Budget: each method's "
        "expected best validation value after n trials is the mean over its tunings of the best "
        "of their first n trials (leaderboard-budget.png draws it with a bootstrap band).",
        "",
        families_line(board),
        "",
        "Every method searches the suite's shared knobs; (+k own): it searched k knobs of its own "
        "besides (the searched line above names them). ⚠: under this scenario's settings the "
        "method is provably another, simpler rule, or a mechanism of it is inert (the caveat says "
        "which). (knew: k): what its planner knew of clients' speeds when it sized their work: "
        "history (their reports), profile (the declared expectation) or oracle (this round's drawn "
        "times). energy J: the joules a seed run spent (summary.json's energy), the mean over its "
        "seed runs; MB moved: the megabytes its clients received and sent (summary.json's "
        "bytes_down and bytes_up), the mean over its seed runs.",
    ]


def global_marks(board: Leaderboard) -> tuple[int, list[tuple[str, str, str, float, float]]]:
    """The Holm families (per scenario: each method against the best, and against the
    reference) and, corrected over all their tests together, the marks that survive:
    (families, [(scenario, question, method, Holm within its family, Holm over all)])."""
    tests: list[tuple[str, str, str, float | None, float | None]] = []
    families = 0
    for name, entries in board.scenarios.items():
        for question, raw, within in (
            ("best", "p", "p_holm"),
            ("reference", "p_reference", "p_holm_reference"),
        ):
            family = [(name, question, e.method, getattr(e, raw), getattr(e, within)) for e in entries
                      if getattr(e, raw) is not None]  # fmt: skip
            families += bool(family)
            tests += family
    overall = holm([t[3] for t in tests])
    marks = [(s, q, m, float(within), float(adjusted))
             for (s, q, m, _, within), adjusted in zip(tests, overall, strict=True)
             if within is not None and within < board.alpha and adjusted is not None]  # fmt: skip
    return families, marks


def families_line(board: Leaderboard) -> str:
    """How many Holm families the page holds, and which marks survive over all of them."""
    families, marks = global_marks(board)
    count = sum(1 for entries in board.scenarios.values() for e in entries for p in (e.p, e.p_reference)
                if p is not None)  # fmt: skip
    if not count:
        return "Holm families: none (no scenario has two methods to test)."
    kept = [
        f"{m} against the {q} in {s} ({adjusted:.2g})"
        for s, q, m, _, adjusted in marks
        if adjusted < board.alpha
    ]
    lost = len(marks) - len(kept)
    return (
        f"Holm families: {families} (one per scenario and question: against the best, against "
        f"{board.reference or 'the reference'}), {count} tests. Of the {len(marks)} differences "
        f"significant within their family, {len(kept)} stay significant when Holm's correction runs "
        f"over all {count} tests together"
        + (f": {'; '.join(kept)}" if kept else "")
        + (f"; {lost} do not." if lost else ".")
    )


def _curves(entries: list[Entry], column: str = "test_accuracy") -> dict[str, tuple[Any, Any]]:
    """Per method, the mean test score (``column``) over its seeds on a common
    simulated-time grid (each seed's last evaluation at or before each time)."""
    import numpy as np

    from fedhet.results import read_table

    series: dict[str, list[tuple[Any, Any]]] = {}
    horizon = 0.0
    for e in entries:
        for folder in e.folders:
            path = Path(folder) / "metrics.csv"
            if not path.is_file():
                continue
            rows = [r for r in read_table(path) if r.get(column) not in ("", None)]
            if rows:
                t = np.array([float(r["sim_time"]) for r in rows])
                series.setdefault(e.method, []).append((t, np.array([float(r[column]) for r in rows])))
                horizon = max(horizon, float(t[-1]))
    grid = np.linspace(0.0, horizon or 1.0, 200)
    out = {}
    for method, runs in series.items():
        values = []
        for t, acc in runs:
            index = np.searchsorted(t, grid, side="right") - 1
            values.append(np.where(index >= 0, acc[np.clip(index, 0, None)], np.nan))
        with np.errstate(all="ignore"):
            out[method] = (grid, np.nanmean(np.vstack(values), axis=0) if values else grid * np.nan)
    return out


def figures(board: Leaderboard, out: Path) -> list[Path]:
    """The score and the energy spent against simulated time per scenario, the expected best
    validation value against the tuning trials, the megabytes each client moved, and the rank
    heat-map, as PNGs."""
    from fedhet.studies.plots import _pyplot

    plt = _pyplot()
    metric = f"test {board.score.metric}"
    return [_curves_figure(plt, board, out / "leaderboard-curves.png", board.score.column, metric),
            _curves_figure(plt, board, out / "leaderboard-energy.png", "energy_total", "energy spent (J)"),
            _budget_figure(plt, board, out / "leaderboard-budget.png"),
            _clients_figure(plt, board, out / "leaderboard-clients.png"),
            _ranks_figure(plt, board, out / "leaderboard-ranks.png")]  # fmt: skip


def _evaluations(mean) -> list[int]:
    """The grid points where a curve takes a new value (its evaluations): marked, so that a
    method evaluated once or twice in a run (a slow round) shows as points, not nothing."""
    import numpy as np

    finite = np.isfinite(mean)
    changed = finite & ~np.concatenate([[False], np.isclose(mean[1:], mean[:-1]) & finite[:-1]])
    return [int(i) for i in np.flatnonzero(changed)]


def _curves_figure(plt, board: Leaderboard, path: Path, column: str, label: str) -> Path:
    """Each scenario's mean ``column`` of metrics.csv (the test score, the energy spent so
    far) of every method against simulated time."""
    from fedhet.studies.plots import algorithm_color

    def draw(ax, entries: list[Entry]) -> None:
        for method, (grid, mean) in _curves(entries, column).items():
            ax.plot(grid, mean, label=method, color=algorithm_color(method), marker="o", markersize=3,
                    markevery=_evaluations(mean))  # fmt: skip

    return _scenarios_figure(plt, board, path, draw, "simulated time (s)", label)


def budget_curves(board: Leaderboard, name: str) -> list[Any]:
    """The scenario's budget curves (:mod:`fedhet.bench.budget`) of the methods that ran."""
    from fedhet.bench.budget import curve

    made = [curve(e.method, [t.trials for t in e.tunings], board.score.higher_is_better, name)
            for e in board.scenarios[name] if e.status == "ok"]  # fmt: skip
    return [c for c in made if c is not None]


def _client_spend(entries: list[Entry], columns: tuple[str, ...]) -> dict[str, list[float]]:
    """Per method, every client's sum of ``columns`` of clients.csv over its seed runs."""
    import csv

    out: dict[str, list[float]] = {}
    for e in entries:
        for folder in e.folders:
            path = Path(folder) / "clients.csv"
            if not path.is_file():
                continue
            with open(path, newline="", encoding="utf-8") as handle:
                rows = list(csv.DictReader(handle))
            if rows and all(c in rows[0] for c in columns):
                out.setdefault(e.method, []).extend(sum(float(r[c] or 0.0) for c in columns) for r in rows)
    return out


def _clients_figure(plt, board: Leaderboard, path: Path) -> Path:
    """Each scenario's per-client megabytes moved (clients.csv's bytes_down + bytes_up), a box
    per method over its seed runs' clients."""
    from fedhet.studies.plots import algorithm_color

    def draw(ax, entries: list[Entry]) -> None:
        spend = _client_spend(entries, ("bytes_down", "bytes_up"))
        for position, (method, values) in enumerate(spend.items(), start=1):
            box = ax.boxplot([v / 1e6 for v in values], positions=[position], widths=0.6, showfliers=False,
                             patch_artist=True)  # fmt: skip
            box["boxes"][0].set(facecolor=algorithm_color(method), alpha=0.5, label=method)
        ax.set_xticks(range(1, len(spend) + 1), list(spend), rotation=45, ha="right", fontsize=7)

    return _scenarios_figure(plt, board, path, draw, "", "MB moved per client")


def _budget_figure(plt, board: Leaderboard, path: Path) -> Path:
    """Each scenario's expected best validation value against the trials, with bands."""
    from matplotlib.ticker import MaxNLocator

    from fedhet.studies.plots import algorithm_color

    def draw(ax, entries: list[Entry]) -> None:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole trials
        for c in budget_curves(board, entries[0].scenario) if entries else []:
            counts = list(range(1, len(c.mean) + 1))
            mean = [math.nan if v is None else v for v in c.mean]
            ax.plot(counts, mean, label=c.method, color=algorithm_color(c.method), marker="o", markersize=3)
            if c.tunings > 1:
                low = [math.nan if v is None else v for v in c.low]
                high = [math.nan if v is None else v for v in c.high]
                ax.fill_between(counts, low, high, color=algorithm_color(c.method), alpha=0.12, linewidth=0)

    label = f"expected best validation {board.score.metric}"
    return _scenarios_figure(plt, board, path, draw, "tuning trials", label)


def _scenarios_figure(plt, board: Leaderboard, path: Path, draw, xlabel: str, ylabel: str) -> Path:
    """A panel per scenario, each drawn by ``draw(ax, entries)``; one legend of every method."""
    import warnings

    names = list(board.scenarios)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            draw(ax, board.scenarios[name])
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    legend: dict[str, Any] = {}  # every method of every scenario, once
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels) or 1), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=90, bbox_inches="tight")  # long plug-in names in the legend are not cut
    plt.close(fig)
    return path


def _ranks_figure(plt, board: Leaderboard, path: Path) -> Path:
    """The heat-map of every method's rank in every scenario."""
    import numpy as np

    names, methods = list(board.scenarios), [o.method for o in board.overall]
    matrix = np.full((len(methods), len(names)), np.nan)
    for j, name in enumerate(names):
        for e in board.scenarios[name]:
            if e.rank is not None:
                matrix[methods.index(e.method), j] = e.rank
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 3, 0.4 * len(methods) + 1.5))
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    for i in range(len(methods)):
        for j in range(len(names)):
            missing = math.isnan(matrix[i, j])
            red, green, blue, _ = (1.0, 1.0, 1.0, 1.0) if missing else image.cmap(image.norm(matrix[i, j]))
            light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5  # dark text on a light cell
            text = "–" if missing else f"{int(matrix[i, j])}"
            ax.text(j, i, text, ha="center", va="center", fontsize=9, fontweight="bold",
                    color="black" if light else "white")  # fmt: skip
    ax.set_title(f"rank per scenario (1 = best mean test {board.score.metric})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def inline_html(text: str) -> str:
    """A line of the markdown page as HTML: escaped, ``**best**`` bold, ``*worse*`` in
    italics, ```code``` as code (the page shows the marks, not the asterisks)."""
    import html
    import re

    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<em>\1</em>", escaped)


def html_page(markdown_text: str, images: list[Path]) -> str:
    """The markdown page as a self-contained HTML page with the figures embedded."""
    import base64
    import html

    from fedhet.studies.report import STYLE

    body = []
    in_table = False
    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-:"):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                body.append("<table>")
                in_table = True
            body.append("<tr>" + "".join(f"<{tag}>{inline_html(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
            for image in images:
                data = base64.b64encode(image.read_bytes()).decode("ascii")
                body.append(f'<figure><img alt="{image.stem}" src="data:image/png;base64,{data}"></figure>')
        elif line.startswith("!["):
            continue  # the figures are embedded under the title
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            body.append(f"<li>{inline_html(line[2:])}</li>")
        elif line:
            body.append(f"<p>{inline_html(line)}</p>")
    if in_table:
        body.append("</table>")
    head = f"<meta charset='utf-8'><title>leaderboard</title><style>{STYLE}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>"


def without_curves(board: Leaderboard) -> list[str]:
    """The methods with results but no run's metrics.csv to draw (rows read from a CSV)."""
    return sorted({
        e.method for entries in board.scenarios.values() for e in entries
        if e.status == "ok" and not any((Path(f) / "metrics.csv").is_file() for f in e.folders if f)
    })  # fmt: skip


def write(board: Leaderboard, out: Path, header: dict, with_figures: bool = True) -> list[Path]:
    """``leaderboard.md``, ``leaderboard.csv`` and ``leaderboard.html`` (with its figures)."""
    text = markdown(board, header)
    paths = [out / "leaderboard.md", write_csv(board, out / "leaderboard.csv")]
    images = figures(board, out) if with_figures else []
    if images:
        links = (
            f"![{board.score.metric} against simulated time](leaderboard-curves.png)\n\n"
            "![energy spent against simulated time](leaderboard-energy.png)\n\n"
            "![expected best validation value against tuning trials](leaderboard-budget.png)\n\n"
            "![megabytes each client moved](leaderboard-clients.png)\n\n"
            "![ranks](leaderboard-ranks.png)\n"
        )
        lacking = without_curves(board)
        if lacking:
            links += (
                f"\nThe curves lack {', '.join(lacking)}: their rows were read from a table that keeps "
                "no run folders (a field given to --against as its leaderboard.csv).\n"
            )
        text = text.replace("\n## Across scenarios", f"\n{links}\n## Across scenarios", 1)
    paths[0].write_text(text, encoding="utf-8")
    page = out / "leaderboard.html"
    page.write_text(html_page(text, images), encoding="utf-8")
    return [*paths, page, *images]
