"""AMSFL (AMSFL Sec. 3, Algorithm 1): the greedy step allocation respects the time budget;
the printed rule feeds slow clients and the marginal rule fast ones; GDA recovers the
smoothness of a quadratic; runs keep S, the clock and the budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.algorithms import ALGORITHMS
from fedhet.algorithms.amsfl import StepCostEstimator, gda_estimates, greedy_steps
from fedhet.config import TrainConfig, build_options
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, ClientUpdate, Coverage


@pytest.mark.parametrize("allocation", ["marginal", "paper"])
def test_greedy_respects_the_budget(allocation):
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 8))
        c, b = rng.uniform(0.05, 1.0, n), rng.uniform(0.0, 0.3, n)
        w = rng.dirichlet(np.ones(n))
        budget = float(np.sum(c + b) * rng.uniform(1.0, 6.0))
        steps = greedy_steps(w, c, b, budget, alpha=1.0, beta=0.01, allocation=allocation, max_steps=40)
        assert np.all(steps >= 1)
        assert np.sum(c * steps + b) <= budget * (1 + 1e-12)
        if allocation == "paper":  # it fills the budget: no further step fits
            assert np.all((np.sum(c * steps + b) + c > budget) | (steps == 40))


def test_printed_rule_feeds_slow_clients_and_marginal_rule_fast_ones():
    """Two equal-weight clients, one 4x slower: Algorithm 1 as printed (divide by c_i)
    gives the slow client more steps; the marginal rule gives the fast one more."""
    w, c, b = np.array([0.5, 0.5]), np.array([0.1, 0.4]), np.zeros(2)
    paper = greedy_steps(w, c, b, 3.0, alpha=1.0, beta=0.05, allocation="paper")
    marginal = greedy_steps(w, c, b, 3.0, alpha=1.0, beta=0.05, allocation="marginal")
    assert paper[1] > paper[0]
    assert marginal[0] > marginal[1]


def test_marginal_rule_matches_its_closed_form():
    """With a budget that does not bind, every client stops where the net gain of another
    step, w_i (alpha - beta t_i), stops being positive: t_i = ceil(alpha / beta). With a
    binding budget and equal weights the allocation falls with the cost (Theorem 3.4's
    qualitative claim) and follows t_i ~ 1/2 + (alpha - lambda c_i / w_i) / beta up to
    one step (the KKT solution of the relaxed problem)."""
    w, b = np.full(4, 0.25), np.zeros(4)
    c = np.array([0.05, 0.1, 0.2, 0.4])
    free = greedy_steps(w, c, b, 1e9, alpha=1.0, beta=0.15, max_steps=100)
    assert free.tolist() == [7, 7, 7, 7]  # ceil(1 / 0.15)
    alpha, beta, budget = 1.0, 0.02, 3.0
    tight = greedy_steps(w, c, b, budget, alpha=alpha, beta=beta, max_steps=100)
    assert np.all(np.diff(tight) <= 0) and tight[0] > tight[-1]
    from scipy.optimize import brentq

    def relaxed(lam):
        return np.maximum(1.0, 0.5 + (alpha - lam * c / w) / beta)

    lam = brentq(lambda x: float(np.sum(c * relaxed(x)) - budget), 0.0, 10.0)
    assert np.all(np.abs(tight - relaxed(lam)) <= 1.0 + 1e-9), (tight, relaxed(lam))


def _quadratic_client(rule, hessian, anchor_point, target, steps, lr):
    """Local GD on F(w) = 1/2 (w - a)^T H (w - a), reporting through the algorithm's GDA
    client hooks exactly as the local worker does."""
    state: dict = {}
    task = ClientTask(0, 0, lr, 1, steps)
    w = anchor_point.clone()
    for _ in range(steps):
        grad = hessian @ (w - target)
        rule.observe_gradients(
            task, state, grad, hessian @ (anchor_point - target), float((w - anchor_point).norm())
        )
        w = w - lr * grad
    update = ClientUpdate(0, Coverage(1), steps, 10, 0.0, w - anchor_point)
    rule.finish_local_work(task, update, state, slice(None), w, anchor_point)
    return update.payload


def test_gda_recovers_the_smoothness_of_a_quadratic():
    """On F(w) = (L/2)||w - a||^2, grad F(w_t) - grad F(w^(k)) = L (w_t - w^(k)) exactly,
    so the estimate is L; with an anisotropic Hessian it lies in [lambda_min, lambda_max]
    and reaches lambda_max when the drift is along its eigenvector."""
    rule = ALGORITHMS["amsfl"](build_options("amsfl", {"round_budget": 1.0}), TrainConfig())
    gen = torch.Generator().manual_seed(0)
    start, target = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    for smoothness in (0.5, 3.0):
        report = _quadratic_client(rule, smoothness * torch.eye(6), start, target, steps=5, lr=0.1)
        estimate = gda_estimates([report], np.ones(1))
        assert estimate.smoothness == pytest.approx(smoothness, rel=1e-5)
        assert estimate.round_grad == pytest.approx(float(smoothness * (start - target).norm()), rel=1e-5)
    hessian = torch.diag(torch.tensor([0.2, 0.5, 1.0, 2.0, 4.0, 8.0]))
    report = _quadratic_client(rule, hessian, start, target, steps=5, lr=0.05)
    assert 0.2 <= gda_estimates([report], np.ones(1)).smoothness <= 8.0 + 1e-5
    along = torch.zeros(6)
    along[5] = 1.0
    report = _quadratic_client(rule, hessian, torch.zeros(6), along, steps=3, lr=0.05)
    assert gda_estimates([report], np.ones(1)).smoothness == pytest.approx(8.0, rel=1e-5)
    # drift accumulation (A4): ||Delta_i^(t)|| <= L G t (t - 1) / 2
    assert report["drift_norm"] <= 8.0 * report["grad_norm_max"] * 3 * 2 / 2


def test_step_costs_are_recovered_from_observed_finish_times():
    estimator = StepCostEstimator(2)
    for steps in (1, 3, 2, 5):
        estimator.observe(0, steps, 0.3 * steps + 0.1)
        estimator.observe(1, 2, 2.0)  # always 2 steps: no intercept can be told apart
    step, comm = estimator.costs()
    assert step[0] == pytest.approx(0.3) and comm[0] == pytest.approx(0.1)
    assert step[1] == pytest.approx(1.0) and comm[1] == 0.0


AMSFL = {
    "run.rounds": 25,
    "run.eval_every": 4,
    "data.num_clients": 5,
    "data.partition": "dirichlet",
    "train.lr": 0.1,
    "train.local_steps": 3,
    "system.model": "per-step",
    "system.time_per_sample_step": 0.01,
    "system.comm_time": 0.05,
    "system.capability_profile": "list",
    "system.capabilities": [0.3, 0.6, 1.0, 1.5, 2.0],
    "algorithm.name": "amsfl",
    "algorithm.round_budget": 4.0,
    "algorithm.mu": 1.0,
}


@pytest.mark.parametrize("allocation", ["marginal", "paper"])
def test_amsfl_run_keeps_the_budget_and_the_clock(tmp_path, allocation):
    result = run(make_config({**AMSFL, "algorithm.allocation": allocation}), tmp_path / allocation)
    report = json.loads((tmp_path / allocation / "amsfl.json").read_text())
    assert len(report["rounds"]) == 25
    for row, planned in zip(result.metrics, report["rounds"], strict=True):
        steps, c, b = (
            np.array(planned["steps"]),
            np.array(planned["step_cost"]),
            np.array(planned["comm_cost"]),
        )
        assert np.sum(c * steps + b) <= 4.0 * (1 + 1e-12)
        assert row["round_time"] == pytest.approx(float(np.max(c * steps + b)))  # max_i (c_i t_i + b_i)
        assert row["mean_steps"] == pytest.approx(steps.mean())
    assert report["estimates"]["smoothness"] > 0  # GDA reports arrived
    assert result.summary["final_test_accuracy"] > 0.4  # it learns (10 classes)


def test_amsfl_resumes_identically_and_estimates_costs(tmp_path):
    config = make_config({**AMSFL, "algorithm.costs": "estimated"})
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    last = json.loads((tmp_path / "whole" / "amsfl.json").read_text())["rounds"][-1]
    caps = np.array([0.3, 0.6, 1.0, 1.5, 2.0])
    truth = 0.01 * 16 / (caps / caps.mean())
    assert np.allclose(last["step_cost"], truth, rtol=1e-6) or len(set(last["steps"])) == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"algorithm.round_budget": 0.0}, "algorithm.round_budget = 0.0"),
        ({"algorithm.allocation": "greedy"}, "algorithm.allocation = 'greedy'"),
        ({"algorithm.mu": -1.0}, "algorithm.mu = -1.0"),
        ({"system.model": "exponential"}, "per-step"),
    ],
)
def test_bad_amsfl_settings_are_named(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run(make_config({**AMSFL, **overrides}), tmp_path / "bad")
