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
    optimizer, server_state = algorithm.preset_server_optimizer(), {}  # the run's server step
    params = torch.zeros(6, dtype=torch.float64)
    for d in deltas:
        # two clients whose mean update is d (uniform weights)
        updates = [ClientUpdate(c, Coverage(1), 1, 10, 0.0, torch.tensor(d + s, dtype=torch.float64))
                   for c, s in ((0, 0.3), (1, -0.3))]  # fmt: skip
        proposed, _ = algorithm.aggregate(params, torch.zeros(0), updates, state, None, None)
        params = optimizer.step(params, proposed, server_state)
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


# -- the server optimizer as a plug-in kind, on any rule's update ([server] optimizer) --------

SERVER_BASE = {
    "run": {"name": "s", "rounds": 6, "threads": 1, "seed": 8, "eval_every": 1},
    "data": {"dataset": "digits", "num_clients": 5, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"batch_size": 8, "lr": 0.1},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.4},
}


def _server_config(**sections):
    from fedhet.config import from_dict

    document = {k: dict(v) for k, v in SERVER_BASE.items()}
    for name, values in sections.items():
        document[name] = {**document.get(name, {}), **values}
    return from_dict(document)


@pytest.mark.parametrize("kind", ["momentum", "adagrad", "yogi", "adam"])
def test_the_plug_in_step_follows_its_recurrence_from_proposals(kind):
    """x_{t+1} = step(x_t, x_t + Delta_t): the same recurrence as above, fed proposals."""
    from fedhet import registry

    entry = registry.resolve("server_optimizer", kind, "test")
    options = {"lr": 0.5, "momentum": 0.8} if kind == "momentum" else {"lr": 0.1, "beta1": 0.9, "beta2": 0.99}
    optimizer = entry.cls.build(entry.cls.Options(**options), None)
    rng = np.random.default_rng(1)
    deltas = [rng.normal(size=6) * (0.1 + i) for i in range(4)]
    x, state = torch.zeros(6, dtype=torch.float64), {}
    for d in deltas:
        x = optimizer.step(x, x + torch.from_numpy(d), state)
    rule = {"momentum": "fedavgm", "adagrad": "fedadagrad", "yogi": "fedyogi", "adam": "fedadam"}[kind]
    beta1 = 0.8 if kind == "momentum" else 0.9
    expected = _reference(rule, deltas, options["lr"], beta1, 0.99, 0.0 if kind == "momentum" else 1e-3)
    assert x.numpy() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_default_sgd_is_the_rule_bit_for_bit_and_leaves_the_configuration_as_it_was(tmp_path):
    from fedhet.engine.loop import RunLoop

    plain = RunLoop(_server_config(algorithm={"name": "salf"}), tmp_path / "plain").run()
    sgd = RunLoop(_server_config(algorithm={"name": "salf"}, server={"optimizer": "sgd", "lr": 1.0}),
                  tmp_path / "sgd").run()  # fmt: skip
    assert sgd.metrics == plain.metrics
    assert "[server]" not in (tmp_path / "sgd" / "config.toml").read_text()
    half = RunLoop(_server_config(algorithm={"name": "salf"}, server={"lr": 0.5}), tmp_path / "half").run()
    assert half.metrics != plain.metrics and "[server]" in (tmp_path / "half" / "config.toml").read_text()


def test_fedavg_with_the_adam_server_step_is_fedadam(tmp_path):
    """FedAvg's proposal x + Delta_t through [server] adam gives the fedadam rule's run (the
    pseudo-gradient recovered as (x + Delta_t) - x: equal within float rounding)."""
    from fedhet.engine.loop import RunLoop

    step = {"lr": 0.05, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    mine = RunLoop(_server_config(algorithm={"name": "fedavg"}, server={"optimizer": "adam", **step}),
                   tmp_path / "plug-in").run()  # fmt: skip
    rule = {"name": "fedadam", "server_lr": 0.05, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    theirs = RunLoop(_server_config(algorithm=rule), tmp_path / "rule").run()
    for a, b in zip(mine.metrics, theirs.metrics, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)


@pytest.mark.parametrize("rule", ["fedavgm", "fedadagrad", "fedyogi", "fedadam"])
def test_the_server_optimizer_rules_are_presets_of_fedavg_that_stream(tmp_path, rule):
    """fedadam is fedavg with [server] optimizer = "adam" (server_lr its lr): one route for
    the step, the same run bit for bit, and FedAvg's streamed sum (no list of updates)."""
    from fedhet.engine.loop import RunLoop
    from fedhet.errors import ConfigError

    kind = {"fedavgm": "momentum", "fedadagrad": "adagrad", "fedyogi": "yogi", "fedadam": "adam"}[rule]
    options = {"server_lr": 0.3, "momentum": 0.8} if kind == "momentum" else {"server_lr": 0.05, "tau": 1e-3}
    step = {("lr" if k == "server_lr" else k): v for k, v in options.items()}
    preset = RunLoop(_server_config(algorithm={"name": rule, **options}), tmp_path / "preset")
    preset_result = preset.run()
    plain = RunLoop(_server_config(algorithm={"name": "fedavg"}, server={"optimizer": kind, **step}),
                    tmp_path / "plain").run()  # fmt: skip
    assert preset.world.algorithm.streams and preset.world.server_optimizer.name == kind
    assert preset_result.metrics == plain.metrics
    both = _server_config(algorithm={"name": rule, **options}, server={"optimizer": "adam"})
    with pytest.raises(ConfigError, match=f"algorithm.name = '{rule}' is FedAvg with the '{kind}' server"):
        RunLoop(both, tmp_path / "both").run()


@pytest.mark.parametrize("algorithm", [{"name": "salf"}, {"name": "fedbuff", "buffer_size": 2}])
def test_server_moments_resume_bit_identically_on_both_drivers(tmp_path, algorithm):
    from fedhet.engine.loop import RunLoop

    config = _server_config(algorithm=algorithm, server={"optimizer": "yogi", "lr": 0.05})
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    saved = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=False)
    assert saved["server"]["v"].numel() == saved["params"].numel()


def test_bad_server_optimizer_settings_are_refused():
    from fedhet.config import ConfigError

    with pytest.raises(ConfigError, match="server.lr = 0"):
        _server_config(server={"optimizer": "adam", "lr": 0.0})
    with pytest.raises(ConfigError, match="server.optimizer"):
        _server_config(server={"optimizer": "lamb"})
    with pytest.raises(ConfigError, match="server.beta2 = 1.0"):
        _server_config(server={"optimizer": "yogi", "beta2": 1.0})


def test_a_presets_checkpoint_with_its_moments_in_the_rules_state_resumes_them(tmp_path):
    """Checkpoints written when the presets kept their moments in the rule's own state
    (``algorithm``: m, v; no ``server``) resume with those moments: the run ends as an
    uninterrupted one."""
    import torch

    from fedhet.engine.launch import run

    config = make_config({"algorithm.name": "fedadam", "run.rounds": 6, "run.eval_every": 3})
    whole = run(config, tmp_path / "whole").summary
    run(config, tmp_path / "old", stop_after=3)
    path = tmp_path / "old" / "checkpoint.pt"
    saved = torch.load(path, weights_only=False)
    assert set(saved["server"]) >= {"m", "v"}
    saved["algorithm"] = {**(saved["algorithm"] or {}), **saved.pop("server")}  # the older layout
    torch.save(saved, path)
    resumed = run(config, tmp_path / "old", resume=True).summary
    assert resumed["final_test_loss"] == whole["final_test_loss"]


def test_a_rules_server_lr_beside_a_server_optimizer_is_refused_in_one_line():
    """One server learning rate: a rule's own server_lr (not 1) and a [server] optimizer
    that steps would multiply, so the run refuses them together; either alone runs."""
    from fedhet.errors import ConfigError
    from fedhet.world import build_world

    both = _server_config(algorithm={"name": "fedavg", "server_lr": 0.5}, server={"optimizer": "adam"})
    with pytest.raises(ConfigError, match=r"algorithm.server_lr = 0.5 with \[server\] optimizer = 'adam'"):
        build_world(both)
    build_world(_server_config(algorithm={"name": "fedavg", "server_lr": 0.5}))
    build_world(_server_config(algorithm={"name": "fedavg"}, server={"optimizer": "adam", "lr": 0.1}))
