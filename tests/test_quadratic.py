"""FedStale's Fig. 1 problem as a dataset: quadratic client objectives with exact gradients.
Plain FedAvg averages the clients that take part, so it converges to the minimiser of the
participation-weighted objective sum_i omega_i F_i, omega_i = E[1{i in S} / |S|]; FedVARP
and FedStale divide by p_i and keep stale updates, so they converge to the minimiser of the
uniform objective. Both optima have closed forms (fedhet.data.quadratic.weighted_optimum)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.config import ConfigError, from_dict
from fedhet.data.quadratic import (
    DEFAULT_MATRICES,
    DEFAULT_OPTIMA,
    load_quadratic,
    objective,
    weighted_optimum,
)
from fedhet.engine.loop import RunLoop

P_RARE = 0.2  # client 0 always takes part, client 1 with probability 0.2
BASE = {
    "run": {"name": "quadratic", "seed": 1, "threads": 1},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 2},
    "model": {"name": "linear"},
    "train": {"batch_size": 2, "local_steps": 1},
    "system": {"model": "full", "participation": "list", "participation_probs": [1.0, P_RARE]},
}


def _final_point(tmp_path, name: str, algorithm: dict, lr: float, rounds: int) -> np.ndarray:
    document = {k: dict(v) for k, v in BASE.items()}
    document["run"].update(rounds=rounds, eval_every=rounds)
    document["train"]["lr"] = lr
    document["algorithm"] = algorithm
    RunLoop(from_dict(document), tmp_path / name).run()
    return torch.load(tmp_path / name / "checkpoint.pt", weights_only=False)["params"].double().numpy()


def test_the_rows_are_the_objectives_and_the_test_loss_is_the_uniform_one():
    """A client's d rows give MSE = (2/d) F_i: at any point the test loss over every row is
    the mean of the F_i (d = 2), so at the uniform optimum it is the closed-form minimum."""
    data = load_quadratic()
    point = torch.tensor([1.5, -0.5])
    mse = float(((data.x_test @ point - data.y_test) ** 2).mean())
    assert mse == pytest.approx(objective(DEFAULT_MATRICES, DEFAULT_OPTIMA, point.numpy()).mean(), rel=1e-6)
    assert data.train_users.tolist() == [0, 0, 1, 1]


@pytest.mark.slow
def test_fedavg_finds_the_weighted_optimum_and_fedvarp_and_fedstale_the_uniform_one(tmp_path):
    uniform = weighted_optimum(DEFAULT_MATRICES, DEFAULT_OPTIMA, [0.5, 0.5])
    # FedAvg's mean over the clients present: client 1 weighs 1/2 when present, 0 otherwise
    weighted = weighted_optimum(DEFAULT_MATRICES, DEFAULT_OPTIMA, [1 - P_RARE / 2, P_RARE / 2])
    assert np.linalg.norm(uniform - weighted) > 2.5  # the two answers are far apart
    fedavg = _final_point(tmp_path, "fedavg", {"name": "fedavg"}, lr=0.02, rounds=2000)
    assert np.linalg.norm(fedavg - weighted) < 0.4  # near its optimum, up to lr-sized noise
    fedvarp = _final_point(tmp_path, "fedvarp", {"name": "fedvarp"}, lr=0.3, rounds=800)
    np.testing.assert_allclose(fedvarp, uniform, atol=1e-3)  # exactly: its noise vanishes there
    # beta < 1 keeps part of the fresh updates' noise, (1 - beta) of it: near, up to lr-sized noise
    fedstale = _final_point(tmp_path, "fedstale", {"name": "fedstale", "beta": 0.8}, lr=0.02, rounds=2000)
    assert np.linalg.norm(fedstale - uniform) < 0.4


def test_bad_problems_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="data.quadratic_matrices: every B_i must be invertible"):
        from_dict(
            {"data": {"dataset": "quadratic", "quadratic_matrices": [[[1, 0], [0, 0]], [[1, 0], [0, 1]]]}}
        )
    with pytest.raises(ConfigError, match=r"data.quadratic_optima: expected 2 optima of 2 numbers"):
        from_dict({"data": {"dataset": "quadratic", "quadratic_optima": [[1, 2, 3], [4, 5, 6]]}})


def test_the_linear_model_starts_where_model_init_says_and_refuses_a_wrong_length():
    """FedStale Fig. 1 starts every method from w^(1) = (-10, -10): model.init sets the
    weights exactly; a list of the wrong length is refused in one line naming the key."""
    from fedhet.world import build_world

    document = {k: dict(v) for k, v in BASE.items()}
    document["model"] = {"name": "linear", "init": [-10.0, -10.0]}
    world = build_world(from_dict(document))
    assert world.initial_params.tolist() == [-10.0, -10.0]
    document["model"] = {"name": "linear", "init": [1.0, 2.0, 3.0]}
    with pytest.raises(ConfigError, match=r"model.init: 3 numbers given, the 1 x 2 weights need 2"):
        build_world(from_dict(document))
    with pytest.raises(ConfigError, match=r"model.init = \['a'\]: expected a list of finite numbers"):
        from_dict({**document, "model": {"name": "linear", "init": ["a"]}})
