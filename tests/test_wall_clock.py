"""Real deadlines: a wall-clock task back-propagates layer by layer from the output and
stops before its time limit; the server estimates p_l from the depths delivered."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.client import WallClockBudget, timed_first_step
from fedhet.config import from_dict
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models import FlatModel, build_model
from fedhet.system import Workload
from fedhet.system.wallclock import WallClock


def _model():
    """A small MLP, warmed up (autograd's first call in a process is slow)."""
    torch.manual_seed(0)
    flat = FlatModel(build_model("mlp", (64,), 10, [32, 16]))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    torch.autograd.grad(F.cross_entropy(flat.model(x), y), flat.parameters_from_depth(1))
    timed_first_step(flat.model, x, y, 1, WallClockBudget(10.0))
    return flat


def _reference(flat, x, y, depth):
    return torch.autograd.grad(F.cross_entropy(flat.model(x, depth), y), flat.parameters_from_depth(depth))


def test_a_slow_device_delivers_only_the_layers_that_fit():
    """0.3 s per layer and 0.5 s to go: the output layer fits, the next would not."""
    flat = _model()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    clock = WallClockBudget(0.5, layer_delay=0.3)
    depth, (loss, grads) = timed_first_step(flat.model, x, y, 1, clock)
    assert depth == 3 and clock.elapsed() < 0.5
    reference = torch.autograd.grad(
        torch.nn.functional.cross_entropy(flat.model(x, 3), y), flat.parameters_from_depth(3)
    )
    for mine, theirs in zip(grads, reference, strict=True):
        torch.testing.assert_close(mine, theirs)


def test_a_fast_device_delivers_every_layer_with_the_full_gradient():
    flat = _model()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    depth, (loss, grads) = timed_first_step(flat.model, x, y, 1, WallClockBudget(5.0))
    reference = torch.autograd.grad(
        torch.nn.functional.cross_entropy(flat.model(x), y), flat.parameters_from_depth(1)
    )
    assert depth == 1
    for mine, theirs in zip(grads, reference, strict=True):
        torch.testing.assert_close(mine, theirs)


def test_no_time_for_even_the_output_layer_delivers_nothing():
    flat = _model()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    start = time.perf_counter()
    depth, first = timed_first_step(flat.model, x, y, 1, WallClockBudget(0.2, layer_delay=0.5))
    assert depth == 4 and first is None and time.perf_counter() - start < 0.2


def test_p_l_is_estimated_from_the_observed_depths():
    model = WallClock(2, 3, deadline=1.0)
    work = Workload(1.0, np.full(2, 8))
    np.testing.assert_allclose(model.marginals(work).no_reach_prob, [0.25, 0.25, 0.25])
    for _ in range(8):  # client 0 always reaches layer 1; client 1 only layer 3
        model.observe([ClientUpdate(0, Coverage(1), 1, 10, 0.1, torch.zeros(1)),
                       ClientUpdate(1, Coverage(3), 1, 10, 0.1, torch.zeros(1))])  # fmt: skip
    reach = model.reach_estimate()
    np.testing.assert_allclose(reach[0], [0.9, 0.9, 0.9])
    np.testing.assert_allclose(reach[1], [0.1, 0.1, 0.9])
    np.testing.assert_allclose(model.marginals(work).no_reach_prob, [0.1 * 0.9, 0.1 * 0.9, 0.1 * 0.1])


def test_a_wall_clock_run_on_the_embedded_engine_resumes_its_estimates(tmp_path):
    config = from_dict({
        "run": {"name": "wc", "rounds": 4, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
        "model": {"name": "mlp", "hidden": [16]},
        "system": {"model": "wall-clock", "deadline": 2.0},
        "algorithm": {"name": "salf"},
    })  # fmt: skip
    RunLoop(config, tmp_path / "r").run(stop_after=2)
    result = RunLoop(config, tmp_path / "r").run(resume=True)
    assert [r["sim_time"] for r in result.metrics] == [2.0, 4.0, 6.0, 8.0]
    assert all(r["mean_depth"] == 1.0 and r["participants"] == 3 for r in result.metrics)
    from fedhet.results import RunDirectory

    saved = RunDirectory(tmp_path / "r").load_checkpoint()["system"]
    assert saved["observed"] == [4, 4, 4]
