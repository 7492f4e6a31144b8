"""The bench's statistical model (fedhet.bench.model): hierarchical-bootstrap intervals that
stay in the score's range, effects paired by seed against the best and the reference, the
Holm families counted and corrected together; the Kaplan-Meier time to target
(fedhet.bench.survival) and the tuning budget's curves (fedhet.bench.budget)."""

from __future__ import annotations

import numpy as np
import pytest


def _rows(methods: dict[str, list[list[float]]], scenario: str = "s", trials=None) -> list[dict]:
    """Results rows: per method, per tuning, per seed 1.. its score."""
    return [
        {"scenario": scenario, "method": m, "status": "ok", "reason": "", "tunings": [
            {"repeat": r + 1, "params": {}, "validation": 0.5, "trials": (trials or {}).get(m, [[]] * 9)[r],
             "seeds": {s + 1: {"score": v, "score_metric": "accuracy", "higher_is_better": True,
                               "time_to_target": None} for s, v in enumerate(values)}}
            for r, values in enumerate(tunings)]}
        for m, tunings in methods.items()
    ]  # fmt: skip


def _simulated(rng, mu: dict[str, float], tunings: int = 5, seeds: int = 5) -> dict[str, list[list[float]]]:
    """Scores from the model: mu_m + tuning draw + seed draw (shared) + noise, kept in [0, 1]."""
    seed_effect = rng.normal(0.0, 0.03, seeds)
    out = {}
    for method, mean in mu.items():
        rows = []
        for _ in range(tunings):
            tuning = rng.normal(0.0, 0.02)
            rows.append(list(np.clip(mean + tuning + seed_effect + rng.normal(0.0, 0.01, seeds), 0, 1)))
        out[method] = rows
    return out


def test_intervals_stay_in_the_score_range_where_the_t_interval_did_not():
    """Two tunings near zero accuracy: Student's t interval over the tunings' means reaches
    below 0; the bootstrap interval is inside [0, 1] and holds the mean."""
    from scipy import stats

    from fedhet.bench import leaderboard

    methods = {
        "fedavg": [[0.02, 0.01, 0.03], [0.30, 0.28, 0.33]],
        "other": [[0.5, 0.5, 0.52], [0.49, 0.5, 0.5]],
    }
    entry = next(e for e in leaderboard.build(_rows(methods)).scenarios["s"] if e.method == "fedavg")
    means = [np.mean(t) for t in methods["fedavg"]]
    t_low, _ = stats.t.interval(0.95, 1, loc=np.mean(means), scale=stats.sem(means))
    assert t_low < 0
    assert 0.0 <= entry.interval.low <= entry.mean <= entry.interval.high <= 1.0


def test_effects_are_paired_by_seed():
    """Seeds move every method alike (a large shared seed effect) and 'b' is 'a' less 0.01 on
    every seed: each method's own interval is wide and the two overlap, but the effect's
    interval, drawn with the same seeds for both, is narrow and excludes 0."""
    from fedhet.bench import leaderboard

    seed_effect = [0.0, 0.2, -0.15, 0.1, -0.05, 0.12, -0.1]
    a = [[0.6 + e + n for e, n in zip(seed_effect, noise, strict=True)] for noise in ([0.0] * 7, [0.004] * 7)]
    b = [[v - 0.01 for v in tuning] for tuning in a]
    entries = {e.method: e for e in leaderboard.build(_rows({"a": a, "b": b})).scenarios["s"]}
    assert entries["a"].interval.low < entries["b"].interval.high  # the means' intervals overlap
    effect = entries["b"].vs_best
    assert effect.value == pytest.approx(-0.01)
    assert effect.high < 0 and effect.high - effect.low < 0.01


def test_effect_intervals_cover_the_true_difference():
    """Simulated from the model (5 tunings x 5 seeds), the 95% interval of the effect against
    the reference covers the true difference in most of 100 benches (a percentile bootstrap
    of few units under-covers somewhat: at least 80%)."""
    from fedhet.bench import leaderboard

    rng = np.random.default_rng(7)
    covered = 0
    for bench in range(100):
        rows = _rows(_simulated(rng, {"fedavg": 0.70, "new": 0.73}), scenario=f"s{bench}")
        entry = next(e for e in leaderboard.build(rows).scenarios[f"s{bench}"] if e.method == "new")
        covered += entry.vs_reference.low <= 0.03 <= entry.vs_reference.high
    assert covered >= 80


def test_the_reference_is_tested_holm_corrected_and_read_back(tmp_path):
    """Every method against the reference: Welch's p over the tunings' means, Holm-corrected
    over the scenario's methods; the effects read back from leaderboard.csv unchanged; a
    method's own interval does not change when another method joins the scenario."""
    from scipy import stats

    from fedhet.bench import leaderboard
    from fedhet.studies.stats import holm

    methods = _simulated(np.random.default_rng(3), {"fedavg": 0.7, "x": 0.72, "y": 0.75, "z": 0.6})
    board = leaderboard.build(_rows(methods), reference="fedavg")
    entries = {e.method: e for e in board.scenarios["s"]}
    means = {m: [np.mean(t) for t in tunings] for m, tunings in methods.items()}
    raw = [stats.ttest_ind(means[m], means["fedavg"], equal_var=False).pvalue for m in "xyz"]
    assert [entries[m].p_reference for m in "xyz"] == pytest.approx(raw)
    assert [entries[m].p_holm_reference for m in "xyz"] == pytest.approx(holm(raw))
    assert entries["fedavg"].vs_reference is None and entries["y"].vs_best is None
    path = leaderboard.write_csv(board, tmp_path / "leaderboard.csv")
    again = leaderboard.build(leaderboard.read_csv(path))
    assert leaderboard.write_csv(again, tmp_path / "again.csv").read_text() == path.read_text()
    fewer = leaderboard.build(_rows({m: methods[m] for m in ("fedavg", "x")}))
    assert next(e for e in fewer.scenarios["s"] if e.method == "x").interval == entries["x"].interval


def test_the_page_counts_the_families_and_corrects_over_all_of_them():
    """Two scenarios, two questions each: four families; a difference significant within its
    family of three but not over all the tests is counted as lost."""
    from fedhet.bench import leaderboard

    rng = np.random.default_rng(5)
    rows = []
    for name in ("one", "two"):
        rows += _rows(_simulated(rng, {"fedavg": 0.70, "a": 0.71, "b": 0.80, "c": 0.70}), scenario=name)
    board = leaderboard.build(rows)
    families, marks = leaderboard.global_marks(board)
    assert families == 4
    tests = sum(p is not None for es in board.scenarios.values() for e in es for p in (e.p, e.p_reference))
    assert tests == 12
    assert all(overall >= within for _, _, _, within, overall in marks)
    line = leaderboard.families_line(board)
    assert "Holm families: 4" in line and "12 tests" in line


def test_kaplan_meier_censors_the_runs_that_miss_the_target():
    """A method reaching the target in 1 run of 10 has no median (the mean of its hits
    would call it fast); censored runs lower the survival only where they are still at
    risk: hits at 1 and 3, misses ending at 2.5, 30, 30 give S(3) = 0.8 x 2/3 > 1/2."""
    from fedhet.bench.survival import kaplan_meier

    assert kaplan_meier([2.0] + [None] * 9, [30.0] * 10).median is None
    assert kaplan_meier([4.0, 1.0, 3.0, 2.0], [30.0] * 4).median == 2.0
    assert kaplan_meier([1.0, 3.0, None, None, None], [30.0, 30.0, 2.5, 30.0, 30.0]).median is None
    halves = kaplan_meier([1.0, 3.0, 5.0, None], [30.0, 30.0, 30.0, 2.5])
    assert halves.median == 3.0 and (halves.reached, halves.runs) == (3, 4)


def test_budget_curves_follow_the_tunings_best_so_far_and_name_a_change_of_leader():
    """The expected best after n trials is the mean over tunings of the best of their first
    n; 'fast' leads after one trial, 'slow' from the third on; the band holds the mean."""
    from fedhet.bench import leaderboard
    from fedhet.bench.budget import best_so_far, budget_sentence

    assert best_so_far([None, 0.5, 0.4, 0.7], True) == [None, 0.5, 0.5, 0.7]
    assert best_so_far([3.0, 2.0, 4.0], False) == [3.0, 2.0, 2.0]
    trials = {"fast": [[0.7, 0.7, 0.7], [0.68, 0.7, 0.71]], "slow": [[0.5, 0.6, 0.9], [0.4, 0.6, 0.8]]}
    scores = {m: [[0.7, 0.7], [0.7, 0.7]] for m in trials}
    board = leaderboard.build(_rows(scores, trials=trials))
    curves = {c.method: c for c in leaderboard.budget_curves(board, "s")}
    assert curves["slow"].mean == pytest.approx([0.45, 0.6, 0.85])
    assert all(
        lo <= m <= hi
        for lo, m, hi in zip(curves["fast"].low, curves["fast"].mean, curves["fast"].high, strict=True)
    )
    sentence = budget_sentence(list(curves.values()), True)
    assert "changes with the budget, 1 time (" in sentence and "from 3 trials: slow" in sentence


def test_a_suite_reference_must_be_one_of_its_methods(tmp_path):
    """suite.reference names a method of the suite; another is refused in one line; without
    it, FedAvg where the suite runs it."""
    from pathlib import Path

    from fedhet.bench.suite import load_suite
    from fedhet.errors import ConfigError

    smoke = (Path(__file__).parents[1] / "suites" / "smoke.toml").read_text()
    path = tmp_path / "suite.toml"
    assert 'reference = "fedavg"' in smoke
    path.write_text(smoke.replace('reference = "fedavg"', 'reference = "nosuch"', 1))
    with pytest.raises(ConfigError, match="suite.reference = 'nosuch': not a method of the suite"):
        load_suite(path)
    path.write_text(smoke.replace('reference = "fedavg"', "", 1))
    assert load_suite(path).reference == "fedavg"
