"""FedProx, FedNova, SCAFFOLD and FedDyn on the message protocol:
each rule checked where it must reduce to FedAvg, and against a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_config
from torch import nn

from fedhet.algorithms import ALGORITHMS, RoundContext
from fedhet.algorithms.fednova import normalising_factor
from fedhet.client import ClientData, ClientStates, LocalTrainer
from fedhet.config import TrainConfig, build_options
from fedhet.engine.launch import run
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask
from fedhet.models.layers import FlatModel, LayeredModel

EVERYONE = {
    "run.rounds": 6,
    "run.eval_every": 3,
    "train.local_steps": 3,
    "system.model": "full",
}


def _final(result):
    return torch.load(result.path / "checkpoint.pt", weights_only=False)["params"]


def test_fedprox_with_mu_zero_is_fedavg(tmp_path):
    fedavg = run(make_config({**EVERYONE, "algorithm.name": "fedavg"}), tmp_path / "avg")
    prox0 = run(make_config({**EVERYONE, "algorithm.name": "fedprox", "algorithm.mu": 0.0}), tmp_path / "p0")
    prox = run(make_config({**EVERYONE, "algorithm.name": "fedprox", "algorithm.mu": 1.0}), tmp_path / "p1")
    assert torch.equal(_final(prox0), _final(fedavg))
    assert [r["test_accuracy"] for r in prox0.metrics] == [r["test_accuracy"] for r in fedavg.metrics]
    assert not torch.equal(_final(prox), _final(fedavg))  # the proximal term does something


def test_fednova_with_equal_steps_is_fedavg(tmp_path):
    for momentum in (0.0, 0.5):
        common = {**EVERYONE, "train.momentum": momentum, "algorithm.weights": "samples"}
        fedavg = run(make_config({**common, "algorithm.name": "fedavg"}), tmp_path / f"avg{momentum}")
        nova = run(make_config({**common, "algorithm.name": "fednova"}), tmp_path / f"nova{momentum}")
        assert torch.allclose(_final(nova), _final(fedavg), atol=1e-5)


def test_fednova_normalises_unequal_steps():
    """a_i = tau_i without momentum; sum_k (1 - rho^k) / (1 - rho) with momentum rho; a client
    with more steps is scaled down relative to one with fewer."""
    assert normalising_factor(4, 0.0) == 4.0
    assert normalising_factor(3, 0.5) == pytest.approx(0.5 / 0.5 + 0.75 / 0.5 + 0.875 / 0.5)
    algorithm = ALGORITHMS["fednova"](build_options("fednova", {}), TrainConfig())
    from fedhet.messages import ClientUpdate, Coverage

    updates = [
        ClientUpdate(0, Coverage(1), 1, 10, 0.0, torch.tensor([1.0, 0.0])),
        ClientUpdate(1, Coverage(1), 4, 10, 0.0, torch.tensor([0.0, 4.0])),
    ]
    new, _ = algorithm.aggregate(torch.zeros(2), torch.zeros(0), updates, {}, None, _layout_of_vector(2))
    tau_eff = 0.5 * 1 + 0.5 * 4
    assert torch.allclose(new, torch.tensor([tau_eff * 0.5 * 1.0 / 1, tau_eff * 0.5 * 4.0 / 4]))


def _layout_of_vector(size):
    from fedhet.models.layers import LayerSlices, ModelLayout

    return ModelLayout(LayerSlices(((0, size),)), LayerSlices(((0, 0),)))


# -- hand computations on a tiny model -------------------------------------------------------
N_CLIENTS, FEATURES, CLASSES, PER_CLIENT, STEPS, LR = 3, 3, 2, 4, 2, 0.3


def _tiny_world(seed=0):
    torch.manual_seed(seed)
    flat = FlatModel(LayeredModel([nn.Linear(FEATURES, CLASSES)]))
    x = torch.randn(N_CLIENTS * PER_CLIENT, FEATURES)
    y = torch.randint(0, CLASSES, (N_CLIENTS * PER_CLIENT,))
    data = [ClientData(x, y, np.arange(i * PER_CLIENT, (i + 1) * PER_CLIENT)) for i in range(N_CLIENTS)]
    return flat, data


def _gradient(w: torch.Tensor, data: ClientData) -> torch.Tensor:
    """Full-batch gradient of client data's mean cross-entropy at flat w = [W, b]."""
    w = w.clone().requires_grad_(True)
    weight = w[: FEATURES * CLASSES].view(CLASSES, FEATURES)
    bias = w[FEATURES * CLASSES :]
    x, y = data.x[data.indices], data.y[data.indices]
    loss = F.cross_entropy(x @ weight.T + bias, y)
    return torch.autograd.grad(loss, w)[0].detach()


def _run_round(algorithm, flat, data, params, state, states, clients, round_index):
    worker = LocalTrainer(flat)
    updates = []
    for c in clients:
        task = ClientTask(round_index, c, LR, PER_CLIENT, STEPS, payload=algorithm.task_payload(c, state))
        rng = np.random.default_rng(c)
        updates.append(worker.execute(task, params, torch.zeros(0), data[c], states.of(c), rng, algorithm))
    context = RoundContext(None, None, None, N_CLIENTS, 1)
    new, _ = algorithm.aggregate(params, torch.zeros(0), updates, state, context, flat.layout)
    return new


def _setting(flat, params):
    from fedhet.algorithms import RunSetting

    return RunSetting(
        N_CLIENTS, params.numel(), 2, 0.0, None, np.full(N_CLIENTS, 4), flat.layout, params, None
    )


def test_scaffold_rounds_match_a_hand_computation():
    """Option II: y <- y - lr (g(y) - c_i + c) for K steps; c_i+ = c_i - c + (w_t - y)/(K lr);
    w += eta_g mean_S (y - w_t); c += (1/N) sum_S (c_i+ - c_i). Two rounds, the second with
    clients 0 and 1 only, so c, c_i and the 1/N vs mean_S weights all matter."""
    flat, data = _tiny_world()
    algorithm = ALGORITHMS["scaffold"](build_options("scaffold", {"server_lr": 0.7}), TrainConfig())
    params = flat.params.detach().clone()
    state = algorithm.init_state(_setting(flat, params))
    states = ClientStates()
    w, c = params.clone(), torch.zeros_like(params)
    c_i = [torch.zeros_like(params) for _ in range(N_CLIENTS)]
    for round_index, clients in enumerate(([0, 1, 2], [0, 1])):
        params = _run_round(algorithm, flat, data, params, state, states, clients, round_index)
        ys, c_change = [], torch.zeros_like(c)
        for i in clients:
            y = w.clone()
            for _ in range(STEPS):
                y = y - LR * (_gradient(y, data[i]) - c_i[i] + c)
            new_ci = c_i[i] - c + (w - y) / (STEPS * LR)
            c_change += new_ci - c_i[i]
            c_i[i] = new_ci
            ys.append(y)
        w = w + 0.7 * torch.stack([y - w for y in ys]).mean(0)
        c = c + c_change / N_CLIENTS
        assert torch.allclose(params, w, atol=1e-5)
        assert torch.allclose(state["control"], c, atol=1e-5)
        for i in clients:
            assert torch.allclose(states.part(i, "algorithm")["control"], c_i[i], atol=1e-5)


def test_scaffold_server_control_is_the_mean_of_client_controls(tmp_path):
    """c starts at 0 and gains (1/N) sum_S (c_i+ - c_i): it stays (1/N) sum_i c_i, with
    clients that never trained counting as c_i = 0."""
    result = run(
        make_config({"run.rounds": 5, "algorithm.name": "scaffold", "train.local_steps": 2}), tmp_path / "s"
    )
    saved = torch.load(result.path / "checkpoint.pt", weights_only=False)
    total = sum(s["algorithm/control"] for s in saved["client_states"].values())
    assert torch.allclose(saved["algorithm"]["control"], total / 10, atol=1e-5)


def test_feddyn_rounds_match_a_hand_computation():
    """theta <- theta - lr (g(theta) - g_i + alpha (theta - theta_t)); g_i <- g_i - alpha
    (theta_i - theta_t); h <- h - alpha (1/N) sum_S (theta_i - theta_t);
    theta_{t+1} = mean_S theta_i - h / alpha."""
    alpha = 0.2
    flat, data = _tiny_world(seed=1)
    algorithm = ALGORITHMS["feddyn"](build_options("feddyn", {"alpha": alpha}), TrainConfig())
    params = flat.params.detach().clone()
    state = algorithm.init_state(_setting(flat, params))
    states = ClientStates()
    theta, h = params.clone(), torch.zeros_like(params)
    g = [torch.zeros_like(params) for _ in range(N_CLIENTS)]
    for round_index, clients in enumerate(([0, 1, 2], [1, 2])):
        params = _run_round(algorithm, flat, data, params, state, states, clients, round_index)
        locals_ = []
        for i in clients:
            local = theta.clone()
            for _ in range(STEPS):
                local = local - LR * (_gradient(local, data[i]) - g[i] + alpha * (local - theta))
            g[i] = g[i] - alpha * (local - theta)
            locals_.append(local)
        h = h - alpha * torch.stack([loc - theta for loc in locals_]).sum(0) / N_CLIENTS
        theta = torch.stack(locals_).mean(0) - h / alpha
        assert torch.allclose(params, theta, atol=1e-5)
        assert torch.allclose(state["h"], h, atol=1e-6)
        for i in clients:
            assert torch.allclose(states.part(i, "algorithm")["linear"], g[i], atol=1e-6)


def test_fedprox_gradient_is_the_proximal_objective():
    """One FedProx step equals SGD on F_i(w) + (mu/2)||w - w_t||^2, checked on the tiny model
    after a first step has moved w away from w_t."""
    mu = 0.5
    flat, data = _tiny_world(seed=2)
    algorithm = ALGORITHMS["fedprox"](build_options("fedprox", {"mu": mu}), TrainConfig())
    params = flat.params.detach().clone()
    states = ClientStates()
    new = _run_round(algorithm, flat, data, params, {}, states, [0], 0)
    w = params.clone()
    for _ in range(STEPS):
        w = w - LR * (_gradient(w, data[0]) + mu * (w - params))
    assert torch.allclose(new, w, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("fedprox", "mu", -1.0),
        ("feddyn", "alpha", 0.0),
        ("scaffold", "server_lr", 0.0),
        ("fednova", "weights", "x"),
    ],
)
def test_bad_baseline_options_are_named(name, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        make_config({"algorithm.name": name, f"algorithm.{key}": value})


def test_partial_steps_are_accepted_and_charged_on_the_clock(tmp_path):
    """Under the per-step model with a deadline, FedProx/FedNova clients deliver the steps they
    finished (fewer for slow clients), drop keeps only clients that did all K."""
    common = {
        "run.rounds": 3,
        "train.local_steps": 5,
        "system.model": "per-step",
        "system.capability_profile": "list",
        "system.capabilities": [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0],
        "system.time_per_sample_step": 0.005,
        "system.deadline": 0.5,
    }
    nova = run(make_config({**common, "algorithm.name": "fednova"}), tmp_path / "nova")
    drop = run(make_config({**common, "algorithm.name": "drop"}), tmp_path / "drop")
    assert all(r["participants"] == 10 and 1 <= r["mean_steps"] < 5 for r in nova.metrics)
    assert all(r["participants"] < 10 and r["mean_steps"] == 5 for r in drop.metrics)
    assert all(r["round_time"] == 0.5 for r in nova.metrics)
