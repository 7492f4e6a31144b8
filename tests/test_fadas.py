"""FADAS (fedhet.algorithms.fadas): the buffer's mean update, AMSGrad's moments and the
delay-adaptive rate, computed by hand for two server steps; the AMSGrad server optimizer
keeps the largest second moment; a run resumes to the same numbers; bad options are one line."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_config

from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.fadas import FADAS, FADASAggregation, FADASOptions
from fedhet.algorithms.server_optimizers import AdaptiveOptions, ServerAMSGrad
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate, Coverage


def _update(client: int, delta: list[float]) -> ClientUpdate:
    return ClientUpdate(client, Coverage(), 1, 10, 0.0, torch.tensor(delta, dtype=torch.float64))


def test_two_server_steps_follow_the_recurrence_by_hand():
    """eta = 0.5 (server.lr 1), beta1 = 0.9, beta2 = 0.99, epsilon = 0.1, tau_c = 2. Step 1: updates
    [2, 0] and [0, 4] (staleness 0, 1): Delta = [1, 2]; m = [0.1, 0.2]; v = 0.99 * 0.01 +
    0.01 * Delta^2 = [0.0199, 0.0499] = v_hat; rate 0.5. Step 2: one update [-1, 0] of
    staleness 4 > tau_c: rate min(0.5, 1/4) = 0.25; m = [-0.01, 0.18]; v = [0.029701,
    0.049401], v_hat = [0.029701, 0.0499] (the second coordinate keeps its peak)."""
    options = FADASOptions(buffer_size=2, eta=0.5, beta1=0.9, beta2=0.99, tau=0.1, delay_threshold=2)
    rule = FADAS.build(options, AlgorithmContext(make_config().train)).aggregation
    assert isinstance(rule, FADASAggregation)
    state = {"log": [], "moments": {}}
    x0 = torch.zeros(2, dtype=torch.float64)
    empty = torch.zeros(0, dtype=torch.float64)
    x1, _ = rule.apply_buffer(x0, empty, [(_update(0, [2.0, 0.0]), 0), (_update(1, [0.0, 4.0]), 1)], state, 0)
    m1, v1 = [0.1, 0.2], [0.0199, 0.0499]
    assert x1.tolist() == pytest.approx([0.5 * m / (math.sqrt(v) + 0.1) for m, v in zip(m1, v1, strict=True)])
    x2, _ = rule.apply_buffer(x1, empty, [(_update(2, [-1.0, 0.0]), 4)], state, 1)
    m2, v_hat2 = [-0.01, 0.18], [0.029701, 0.0499]
    step2 = [0.25 * m / (math.sqrt(v) + 0.1) for m, v in zip(m2, v_hat2, strict=True)]
    assert (x2 - x1).tolist() == pytest.approx(step2)
    assert [s["rate"] for s in state["log"]] == [0.5, 0.25]


def test_amsgrad_divides_by_the_largest_second_moment_so_far():
    """After a large update then small ones, Adam's v falls back and AMSGrad's v_hat does
    not: the same small pseudo-gradient moves the model less under AMSGrad."""
    from fedhet.algorithms.server_optimizers import ServerAdam

    options = AdaptiveOptions(lr=1.0, beta1=0.0, beta2=0.5, tau=1e-6)
    adam, amsgrad, adam_state, ams_state = ServerAdam(options), ServerAMSGrad(options), {}, {}
    for delta in ([10.0], [0.1], [0.1], [0.1]):
        step_adam = adam.direction(torch.tensor(delta), adam_state)
        step_ams = amsgrad.direction(torch.tensor(delta), ams_state)
    assert float(ams_state["v_hat"][0]) == pytest.approx(0.5 * 1e-12 + 0.5 * 100.0)
    assert abs(float(step_ams[0])) < abs(float(step_adam[0]))


def test_a_fadas_run_resumes_to_the_same_numbers(tmp_path):
    overrides = {"algorithm.name": "fadas", "algorithm.buffer_size": 3, "algorithm.eta": 0.4,
                 "algorithm.delay_threshold": 1, "system.model": "exponential", "run.rounds": 12}  # fmt: skip
    config = make_config(overrides)
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert any(
        step["rate"] < 0.4
        for step in __import__("json").loads((tmp_path / "whole" / "fadas.json").read_text())["server_steps"]
    )  # the delay adaptation acted


def test_bad_options_are_one_line():
    with pytest.raises(ConfigError, match="algorithm.delay_threshold = -1"):
        FADASOptions(delay_threshold=-1).validate()
    with pytest.raises(ConfigError, match="beta2"):
        FADASOptions(beta2=1.0).validate()
