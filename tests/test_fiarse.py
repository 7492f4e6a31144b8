"""FIARSE (Wu et al., NeurIPS 2024): a slow client trains the share r of the parameters with
the largest magnitudes, with TCB-GD's surrogate gradient of the mask, and the server averages
each element over the clients that moved it. Checked by hand on the thresholds, the gradient
and the aggregation, on a round in which every client's sub-model is a quarter of each layer,
and for a bit-identical resume."""

from __future__ import annotations

import pytest
import torch
from test_fedbuff import _config

from fedhet.algorithms.fiarse import FIARSE, FIARSEOptions, masked, thresholds
from fedhet.config import ConfigError, TrainConfig
from fedhet.engine.loop import RunLoop
from fedhet.messages import ClientUpdate, Coverage
from fedhet.world import build_world

NAMED = [
    ("a.weight", torch.tensor([3.0, -1.0, 0.5, 2.0])),
    ("a.bias", torch.tensor([0.1, -4.0])),
    ("b.weight", torch.tensor([1.0, 2.0])),
]


def test_thresholds_keep_the_largest_magnitudes_per_layer_or_model():
    # layer a: |x| = 4, 3, 2, 1, 0.5, 0.1; ceil(0.25 x 6) = 2 kept -> theta 3; layer b keeps 1 -> 2
    layer = thresholds(NAMED, 0.25, "layer")
    assert {k: float(v) for k, v in layer.items()} == {"a.weight": 3.0, "a.bias": 3.0, "b.weight": 2.0}
    # the whole model: 8 magnitudes, 2 kept -> theta 3
    assert {float(v) for v in thresholds(NAMED, 0.25, "model").values()} == {3.0}
    assert {float(v) for v in thresholds(NAMED, 1.0, "layer").values()} == {0.0}


def test_tcb_gradient_by_hand():
    """d/dx [x m(|x|)] = 1 + 2 theta |x| / (|x| + theta)^2 for kept x, 0 for dropped."""
    x = torch.tensor([3.0, 1.0, -2.5], requires_grad=True)
    out = masked(x, torch.tensor(2.0))
    assert out.tolist() == [3.0, 0.0, -2.5]
    out.sum().backward()
    expected = [1 + 2 * 2 * 3 / 25, 0.0, 1 + 2 * 2 * 2.5 / 4.5**2]
    assert x.grad.tolist() == pytest.approx(expected)


def test_each_element_is_averaged_over_the_clients_that_moved_it():
    rule = FIARSE(FIARSEOptions(server_lr=0.5), TrainConfig())
    deltas = ([1.0, 0.0, 2.0], [3.0, 0.0, 0.0])
    updates = [ClientUpdate(c, Coverage(), 1, 10, 0.5, torch.tensor(d)) for c, d in enumerate(deltas)]
    params, _ = rule.aggregate(torch.zeros(3), torch.zeros(0), updates, {}, None, None)
    assert params.tolist() == [1.0, 0.0, 1.0]  # 0.5 x ((1 + 3) / 2, 0, 2 / 1)


def test_a_quarter_sub_model_moves_at_most_a_quarter_of_each_layer(tmp_path):
    """Two steps take 2 s against a 0.6 s deadline: every client trains rate 1/4. Their
    thresholds are set on the same received model, so the round moves at most ceil(n / 4)
    of each module's n parameters."""
    config = _config(
        run={"rounds": 1},
        train={"local_steps": 2, "lr": 0.5},
        system={"model": "per-step", "time_per_sample_step": 0.125, "capability_profile": "constant",
                "deadline": 0.6},
        algorithm={"name": "fiarse", "rates": [1.0, 0.25]},
    )  # fmt: skip
    world = build_world(config)
    before = {name: p.detach().clone() for name, p in world.flat.model.named_parameters()}
    loop = RunLoop(config, tmp_path / "r")
    assert loop.run().metrics[0]["participants"] == 4
    world.flat.load(loop.state.params, loop.state.buffers)
    moved: dict[str, list[int]] = {}
    for name, p in world.flat.model.named_parameters():
        counts = moved.setdefault(name.rsplit(".", 1)[0], [0, 0])
        counts[0] += int((p.detach() != before[name]).sum())
        counts[1] += p.numel()
    assert all(0 < changed <= -(-n // 4) for changed, n in moved.values())


def test_a_fiarse_run_resumes_bit_identically(tmp_path):
    config = _config(
        run={"rounds": 6},
        train={"local_steps": 2},
        system={"model": "per-step", "time_per_sample_step": 0.05, "capability_profile": "uniform",
                "step_jitter": 0.2, "deadline": 1.0},
        algorithm={"name": "fiarse"},
    )  # fmt: skip
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics


@pytest.mark.parametrize(
    ("options", "key"),
    [({"rates": [0.5]}, "rates"), ({"rates": [1.0, 0.0]}, "rates"), ({"scope": "unit"}, "scope"),
     ({"server_lr": 0.0}, "server_lr")],
)  # fmt: skip
def test_bad_fiarse_options_are_refused(options, key):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _config(algorithm={"name": "fiarse", **options})
