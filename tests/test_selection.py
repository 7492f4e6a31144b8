"""Client selection (``[selection] rule``): the default leaves a run as it was, bit for bit;
``uniform`` asks m of the present clients with the cohort's exact marginals;
``power-of-choice`` asks the m highest reported losses among d candidates drawn by data
size (Cho et al., arXiv:2010.01243); a selected run resumes bit-identically; bad options and
an event-driven rule are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import config_from

from fedhet.config import ConfigError, from_dict
from fedhet.engine.loop import RunLoop
from fedhet.system.selection import (
    LeastAvailableFirst,
    Oort,
    OortOptions,
    PowerOfChoice,
    PowerOfChoiceOptions,
    ServerView,
    Tifl,
    TiflOptions,
)
from fedhet.system.types import Workload
from fedhet.world import build_system

BASE = {
    "run": {"seed": 3, "rounds": 8, "eval_every": 4, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 8, "partition": "dirichlet", "alpha": 0.5},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.2, "batch_size": 16},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 0.2},
    "algorithm": {"name": "salf"},
}


def _config(**sections):
    return config_from(BASE, **sections)


def test_the_default_selection_and_uniform_over_everyone_leave_a_run_as_it_was(tmp_path):
    """``rule = "all"`` builds no wrapper and writes no [selection] into the resolved
    configuration; ``uniform`` asking all 8 clients draws its choice from its own stream, so
    the system model's draws, and the run, are those of no selection."""
    plain = RunLoop(_config(), tmp_path / "plain").run()
    explicit = RunLoop(_config(selection={"rule": "all"}), tmp_path / "all").run()
    assert explicit.metrics == plain.metrics
    assert "selection" not in (tmp_path / "all" / "config.toml").read_text()
    everyone = RunLoop(_config(selection={"rule": "uniform", "clients_per_round": 8}), tmp_path / "u8").run()
    assert everyone.metrics == plain.metrics


def test_uniform_asks_m_of_the_present_clients_with_the_cohorts_exact_marginals(tmp_path):
    independent = {"model": "uniform-depth", "deadline": 0.2}  # clients' outcomes drawn independently
    config = config_from(
        {**BASE, "system": independent}, selection={"rule": "uniform", "clients_per_round": 3}
    )
    result = RunLoop(config, tmp_path / "u3").run()
    report = json.loads((tmp_path / "u3" / "selection.json").read_text())
    assert report["inclusion"] == "exact" and sum(report["times_asked"]) == 3 * 8
    assert all(row["participants"] <= 3 for row in result.metrics)
    # over always-present clients, uniform selection is FedAvg's cohort sampling: same marginals
    six = {"data": {"num_clients": 6}}
    plain = from_dict({**six, "system": {"model": "uniform-depth"}})
    cohort = from_dict(
        {**six, "system": {"model": "uniform-depth", "participation": "cohort", "cohort_size": 2}}
    )
    chosen = from_dict({**six, "system": {"model": "uniform-depth"},
                        "selection": {"rule": "uniform", "clients_per_round": 2}})  # fmt: skip
    work = Workload(1.0, np.full(6, 16))
    a, b = build_system(cohort, 6, 4).marginals(work), build_system(chosen, 6, 4).marginals(work)
    np.testing.assert_allclose(b.participation_prob, a.participation_prob)
    np.testing.assert_allclose(b.no_reach_prob, a.no_reach_prob)
    np.testing.assert_allclose(b.reach_prob, a.reach_prob)
    assert not np.allclose(b.no_reach_prob, build_system(plain, 6, 4).marginals(work).no_reach_prob)


def _view(losses, sizes=None) -> ServerView:
    view = ServerView.empty(np.ones(len(losses)) if sizes is None else np.asarray(sizes, float))
    view.loss[:] = losses
    return view


def test_power_of_choice_asks_the_highest_reported_losses_among_its_candidates():
    """With every client a candidate (d = N) the choice is the m highest losses, clients never
    heard from first; with d < N the candidates are a draw without replacement weighted by
    data size, and the choice is the m highest losses among them, by hand."""
    losses = np.array([0.5, 2.0, np.nan, 1.0, 3.0, 0.1])
    present = np.ones(6, dtype=bool)
    rule = PowerOfChoice(PowerOfChoiceOptions(clients_per_round=3, candidates=6))
    chosen = rule.choose(present, _view(losses), np.random.default_rng(0))
    assert sorted(np.flatnonzero(chosen)) == [1, 2, 4]  # nan (never heard), 3.0, 2.0
    absent = present.copy()
    absent[4] = False  # only present clients are candidates
    assert sorted(np.flatnonzero(rule.choose(absent, _view(losses), np.random.default_rng(0)))) == [1, 2, 3]
    sizes = np.array([10, 50, 5, 100, 20, 15], float)
    rule = PowerOfChoice(PowerOfChoiceOptions(clients_per_round=2, candidates=4))
    for seed in range(20):
        chosen = rule.choose(present, _view(losses, sizes), np.random.default_rng(seed))
        candidates = np.random.default_rng(seed).choice(6, 4, replace=False, p=sizes / sizes.sum())
        by_loss = sorted(candidates, key=lambda c: -np.inf if np.isnan(losses[c]) else -losses[c])
        assert sorted(np.flatnonzero(chosen)) == sorted(by_loss[:2])


def test_oorts_utility_and_choice_by_hand():
    """Util(i) = n_i loss_i (T/t_i)^alpha [t_i > T] + sqrt(0.1 ln R / L_i) with T the median
    reported duration; with no exploration and cutoff 1 the K highest utilities are asked;
    with full exploration only clients never asked are; the pacer moves T's percentile up
    after a window that gathered less statistical utility than the one before."""
    view = _view([1.0, 2.0, 0.5, 1.5], sizes=[10, 10, 40, 20])
    view.duration[:] = [1.0, 4.0, 2.0, 3.0]
    view.last_asked[:] = [0, 1, 2, 3]
    view.round = 5
    rule = Oort(OortOptions(clients_per_round=2, exploration=0.0, exploration_min=0.0, cutoff=1.0))
    preferred = 2.5  # the median of 1, 2, 3, 4
    penalty = np.array([1.0, (preferred / 4.0) ** 2, 1.0, (preferred / 3.0) ** 2])
    expected = np.array([10, 20, 20, 30.0]) * penalty + np.sqrt(0.1 * np.log(5) / np.array([1, 2, 3, 4.0]))
    np.testing.assert_allclose(rule.utility(view), expected)
    chosen = rule.choose(np.ones(4, bool), view, np.random.default_rng(0))
    assert sorted(np.flatnonzero(chosen)) == sorted(np.argsort(-expected)[:2])
    fresh = _view([1.0, np.nan, np.nan, 2.0])
    fresh.last_asked[:] = [0, -1, -1, 0]
    explore = Oort(OortOptions(clients_per_round=2, exploration=1.0))
    assert sorted(np.flatnonzero(explore.choose(np.ones(4, bool), fresh, np.random.default_rng(1)))) == [1, 2]
    pacer = Oort(OortOptions(pacer_window=2, pacer_step=10.0))
    for round_index, gathered in enumerate([5.0, 5.0, 1.0, 1.0], start=1):
        seen = _view([gathered, np.nan])
        seen.round = round_index
        pacer.observe(seen, np.array([True, False]))
    assert pacer.percentile == 60.0  # the second window (2) fell below the first (10)


def test_tifl_profiles_every_client_then_asks_one_tier_drawn_worst_first():
    rule = Tifl(TiflOptions(clients_per_round=2, tiers=2, interval=5))
    view = _view([np.nan] * 6)
    present = np.ones(6, bool)
    assert rule.choose(present, view, np.random.default_rng(0)).sum() == 2  # profiling: unknown first
    view.times_asked[:] = 1  # profiled: every client asked once, and heard from
    view.duration[:] = [1.0, 5.0, 2.0, 6.0, 3.0, 7.0]  # tier 0 = {0, 2, 4}, tier 1 = {1, 3, 5}
    view.loss[:] = [0.2, 2.0, 0.3, 2.5, 0.1, 1.5]  # the slow tier does worse: drawn with 2/3
    draws = [
        frozenset(np.flatnonzero(rule.choose(present, view, np.random.default_rng(s)))) for s in range(300)
    ]
    assert rule.tier_of == [0, 1, 0, 1, 0, 1] and rule.probabilities == pytest.approx([1 / 3, 2 / 3])
    assert all(d <= {0, 2, 4} or d <= {1, 3, 5} for d in draws) and all(len(d) == 2 for d in draws)
    slow_share = np.mean([d <= {1, 3, 5} for d in draws])
    assert abs(slow_share - 2 / 3) < 4.5 * np.sqrt(2 / 9 / 300)


def test_a_client_asked_but_never_heard_from_is_neither_profiled_again_nor_ranked_first():
    """TiFL: a client asked during profiling that never reported missed its deadline: a
    dropout, in no tier and never drawn. Power-of-choice: its unknown loss ranks it last,
    where a client never asked ranks first. (Asking it round after round left rules that
    discard stragglers with empty rounds.)"""
    view = _view([0.2, np.nan, 0.3, np.nan, 0.1, 1.5])
    view.duration[:] = [1.0, np.nan, 2.0, np.nan, 3.0, 7.0]
    view.times_asked[:] = [1, 1, 1, 0, 1, 1]  # client 1 silent; client 3 never asked
    present = np.ones(6, bool)
    tifl = Tifl(TiflOptions(clients_per_round=2, tiers=2, interval=5))
    assert np.flatnonzero(tifl.choose(present, view, np.random.default_rng(0))).tolist() == [3]  # profiling
    view.times_asked[3] = 1
    view.duration[3], view.loss[3] = 4.0, 0.4
    draws = [
        frozenset(np.flatnonzero(tifl.choose(present, view, np.random.default_rng(s)))) for s in range(50)
    ]
    assert tifl.tier_of[1] == -1 and all(1 not in d for d in draws)
    pow_d = PowerOfChoice(PowerOfChoiceOptions(clients_per_round=5, candidates=6))
    view.loss[3] = np.nan
    view.times_asked[3] = 0  # never asked again: first; the silent client 1: last
    chosen = np.flatnonzero(pow_d.choose(present, view, np.random.default_rng(0))).tolist()
    assert 3 in chosen and 1 not in chosen


def test_refl_asks_the_least_available_present_clients_first(tmp_path):
    """The m present clients seen present least often so far; in a run where half the
    clients are present one round in ten, each of them is asked in every round it is present
    (m = 4: the four rare clients are never more than the m asked)."""
    from fedhet.system.selection import UniformOptions

    view = _view([np.nan] * 4)
    view.times_present[:] = [5, 1, 3, 0]
    view.round = 5
    rule = LeastAvailableFirst(UniformOptions(clients_per_round=2))
    assert sorted(np.flatnonzero(rule.choose(np.ones(4, bool), view, np.random.default_rng(0)))) == [1, 3]
    rare = {"participation": "two-group", "participation_min": 0.1, "participation_group": "second-half"}
    config = _config(run={"rounds": 30}, algorithm={"name": "fedavg"}, system=rare,
                     selection={"rule": "refl", "clients_per_round": 4})  # fmt: skip
    RunLoop(config, tmp_path / "refl").run()
    report = json.loads((tmp_path / "refl" / "selection.json").read_text())
    asked, present = np.array(report["times_asked"]), np.array(report["times_present"])
    assert np.array_equal(asked[4:], present[4:])  # 4 rare clients, 4 asked: a present one is always asked
    assert present[4:].sum() > 0 and (asked[:4] < present[:4]).all()


@pytest.mark.parametrize(
    "selection",
    [
        {"rule": "power-of-choice", "clients_per_round": 2, "candidates": 5},
        {"rule": "oort", "clients_per_round": 3, "pacer_window": 3},
        {"rule": "tifl", "clients_per_round": 2, "tiers": 3, "interval": 3},
        {"rule": "refl", "clients_per_round": 3},
    ],
    ids=lambda s: s["rule"],
)
def test_a_selected_run_resumes_bit_identically(tmp_path, selection):
    config = _config(run={"rounds": 10}, algorithm={"name": "fedavg"}, selection=selection)
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=4)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    report = json.loads((tmp_path / "whole" / "selection.json").read_text())
    assert report["inclusion"] == "estimated from the rounds so far" and report["rounds"] == 10
    assert sum(report["times_asked"]) <= selection["clients_per_round"] * 10


@pytest.mark.parametrize(
    ("selection", "algorithm", "message"),
    [
        ({"rule": "oortt"}, "salf", "selection.rule = 'oortt': unknown"),
        ({"rule": "uniform", "clients_per_round": 0}, "salf", "selection.clients_per_round = 0"),
        ({"rule": "power-of-choice", "clients_per_round": 3, "candidates": 2}, "salf",
         "selection.candidates = 2: must be >= selection.clients_per_round"),
        ({"rule": "uniform", "clients_per_round": 2}, "fedbuff", "an event-driven rule"),
        ({"rule": "oort", "exploration": 1.5}, "salf", "selection.exploration = 1.5"),
        ({"rule": "oort", "pacer_window": 0}, "salf", "selection.pacer_window = 0"),
        ({"rule": "tifl", "tiers": 0}, "salf", "selection.tiers = 0"),
    ],
)  # fmt: skip
def test_bad_selections_are_refused_in_one_line(selection, algorithm, message):
    with pytest.raises(ConfigError, match=message) as caught:
        _config(selection=selection, algorithm={"name": algorithm})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("selection", "words"),
    [
        ({"rule": "tifl", "tiers": 11, "clients_per_round": 2},
         "selection.tiers = 11: more tiers than the run's 10"),
        ({"rule": "oort", "exploration": 0.1, "exploration_min": 0.3},
         "selection.exploration_min = 0.3: above selection.exploration = 0.1"),
        ({"rule": "uniform", "clients_per_round": 11},
         "selection.clients_per_round = 11: more than the run's 10 clients"),
        ({"rule": "power-of-choice", "clients_per_round": 3, "candidates": 12},
         "selection.candidates = 12: more than the run's 10 clients"),
    ],
)  # fmt: skip
def test_selection_options_that_contradict_the_cohort_or_each_other_are_one_line(selection, words):
    from conftest import make_config

    base = make_config().to_dict()
    with pytest.raises(ConfigError) as err:
        from_dict({**base, "selection": selection})
    assert words in str(err.value) and "\n" not in str(err.value)


def test_tiers_too_small_for_the_clients_asked_are_a_caveat_of_the_run(tmp_path):
    """TiFL asks all of a round's clients from one tier: with 10 clients in 5 tiers (2 each)
    a round asks at most 2, not clients_per_round = 3; the run says so, and not when the
    tiers hold enough."""
    from conftest import make_config

    from fedhet.engine.launch import run

    base = {**make_config().to_dict(), "run": {**make_config().to_dict()["run"], "rounds": 2}}
    small = run(from_dict({**base, "selection": {"rule": "tifl", "tiers": 5, "clients_per_round": 3}}),
                tmp_path / "small").summary  # fmt: skip
    said = [c for c in small.get("caveats", []) if c.startswith("selection.clients_per_round = 3")]
    assert len(said) == 1 and "leave 2 in the smallest" in said[0]
    enough = run(from_dict({**base, "selection": {"rule": "tifl", "tiers": 3, "clients_per_round": 3}}),
                 tmp_path / "enough").summary  # fmt: skip
    assert not [c for c in enough.get("caveats", []) if c.startswith("selection.clients_per_round")]
