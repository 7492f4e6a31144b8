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
from fedhet.checks import counted
from fedhet.data.task import Score
from fedhet.studies.stats import difference_p_value, estimate, holm

CSV_COLUMNS = (
    "scenario",
    "method",
    "status",
    "rank",
    "mean_accuracy",
    "ci95",
    "tunings",
    "seeds",
    "accuracy_by_seed",
    "time_by_seed",
    "energy_by_seed",
    "mean_energy",
    "time_to_target",
    "target_reached",
    "p_vs_best",
    "p_holm",
    "worse_than_best",
    "validation_value",
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
    folders: dict[int, str] = field(default_factory=dict)

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
    ci95: float | None = None
    rank: int | None = None
    average_rank: float | None = None
    p: float | None = None
    p_holm: float | None = None
    worse: bool | None = None
    best: bool = False

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
    def seed_count(self) -> int:
        return max((len(t.scores) for t in self.tunings), default=0)

    @property
    def reached(self) -> tuple[int, int]:
        times = [v for t in self.tunings for v in t.times.values()]
        return sum(1 for v in times if v is not None), len(times)

    @property
    def time_to_target(self) -> float | None:
        hit = [v for t in self.tunings for v in t.times.values() if v is not None]
        return sum(hit) / len(hit) if hit else None

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


def results_score(rows: list[dict]) -> Score:
    """The score the seed runs report (their task's; accuracy when none finished)."""
    for row in rows:
        for result in (r for tuning in row["tunings"] for r in tuning["seeds"].values()):
            if "score_metric" in result:
                return Score(result["score_metric"], bool(result["higher_is_better"]))
    return Score()


def build(rows: list[dict], alpha: float = 0.05) -> Leaderboard:
    """The leaderboard of a bench's results (:meth:`fedhet.bench.runner.Bench.results`),
    ranked by the task's score in its direction (an accuracy up, an RMSE down)."""
    score = results_score(rows)
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
        rank_scenario(entries, alpha, score)
    means = {name: {e.method: e.mean for e in entries if e.status == "ok" and e.mean is not None}
             for name, entries in scenarios.items()}  # fmt: skip
    across = friedman(means, score.higher_is_better, alpha)
    return Leaderboard(scenarios, overall(scenarios), alpha, score, across)


def _tuned(entry: Entry, tuning: dict, score: Score) -> Tuned:
    """One tuning's results, read from a results row; failed seeds give the entry a reason."""
    tuned = Tuned(int(tuning.get("repeat", 1)), dict(tuning["params"]), tuning["validation"])
    for seed, result in sorted(tuning["seeds"].items(), key=lambda item: int(item[0])):
        value = result.get("score", result.get("accuracy"))  # "accuracy": results written before
        if "failed" in result or value is None:
            entry.reason = entry.reason or f"seed {seed}: {result.get('failed', f'no {score.metric}')}"
            continue
        tuned.scores[int(seed)] = float(value)
        tuned.times[int(seed)] = result.get("time_to_target")
        tuned.energies[int(seed)] = result.get("energy")
        tuned.folders[int(seed)] = result.get("folder", "")
        entry.caveats += [c for c in result.get("caveats", []) if c not in entry.caveats]
        entry.knowledge = entry.knowledge or str(result.get("planner_knowledge") or "")
        if result.get("fedhet") and result["fedhet"] not in entry.builds:
            entry.builds.append(result["fedhet"])
    return tuned


def rank_scenario(entries: list[Entry], alpha: float, score: Score | None = None) -> None:
    """Means, 95% t-intervals and ranks (the best score first: the highest accuracy, the
    lowest RMSE; ties share the lower rank,
    and the mean-rank uses their average) over each entry's units (:meth:`Entry.units`); the
    best method (rank 1, the first listed among ties) against each other
    (:func:`difference`), Holm-corrected."""
    from scipy.stats import rankdata

    ranked = [e for e in entries if e.status == "ok"]
    for entry in ranked:
        est = estimate(list(entry.units().values()), "ci95")
        entry.mean, entry.ci95 = est.mean, (est.spread if est.n > 1 else None)
    if not ranked:
        return
    sign = -1.0 if (score or Score()).higher_is_better else 1.0
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
        mapping: dict[int, Any] = getattr(t, values)  # scores, times or energies
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
                "ci95": _number(e.ci95, 6), "tunings": len(e.tunings), "seeds": e.seed_count,
                f"{metric}_by_seed": _by_seed(e, "scores"), "time_by_seed": _by_seed(e, "times"),
                "energy_by_seed": _by_seed(e, "energies"), "mean_energy": _number(e.mean_energy, 6),
                "time_to_target": _number(e.time_to_target, 3),
                "target_reached": f"{reached}/{seeds}" if seeds else "",
                "p_vs_best": _number(e.p, 6), "p_holm": _number(e.p_holm, 6),
                "worse_than_best": "" if e.worse is None else str(e.worse).lower(),
                "validation_value": ";".join(_number(t.validation, 6) for t in e.tunings),
                "tuned": json.dumps(tuned[0] if len(tuned) == 1 else tuned, sort_keys=True),
                "own_knobs": " ".join(e.own), "reason": e.reason, "caveats": " | ".join(e.caveats),
                "planner_knowledge": e.knowledge, "fedhet": ";".join(sorted(e.builds)),
                "failed_trials": e.failed_trials,
                "code": e.code, "settings": e.settings, "canary": e.canary,
                "higher_is_better": str(board.score.higher_is_better).lower(),
            })  # fmt: skip
    return rows


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
    tunings = [{"repeat": i + 1, "params": p, "validation": validation[i], "seeds": {}}
               for i, p in enumerate(params)]  # fmt: skip
    higher = r.get("higher_is_better", "true") == "true"
    times = dict(_pairs(r.get("time_by_seed", "")))
    energies = dict(_pairs(r.get("energy_by_seed") or ""))  # a table written before energy: none
    for key, value in _pairs(r[f"{metric}_by_seed"]):
        repeat, _, seed = key.rpartition("/")
        result = {"score": _score(value, metric, key), "score_metric": metric, "higher_is_better": higher,
                  "time_to_target": float(times[key]) if times.get(key) else None,
                  "energy": float(energies[key]) if energies.get(key) else None,
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
    entries: list[Entry], target: float | None, alpha: float, metric: str = "accuracy"
) -> list[str]:
    """One scenario's table in markdown."""
    target_head = f"time to {target:g} (reached)" if target is not None else "time to target"
    lines = [
        f"| rank | method | test {metric} (95% CI, n seeds) | {target_head} | energy J | p vs best | "
        "p Holm | tuned (validation) |",
        "|---:|---|---|---|---:|---:|---:|---|",
    ]
    for e in sorted(entries, key=_order):
        if e.status != "ok":
            lines.append(f"| – | {e.method} | {e.status}: {e.reason} | | | | | |")
            continue
        interval = f" ± {e.ci95:.4f}" if e.ci95 is not None else ""
        reached, seeds = e.reached
        time = (
            f"{e.time_to_target:.1f} s ({reached}/{seeds})"
            if e.time_to_target is not None
            else f"– (0/{seeds})"
        )
        marker = " **best**" if e.best else (" *worse*" if e.worse else "")
        marker += " ⚠" if e.caveats else ""
        marker += f" (+{len(e.own)} own)" if e.own else ""
        marker += f" (knew: {e.knowledge})" if e.knowledge else ""
        value = f"{e.mean:.4f}{interval} ({_units_text(e)})"
        energy = "–" if e.mean_energy is None else f"{e.mean_energy:.4g}"
        tests = f"{energy} | {_p(e.p)} | {_p(e.p_holm)}"
        lines.append(f"| {e.rank} | {e.method}{marker} | {value} | {time} | {tests} | {_tuned_text(e)} |")
    power = power_line(entries, alpha, metric)
    lines += ["", power] if power else []
    caveats = [(e.method, c) for e in sorted(entries, key=_order) for c in e.caveats]
    if caveats:
        lines += ["", *[f"- ⚠ {method}: {caveat}" for method, caveat in caveats]]
    return lines


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
    repeated = any(not e.paired for entries in board.scenarios.values() for e in entries if e.tunings)
    unit = (
        "mean over its tunings (each tuning's setting run on the seeds; the unit is a tuning's "
        "mean over its seeds) with its 95% Student-t interval over the tunings. p vs best: Welch's "
        "t-test against the scenario's best method over the tunings' means"
        if repeated
        else "mean over seeds with its 95% Student-t interval (n seeds). p vs best: a paired t-test "
        "against the scenario's best method over the seeds both ran"
    )
    lines += [
        f"Test {board.score.metric}: {unit}; p Holm: Holm-corrected within the scenario; "
        f"*worse*: Holm-corrected p < {board.alpha:g}. Every method searches the suite's shared "
        "knobs; (+k own): it searched k knobs of its own besides (the searched line above names "
        "them). ⚠: under this scenario's settings the method is provably another, simpler rule, "
        "or a mechanism of it is inert (the caveat says which). (knew: k): what its planner knew of "
        "clients' speeds when it sized their work: history (their reports), profile (the declared "
        "expectation) or oracle (this round's drawn times). energy J: the joules a seed run spent "
        "(summary.json's energy), the mean over its seed runs.",
        "",
        "## Across scenarios",
        "",
        *across_lines(board),
    ]
    for name, entries in board.scenarios.items():
        description = header.get("scenarios", {}).get(name, "")
        lines += ["", f"## {name}", ""] + ([description, ""] if description else [])
        lines += scenario_lines(entries, header.get("target"), board.alpha, board.score.metric)
    return "\n".join(lines) + "\n"


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
    """The score against simulated time per scenario, and the rank heat-map, as PNGs."""
    from fedhet.studies.plots import _pyplot

    plt = _pyplot()
    metric = f"test {board.score.metric}"
    return [_curves_figure(plt, board, out / "leaderboard-curves.png", board.score.column, metric),
            _curves_figure(plt, board, out / "leaderboard-energy.png", "energy_total", "energy spent (J)"),
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
    import warnings

    from fedhet.studies.plots import algorithm_color

    names = list(board.scenarios)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for method, (grid, mean) in _curves(board.scenarios[name], column).items():
                ax.plot(grid, mean, label=method, color=algorithm_color(method), marker="o", markersize=3,
                        markevery=_evaluations(mean))  # fmt: skip
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(label)
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
