"""Server optimizers (Reddi et al., arXiv:2003.00295, Algorithm 2; Hsu et al.,
arXiv:1909.06335): each server step follows its recurrence on FedAvg's averaged update,
FedAvgM with momentum 0 and server learning rate 1 is FedAvg (within float error), and the moments survive a
resume (a run stopped and resumed ends where an uninterrupted one does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.messages import ClientUpdate, Coverage


def _reference(rule: str, deltas: list[np.ndarray], lr: float, beta1: float, beta2: float, tau: float):
    """The recurrences written out in numpy, step by step."""
    x = np.zeros_like(deltas[0])
    m, v = np.zeros_like(x), np.full_like(x, tau**2)
    for d in deltas:
        if rule == "fedavgm":
            m = beta1 * m + d
            x = x + lr * m
            continue
        m = beta1 * m + (1 - beta1) * d
        if rule == "fedadagrad":
            v = v + d * d
        elif rule == "fedyogi":
            v = v - (1 - beta2) * d * d * np.sign(v - d * d)
        else:
            v = beta2 * v + (1 - beta2) * d * d
        x = x + lr * m / (np.sqrt(v) + tau)
    return x


def _algorithm(name: str, options: dict):
    from fedhet import registry
    from fedhet.algorithms.base import AlgorithmContext

    entry = registry.resolve("algorithm", name, "test")
    config = make_config()
    return entry.cls.build(entry.cls.Options(**options), AlgorithmContext(config.train))


@pytest.mark.parametrize("rule", ["fedavgm", "fedadagrad", "fedyogi", "fedadam"])
def test_each_server_step_follows_its_recurrence(rule):
    rng = np.random.default_rng(0)
    deltas = [rng.normal(size=6) * (0.1 + i) for i in range(4)]  # growing steps: yogi's sign flips
    if rule == "fedavgm":
        algorithm, beta1, beta2, tau, lr = (
            _algorithm(rule, {"momentum": 0.8, "server_lr": 0.5}),
            0.8,
            0.0,
            0.0,
            0.5,
        )
    else:
        options = {"server_lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
        algorithm, beta1, beta2, tau, lr = _algorithm(rule, options), 0.9, 0.99, 1e-3, 0.1
    state = algorithm.init_state(None)
    params = torch.zeros(6, dtype=torch.float64)
    for d in deltas:
        # two clients whose mean update is d (uniform weights)
        updates = [ClientUpdate(c, Coverage(1), 1, 10, 0.0, torch.tensor(d + s, dtype=torch.float64))
                   for c, s in ((0, 0.3), (1, -0.3))]  # fmt: skip
        params, _ = algorithm.aggregate(params, torch.zeros(0), updates, state, None, None)
    assert np.allclose(
        params.numpy(), _reference(rule, deltas, lr, beta1, beta2, tau), rtol=1e-10, atol=1e-12
    )


def test_fedavgm_without_momentum_at_server_lr_1_is_fedavg(tmp_path):
    from fedhet import run

    fedavg = run(make_config({"algorithm.name": "fedavg", "run.rounds": 6}), tmp_path / "fedavg")
    plain = run(
        make_config({"algorithm.name": "fedavgm", "algorithm.momentum": 0.0, "run.rounds": 6}),
        tmp_path / "m0",
    )
    # the same rule; FedAvg streams its sum (another rounding order), so equal within float error
    assert [r["test_accuracy"] for r in plain.metrics] == [r["test_accuracy"] for r in fedavg.metrics]
    assert [r["train_loss"] for r in plain.metrics] == pytest.approx(
        [r["train_loss"] for r in fedavg.metrics], rel=1e-5
    )


@pytest.mark.parametrize("rule", ["fedavgm", "fedadam", "fedyogi"])
def test_a_resumed_run_continues_the_moments(rule, tmp_path):
    from fedhet.engine.launch import run

    config = make_config({"algorithm.name": rule, "run.rounds": 8, "run.eval_every": 4})
    whole = run(config, tmp_path / "whole").summary
    run(config, tmp_path / "split", stop_after=4)
    resumed = run(config, tmp_path / "split", resume=True).summary
    assert resumed["final_test_accuracy"] == whole["final_test_accuracy"]
    assert resumed["final_test_loss"] == whole["final_test_loss"]
