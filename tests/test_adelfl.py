"""ADEL-FL: the planner's solution satisfies Problem 2's constraints and beats equal
deadlines; deadlines follow the learning rate (ADEL-FL Fig. 2a); the layer-wise rule with
Lemma 1's p_l is unbiased for ADEL-FL's batch sizes; runs keep the budget and report the plan."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
import torch
from conftest import make_config
from scipy.special import gammaincc

from fedhet.algorithms import ALGORITHMS, RoundContext, RoundPlan
from fedhet.algorithms.deadline_planner import (
    BoundConstants,
    DeadlineProblem,
    batch_sizes,
    equal_deadlines,
    solve,
)
from fedhet.config import TrainConfig, build_options
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models.layers import LayerSlices, ModelLayout
from fedhet.system import ExponentialLayers, Workload

CAPS = np.random.default_rng(3).uniform(0.1, 1.9, 20)
CAPS = CAPS / CAPS.mean()


def _problem(rounds=60, schedule="inverse", lr=0.5, layers=3, budget=None, **constants):
    steps = np.arange(rounds)
    rates = lr / (1.0 + steps) if schedule == "inverse" else np.full(rounds, lr)
    return DeadlineProblem(
        time_budget=budget or rounds * 16 * 1.2,
        num_layers=layers,
        capabilities=CAPS,
        time_per_sample_layer=1.0,
        learning_rates=rates,
        constants=BoundConstants(**{"grad_variance": 20.0, "grad_bound": 2.0, **constants}),
        batch_scale_bounds=(1.0, 64.0),
        p1_max=0.45,
    )


@pytest.mark.parametrize("layers", [3, 4, 8])
def test_solution_meets_constraints_and_beats_equal_deadlines(layers):
    problem = _problem(layers=layers)
    plan = solve(problem, initial_batch_scale=16.0)
    assert plan.status == "optimal", plan.solver_message
    assert plan.deadlines.sum() <= problem.time_budget * (1 + 1e-12)  # sum_t T_t <= T_max
    assert 1.0 <= plan.batch_scale <= 64.0  # m in its box
    q1 = problem.no_reach_prob(plan.deadlines, plan.batch_scale)[:, 0]
    assert np.all(q1 <= 0.45 + 1e-9) and np.all(q1 < 0.5)  # Lemma 3's p_1 < 1/2, with margin
    assert np.all(plan.deadlines >= problem.min_deadline(plan.batch_scale) * (1 - 1e-9))
    equal = problem.objective(equal_deadlines(problem), 16.0)
    assert plan.objective <= equal
    assert plan.objective == pytest.approx(problem.objective(plan.deadlines, plan.batch_scale))


def test_deadlines_decrease_under_a_decaying_learning_rate():
    plan = solve(_problem(schedule="inverse"), initial_batch_scale=16.0)
    steps = np.diff(plan.deadlines)
    assert np.all(steps <= 1e-6 * plan.deadlines[0])  # ADEL-FL Fig. 2a: non-increasing
    assert plan.deadlines[0] > 1.3 * plan.deadlines[-1]  # and really decreasing


def test_deadlines_grow_under_a_constant_learning_rate():
    """With eta constant, later rounds weigh more in Theorem 1 (prod (1 - eta rho_c) shrinks
    earlier terms), so the planner must give them more time."""
    plan = solve(_problem(schedule="constant", lr=0.05, rho_c=2.0), initial_batch_scale=16.0)
    assert np.all(np.diff(plan.deadlines) >= -1e-6 * plan.deadlines[-1])
    assert plan.deadlines[-1] > plan.deadlines[0]


def test_analytic_gradient_matches_finite_differences():
    problem = _problem(rounds=12, initial_distance=1e-3)
    deadlines = np.linspace(16, 11, 12)  # rates T/(tau m) near Lemma 3's limit: steep terms
    m = 8.0
    _, grad_t, grad_m = problem._objective_and_gradient(deadlines, m)
    eps = 1e-4
    for t in (0, 5, 11):
        bump = np.zeros(12)
        bump[t] = eps
        up, down = problem.objective(deadlines + bump, m), problem.objective(deadlines - bump, m)
        numeric = (up - down) / (2 * eps)
        assert grad_t[t] == pytest.approx(numeric, rel=1e-4)
    numeric_m = (problem.objective(deadlines, m + eps) - problem.objective(deadlines, m - eps)) / (2 * eps)
    assert grad_m == pytest.approx(numeric_m, rel=1e-4)


def test_no_reach_prob_is_lemma_1():
    problem = _problem(layers=4)
    q = problem.no_reach_prob(np.array([20.0]), 8.0)[0]
    expected = [gammaincc(4 + 1 - l, 20.0 / 8.0) ** 20 for l in range(1, 5)]
    assert q == pytest.approx(expected)
    assert np.all(np.diff(q) < 0)  # shallow layers are the least likely to be reached


def test_solver_failure_falls_back_to_equal_deadlines_and_says_so():
    problem = _problem()
    plan = solve(problem, initial_batch_scale=16.0, max_iter=1)
    assert plan.fell_back and "not converged" in plan.status
    assert np.allclose(plan.deadlines, problem.time_budget / problem.num_rounds)


def test_a_solve_out_of_time_keeps_its_best_feasible_iterate_or_falls_back():
    """The planner stops each trust-constr solve at ``time_limit`` seconds: what it returns
    then still meets the budget, and is either the last iterate (better than equal
    deadlines, said in ``status``) or the announced fallback to equal deadlines."""
    import time

    problem = _problem()
    started = time.monotonic()
    plan = solve(problem, initial_batch_scale=16.0, time_limit=0.0)
    assert time.monotonic() - started < 30
    assert plan.status.startswith("time limit: best iterate") or plan.fell_back
    assert plan.deadlines.sum() <= problem.time_budget * (1 + 1e-9)
    if not plan.fell_back:
        assert plan.objective <= plan.equal_deadlines_objective * (1 + 1e-9)
        assert plan.iterations <= 2
    full = solve(problem, initial_batch_scale=16.0)
    assert full.status == "optimal" and full.objective <= plan.objective * (1 + 1e-9)


def test_budget_too_small_for_lemma_3_is_a_clear_error():
    with pytest.raises(ConfigError, match="run.time_budget .* too small"):
        solve(_problem(budget=60 * 0.5), initial_batch_scale=16.0)


def test_batch_sizes_are_ceil_m_p_bounded_by_data():
    sizes = batch_sizes(2.5, np.array([0.1, 1.0, 1.9, 4.0]), np.array([100, 100, 100, 7]))
    assert sizes.tolist() == [1, 3, 5, 7]


def _layout(sizes=(3, 2, 4, 2)):
    bounds, off = [], 0
    for n in sizes:
        bounds.append((off, off + n))
        off += n
    return ModelLayout(LayerSlices(tuple(bounds)), LayerSlices(tuple((0, 0) for _ in sizes)))


def _aggregate_monte_carlo(caps, batch_scale, options, deadline, draws=12000):
    """Monte-Carlo mean of adel-fl's aggregate over exponential outcome draws, FedAvg's
    model and the standard error, for fixed client updates."""
    U, L = len(caps), 4
    system = ExponentialLayers(U, L, np.asarray(caps), time_per_sample_layer=0.1)
    sizes = batch_sizes(batch_scale, np.asarray(caps), np.full(U, 100))
    layout = _layout()
    gen = torch.Generator().manual_seed(0)
    params = torch.randn(layout.num_params, generator=gen)
    deltas = torch.randn(U, layout.num_params, generator=gen)
    algorithm = ALGORITHMS["adel-fl"](build_options("adel-fl", options), TrainConfig())
    marginals = system.marginals(Workload(deadline, sizes))
    assert marginals.no_reach_prob[0] > 0.05  # the correction matters in this setting
    plan = RoundPlan(0, deadline, 0.1, [])
    rng = np.random.default_rng(0)
    empty = torch.zeros(0)
    results = torch.zeros(draws, layout.num_params)
    for i in range(draws):
        out = system.sample(Workload(deadline, sizes), rng)
        updates = [
            ClientUpdate(
                u, Coverage(int(d)), 1, 1, 0.0, deltas[u, layout.param_slices.start(int(d)) :], empty
            )
            for u, d in enumerate(out.depth)
        ]
        results[i], _ = algorithm.aggregate(
            params, empty, updates, {}, RoundContext(plan, out, marginals, U, L), layout
        )
    return results.mean(0), params + deltas.mean(0), results.std(0) / np.sqrt(draws)


EXCHANGEABLE = [0.5, 1.0, 1.5, 0.5, 1.0, 1.5]  # m P_u integral at m = 2: every S_u / P_u = m
UNEQUAL = [0.3, 0.6, 0.9, 1.1, 1.4, 1.7]  # ceil(m P_u) makes S_u / P_u differ between clients


@pytest.mark.parametrize(
    ("caps", "normalize"),
    [(EXCHANGEABLE, "reached"), (EXCHANGEABLE, "inverse-reach"), (UNEQUAL, "inverse-reach")],
)
def test_layerwise_rule_with_lemma_1_p_l_is_unbiased(caps, normalize):
    """ADEL-FL Lemma 2: E[w~_{t+1}] = FedAvg's w_{t+1}. The paper's rule needs exchangeable
    clients (equal S_u / P_u, as the paper assumes); the inverse-reach weighting does not."""
    mean, fedavg, stderr = _aggregate_monte_carlo(caps, 2.0, {"normalize": normalize}, deadline=0.5)
    assert torch.all((mean - fedavg).abs() <= 4.5 * stderr + 1e-4), (mean - fedavg, stderr)


def test_paper_rule_is_biased_when_rounding_makes_clients_unequal():
    """With S_u = ceil(m P_u), clients' mean layer times differ, U_l is no longer a uniformly
    random subset, and the mean over U_l leans towards the clients that reach l more often."""
    mean, fedavg, stderr = _aggregate_monte_carlo(UNEQUAL, 3.0, {}, deadline=0.9)
    assert torch.any((mean - fedavg).abs() > 6 * stderr + 1e-3)


ADEL = {
    "run.rounds": 20,
    "run.time_budget": 480.0,
    "run.eval_every": 10,
    "data.num_clients": 8,
    "train.lr": 0.5,
    "train.lr_schedule": "inverse",
    "system.model": "exponential",
    "system.deadline": 0.0,
    "system.capability_profile": "uniform",
    "system.capability_low": 0.2,
    "system.capability_high": 1.8,
    "algorithm.name": "adel-fl",
}


def test_adel_fl_run_follows_its_plan_within_the_budget(tmp_path):
    result = run(make_config({**ADEL, "algorithm.estimate_constants": True}), tmp_path / "a")
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert plan["status"] == "optimal"
    assert plan["estimated"] is not None and plan["constants"]["grad_bound"] > 0
    assert sum(plan["deadlines"]) <= 480.0 * (1 + 1e-12)
    assert plan["batch_sizes"] == batch_sizes(plan["batch_scale"], plan["capabilities"], [1000] * 8).tolist()
    rows = result.metrics
    assert len(rows) == 20 and result.summary["sim_time"] <= 480.0 * (1 + 1e-12)
    assert [r["deadline"] for r in rows] == pytest.approx(plan["deadlines"])
    assert all(r["round_time"] <= r["deadline"] + 1e-9 for r in rows)
    assert result.summary["final_test_accuracy"] > 0.2  # it learns (10 classes)


def test_adel_fl_resume_does_not_replan_and_matches(tmp_path):
    config = make_config(ADEL)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=7)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics


def test_equal_share_deadline_for_baselines(tmp_path):
    result = run(make_config({**ADEL, "algorithm.name": "salf"}), tmp_path / "s")
    assert {r["deadline"] for r in result.metrics} == {24.0}  # T_max / R


def test_the_authors_salf_baseline_has_equal_deadlines_and_capability_batches(tmp_path):
    """plan = "equal", batch_scale = 1: T_t = T_max / R every round and S_u = ceil(P_u), with
    no optimisation (the "SALF" of the ADEL-FL authors' plots)."""
    config = make_config({**ADEL, "algorithm.plan": "equal", "algorithm.batch_scale": 1.0})
    result = run(config, tmp_path / "e")
    plan = json.loads((tmp_path / "e" / "plan.json").read_text())
    assert plan["status"].startswith("equal deadlines") and plan["iterations"] == 0
    assert plan["deadlines"] == [24.0] * 20 and plan["batch_scale"] == 1.0
    assert plan["batch_sizes"] == [math.ceil(p - 1e-9) for p in plan["capabilities"]]
    assert {r["deadline"] for r in result.metrics} == {24.0}
    assert not any("planner" in n for n in result.summary.get("notes", []))
    with pytest.raises(ConfigError, match="algorithm.plan = 'fixed'"):
        make_config({**ADEL, "algorithm.plan": "fixed"})


def test_the_time_aware_schedule_is_a_fixed_point_of_plan_and_rates(tmp_path):
    """time_aware_lr: round t's rate is the inverse schedule at the planned time before t in
    units of T_max / R, for the plan solved with those rates; long early deadlines make the
    rates fall faster than per round. Under equal deadlines it is the per-round schedule."""
    result = run(make_config({**ADEL, "algorithm.time_aware_lr": True}), tmp_path / "t")
    plan = json.loads((tmp_path / "t" / "plan.json").read_text())
    deadlines = np.array(plan["deadlines"])
    before = np.concatenate([[0.0], np.cumsum(deadlines)[:-1]]) / 24.0  # T_max / R = 24
    np.testing.assert_allclose(plan["learning_rates"], 0.5 / (1.0 + before), rtol=1e-5)
    assert 1 < plan["time_aware_solves"] < 20 and deadlines[0] > 24.0
    assert plan["learning_rates"][1] < 0.5 / 2  # the first round is long: the rate fell further
    assert [r["lr"] for r in result.metrics] == pytest.approx(plan["learning_rates"])
    equal = {**ADEL, "algorithm.time_aware_lr": True, "algorithm.plan": "equal"}
    run(make_config(equal), tmp_path / "e")
    plan = json.loads((tmp_path / "e" / "plan.json").read_text())
    np.testing.assert_allclose(plan["learning_rates"], [0.5 / (1 + t) for t in range(20)], rtol=1e-12)


def test_planner_fallback_is_announced(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        result = run(make_config({**ADEL, "algorithm.max_iter": 1}), tmp_path / "f")
    assert any("equal deadlines" in r.message for r in caplog.records)
    assert any("equal deadlines" in n for n in result.summary["notes"])
    plan = json.loads((tmp_path / "f" / "plan.json").read_text())
    assert plan["status"].startswith("fallback")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"system.model": "straggler-ratio", "system.deadline": 1.0}, "exponential"),
        ({"run.time_budget": 0.0, "system.deadline": 1.0}, "time budget"),
        ({"algorithm.p1_margin": 0.6}, "p1_margin"),
        ({"algorithm.rho_c": 4.0}, "rho_c"),
    ],
)
def test_bad_adel_fl_settings_are_named(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run(make_config({**ADEL, **overrides}), tmp_path / "x")


def test_depth_calibration_hits_the_requested_share():
    """deadline_for_depth_fraction inverts the expected depth, which a simulation confirms."""
    from fedhet.system import deadline_for_depth_fraction, expected_depth_fraction

    system = ExponentialLayers(20, 4, CAPS, time_per_sample_layer=0.1)
    batch = np.full(20, 16)
    deadline = deadline_for_depth_fraction(system, batch, 0.5)
    assert expected_depth_fraction(system, deadline, batch) == pytest.approx(0.5, abs=1e-9)
    rng = np.random.default_rng(0)
    done = [(4 + 1 - system.sample(Workload(deadline, batch), rng).depth).mean() / 4 for _ in range(4000)]
    assert np.mean(done) == pytest.approx(0.5, abs=0.01)
