"""The leaderboard across scenarios: Friedman's test over the scenarios (blocks) with
Nemenyi's critical difference, which states the smallest difference of mean ranks the
scenarios can tell apart (Demšar, JMLR 2006)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import friedmanchisquare

from fedhet.bench import leaderboard
from fedhet.bench.aggregate import friedman, nemenyi_critical_difference

# six scenarios; "best" ahead everywhere, "worst" behind everywhere, two in between that swap
MEANS = {
    f"s{i}": {"best": 0.90 + 0.01 * i, "mid-a": 0.80 + 0.02 * (i % 2), "mid-b": 0.81 - 0.02 * (i % 2),
              "worst": 0.50, **({"partial": 0.95} if i < 2 else {})}
    for i in range(6)
}  # fmt: skip


def test_nemenyi_critical_difference_is_demsars():
    """q_0.05 / sqrt(2) for k = 4 is 2.569 in Demšar's Table 5; CD = q sqrt(k(k+1)/(6N))."""
    assert nemenyi_critical_difference(4, 6, 0.05) == pytest.approx(2.569 * math.sqrt(4 * 5 / 36), abs=1e-3)
    assert nemenyi_critical_difference(10, 14, 0.05) == pytest.approx(
        3.164 * math.sqrt(10 * 11 / 84), abs=1e-3
    )


def test_friedman_over_the_methods_in_every_scenario_and_who_is_told_apart_from_the_best():
    test = friedman(MEANS, higher_is_better=True, alpha=0.05)
    assert test is not None and test.left_out == ["partial"]  # not in every scenario
    assert test.methods == ["best", "mid-a", "mid-b", "worst"]
    columns = [[MEANS[s][m] for s in MEANS] for m in test.methods]
    assert test.statistic == pytest.approx(friedmanchisquare(*columns).statistic)
    assert test.p == pytest.approx(friedmanchisquare(*columns).pvalue)
    assert test.mean_ranks["best"] == 1.0 and test.mean_ranks["worst"] == 4.0
    assert test.mean_ranks["mid-a"] == test.mean_ranks["mid-b"] == 2.5
    assert test.critical_difference == pytest.approx(nemenyi_critical_difference(4, 6, 0.05))
    assert test.near_best("mid-a") and not test.near_best("worst") and test.near_best("partial") is None
    lower = friedman(MEANS, higher_is_better=False, alpha=0.05)  # an RMSE: the lowest first
    assert lower is not None and lower.mean_ranks["worst"] == 1.0 and lower.mean_ranks["best"] == 4.0
    assert friedman({"s0": MEANS["s0"]}, True, 0.05) is None  # one scenario: no test


def test_the_page_states_the_test_and_its_critical_difference():
    rows = [
        {"scenario": s, "method": m, "status": "ok", "reason": "", "tunings": [
            {"repeat": 1, "params": {"train.lr": 0.1}, "validation": 0.5,
             "seeds": {k: {"score": v + 0.001 * k, "score_metric": "accuracy", "higher_is_better": True,
                           "time_to_target": None} for k in (1, 2, 3)}}]}
        for s, row in MEANS.items() for m, v in row.items()
    ]  # fmt: skip
    board = leaderboard.build(rows)
    text = "\n".join(leaderboard.across_lines(board))
    assert "Friedman's test over the 6 scenarios (blocks) of the 4 methods" in text
    assert f"{board.across.critical_difference:.2f} mean ranks" in text
    assert (
        "| worst |" in text and "| no |" in text and "| partial |" in text and "not in every scenario" in text
    )


def test_the_tunings_of_different_methods_are_independent_draws():
    """Each tuning's sampler is seeded by the suite's seed, the repeat and the method: two
    methods' R-th tunings no longer start from the same trials (a test over tunings treats
    them as independent), a method's tuning is seeded alike wherever it runs, and every
    seed is within what the sampler takes."""
    from conftest import SMOKE_SUITE

    from fedhet.bench.study import sampler_seed, settings_fingerprint
    from fedhet.bench.suite import Tuning, load_suite

    suite = load_suite(SMOKE_SUITE)
    scenario = suite.scenarios[0]
    seeds = {
        (m.label, r): sampler_seed(suite, Tuning(scenario, m, r)) for m in suite.methods for r in (1, 2, 5)
    }
    assert len(set(seeds.values())) == len(seeds)  # no two (method, repeat) share a sampler
    assert all(0 <= s < 2**32 for s in seeds.values())
    again = load_suite(SMOKE_SUITE)
    assert (
        sampler_seed(again, Tuning(again.scenarios[0], again.methods[0], 1))
        == seeds[(suite.methods[0].label, 1)]
    )
    assert suite.tuning_repeats == 5  # the shipped suites tune every method five times
    assert settings_fingerprint(suite, scenario, suite.methods[0]) != settings_fingerprint(
        suite, scenario, suite.methods[1]
    )


def test_the_detectable_difference_is_the_t_tests_at_80_percent_power():
    """Cohen's d a two-sided t-test at 0.05 detects with 80% power: 0.736 with 30 units a
    group, 2.02 with 5, 5.65 with 2; a smaller alpha (Holm's first step) needs more."""
    from fedhet.bench.aggregate import detectable_difference, t_test_power

    assert detectable_difference(1.0, 30, 0.05) == pytest.approx(0.736, abs=2e-3)
    assert detectable_difference(1.0, 5, 0.05) == pytest.approx(2.024, abs=2e-3)
    assert detectable_difference(2.0, 2, 0.05) == pytest.approx(2 * 5.653, abs=1e-2)
    assert detectable_difference(1.0, 2, 0.05 / 20) > detectable_difference(1.0, 2, 0.05)
    assert t_test_power(0.0, 8, 0.05) == pytest.approx(0.05, abs=1e-3)  # no difference: alpha
    assert detectable_difference(1.0, 1, 0.05) is None


def test_a_scenario_tuned_several_times_states_what_it_can_detect():
    """With R > 1 tunings the scenario's table is followed by the difference its test detects
    with 80% power (the pooled spread of the tunings' means); tuned once, nothing is stated."""

    def rows(tunings: int) -> list[dict]:
        return [
            {"scenario": "s", "method": m, "status": "ok", "reason": "", "tunings": [
                {"repeat": r, "params": {"train.lr": 0.1}, "validation": 0.5,
                 "seeds": {k: {"score": v + 0.01 * r + 0.001 * k, "score_metric": "accuracy",
                               "higher_is_better": True, "time_to_target": None} for k in (1, 2, 3)}}
                for r in range(1, tunings + 1)]}
            for m, v in (("a", 0.8), ("b", 0.7), ("c", 0.6))
        ]  # fmt: skip

    board = leaderboard.build(rows(5))
    line = leaderboard.power_line(board.scenarios["s"], board.alpha)
    assert line is not None and "with 5 tunings per method" in line and "(0.05/2)" in line
    page = "\n".join(leaderboard.scenario_lines(board.scenarios["s"], None, board.alpha))
    assert line in page
    # without the tuned column (a page of many methods): every row has the header's cells
    short = leaderboard.scenario_lines(board.scenarios["s"], None, board.alpha, tuned=False)
    table = [row for row in short if row.startswith("|")]
    assert "tuned (validation)" in page and "tuned (validation)" not in table[0]
    assert {row.count("|") for row in table} == {table[0].count("|")} == {13}
    assert "lr=0.1 (0.5000)" in page and "lr=0.1" not in "\n".join(short)
    once = leaderboard.build(rows(1))
    assert leaderboard.power_line(once.scenarios["s"], once.alpha) is None


def test_a_bench_trial_killed_between_two_draws_is_drawn_again_whole():
    """A kill can land between two of a trial's draws. ``fedhet tune`` queues the values
    drawn so far; a bench, whose sampler is seeded by the trial's index, queues only a
    complete set (else the trial of that index would draw its last value from another
    point of the sampler's stream than the uninterrupted bench did), and draws it again."""
    import optuna

    from fedhet.studies.trials import interrupted, requeue_interrupted

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for searched, queued in ((None, 1), (frozenset({"train.lr", "algorithm.trim"}), 0)):
        study = optuna.create_study()
        trial = study.ask()
        trial.suggest_float("train.lr", 0.01, 0.1)  # killed before algorithm.trim was drawn
        assert requeue_interrupted(study, searched) == [trial.number] and interrupted(study) == {trial.number}
        waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        assert len(waiting) == queued
    whole = optuna.create_study()
    trial = whole.ask()
    trial.suggest_float("train.lr", 0.01, 0.1)
    trial.suggest_float("algorithm.trim", 0.0, 0.4)
    requeue_interrupted(whole, frozenset({"train.lr", "algorithm.trim"}))
    assert len(whole.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1  # complete: run again
