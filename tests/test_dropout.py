"""Mid-round dropout: a client fails after Exp(hazard) seconds of work and delivers nothing
if that comes before its finish time. The sampled delivery rates match the wrapper's
marginals (exact where the wrapped model draws nothing, Monte-Carlo estimated otherwise),
and a zero hazard changes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import config_from

from fedhet.config import ConfigError, from_dict
from fedhet.engine.loop import RunLoop
from fedhet.system.types import Workload
from fedhet.world import build_system

DRAWS = 20_000  # sampled rounds per frequency check


def _system(num_clients=6, num_layers=4, **system):
    config = from_dict({"data": {"num_clients": num_clients}, "system": system})
    return build_system(config, num_clients, num_layers)


def _frequencies(system, work, draws=DRAWS, seed=0):
    """Sampled P[u delivers], P[u delivers and reaches l] and P[no delivering client reaches l]."""
    rng = np.random.default_rng(seed)
    layers = np.arange(1, system.num_layers + 1)
    delivered = np.zeros(system.num_clients)
    reach = np.zeros((system.num_clients, system.num_layers))
    nobody = np.zeros(system.num_layers)
    for _ in range(draws):
        out = system.sample(work, rng)
        hit = out.participates[:, None] & (out.depth[:, None] <= layers[None, :])
        delivered += out.participates
        reach += hit
        nobody += ~hit.any(axis=0)
    return delivered / draws, reach / draws, nobody / draws


def _within(sampled, expected, draws, sigmas=4.5, extra=0.0):
    """|sampled - expected| within ``sigmas`` binomial standard errors (plus ``extra``, the
    variance share of an estimated marginal)."""
    expected = np.asarray(expected)
    error = np.sqrt(np.clip(expected * (1 - expected), 1e-12, None) * (1 / draws + extra))
    assert np.all(np.abs(np.asarray(sampled) - expected) <= sigmas * error + 1e-9), (sampled, expected)


def test_per_step_dropout_marginals_are_the_closed_form_and_match_the_samples():
    """Per-step cost without jitter: client u finishes at f_u = min(c_u K + b, T) and delivers
    with probability exp(-lambda f_u) exactly; 20,000 sampled rounds agree within 4.5 sigma."""
    system = _system(
        model="per-step", time_per_sample_step=0.05, comm_time=0.2, capability_profile="list",
        capabilities=[0.5, 0.8, 1.0, 1.2, 1.5, 3.0], dropout="hazard", dropout_hazard=0.4,
    )  # fmt: skip
    work = Workload(1.5, np.full(6, 8), np.full(6, 2))
    marginals = system.marginals(work)
    caps = np.array([0.5, 0.8, 1.0, 1.2, 1.5, 3.0])
    caps = caps / caps.mean()
    finish = np.minimum(0.05 * 8 / caps * 2 + 0.2, 1.5)
    assert marginals.participation_prob == pytest.approx(np.exp(-0.4 * finish))
    assert system.reports()["dropout"]["marginals"] == "exact"
    delivered, reach, nobody = _frequencies(system, work)
    _within(delivered, marginals.participation_prob, DRAWS)
    _within(reach, marginals.reach_prob, DRAWS)
    _within(nobody, marginals.no_reach_prob, DRAWS)


@pytest.mark.parametrize("model", ["exponential", "straggler-ratio"])
def test_estimated_dropout_marginals_match_the_samples(model):
    """Exponential layer times (independent clients) and a straggler set per round (clients
    drawn jointly): the marginals, estimated from 4,000 draws of the wrapped model, match
    20,000 sampled rounds within 4.5 standard errors of both."""
    options = {"exponential": {"time_per_sample_layer": 0.02, "capability_profile": "uniform"},
               "straggler-ratio": {"straggler_ratio": 0.5}}[model]  # fmt: skip
    system = _system(model=model, dropout="hazard", dropout_hazard=0.3, dropout_marginal_draws=4000,
                     deadline=1.0, **options)  # fmt: skip
    work = Workload(1.0, np.full(6, 16))
    marginals = system.marginals(work)
    assert system.reports()["dropout"]["marginals"] == "estimated from 4000 draws"
    delivered, reach, nobody = _frequencies(system, work, seed=1)
    _within(delivered, marginals.participation_prob, DRAWS, extra=1 / 4000)
    _within(reach, marginals.reach_prob, DRAWS, extra=1 / 4000)
    _within(nobody, marginals.no_reach_prob, DRAWS, extra=1 / 4000)
    assert (marginals.participation_prob < 1).all() and (marginals.participation_prob > 0.5).all()


def test_per_client_hazards_fail_the_fragile_client_only():
    system = _system(model="full", dropout="hazard", dropout_hazards=[0, 0, 0, 0, 0, 5.0], deadline=1.0)
    marginals = system.marginals(Workload(1.0, np.full(6, 16)))
    assert marginals.participation_prob == pytest.approx([1, 1, 1, 1, 1, np.exp(-5.0)])


BASE = {
    "run": {"name": "d", "rounds": 4, "threads": 1, "seed": 2},
    "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"batch_size": 8},
    "system": {"model": "exponential", "time_per_sample_layer": 0.05, "capability_profile": "uniform"},
    "algorithm": {"name": "salf"},
}


def _config(**sections):
    return config_from(BASE, **sections)


def test_a_zero_hazard_changes_nothing(tmp_path):
    plain = RunLoop(_config(), tmp_path / "plain").run()
    zero = RunLoop(_config(system={"dropout": "hazard", "dropout_hazard": 0.0}), tmp_path / "zero").run()
    assert zero.metrics == plain.metrics


def test_failed_clients_are_absent_and_a_run_resumes_bit_identically(tmp_path):
    config = _config(run={"rounds": 6}, system={"dropout": "hazard", "dropout_hazard": 1.5})
    plain = RunLoop(_config(run={"rounds": 6}), tmp_path / "plain").run()
    whole = RunLoop(config, tmp_path / "whole").run()
    assert sum(r["participants"] for r in whole.metrics) < sum(r["participants"] for r in plain.metrics)
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    report = json.loads((tmp_path / "whole" / "dropout.json").read_text())
    assert report["marginals"] == "estimated from 2000 draws" and report["hazards"] == [1.5] * 6


def test_an_asynchronous_rule_restarts_a_failed_client(tmp_path):
    """On the event driver a failed client delivers nothing and is started again later."""
    config = _config(run={"rounds": 8}, system={"dropout": "hazard", "dropout_hazard": 2.0},
                     algorithm={"name": "fedbuff", "buffer_size": 2})  # fmt: skip
    result = RunLoop(config, tmp_path / "async").run()
    assert len(result.metrics) == 8


def test_bad_dropout_options_are_refused():
    for system, key in (({"dropout_hazard": -1.0}, "dropout_hazard"),
                        ({"dropout_hazards": [0.1, 0.2]}, "dropout_hazards"),
                        ({"dropout_marginal_draws": 0}, "dropout_marginal_draws")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"system.{key}"):
            _config(system={"dropout": "hazard", **system})
    with pytest.raises(ConfigError, match="system.dropout"):
        _config(system={"dropout": "sometimes"})
