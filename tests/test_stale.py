"""The FedStale family (FedStale eqs. (5), (7), (9); MIFA; FedAvg over participants):
equivalences at beta = 0 and 1, unbiasedness over participation draws, memory, resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.algorithms import ALGORITHMS
from fedhet.algorithms.memory import ClientMemory
from fedhet.config import TrainConfig, build_options
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate, Coverage

PARTIAL = {
    "run.rounds": 12,
    "run.eval_every": 3,
    "train.local_steps": 3,
    "train.lr": 0.05,
    "data.num_clients": 8,
    "system.model": "full",
    "system.participation": "two-group",
    "system.participation_min": 0.3,
}


def _run(tmp_path, name, **overrides):
    config = make_config({**PARTIAL, **overrides})
    return run(config, tmp_path / name)


def _final_params(path):
    return torch.load(path / "checkpoint.pt", weights_only=False)["params"]


@pytest.mark.parametrize("participation", ["known", "fedau"])
def test_beta_zero_is_u_fedavg_and_beta_one_is_fedvarp_exactly(tmp_path, participation):
    """Same seed, same participation draws: FedStale(beta=0) reproduces U-FedAvg (eq. 5) and
    FedStale(beta=1) reproduces FedVARP (eq. 7) to the last bit."""
    common = {"algorithm.participation": participation}
    pairs = [("u-fedavg", 0.0), ("fedvarp", 1.0)]
    for reference, beta in pairs:
        ref = _run(tmp_path, reference, **{"algorithm.name": reference, **common})
        stale = _run(
            tmp_path, f"fedstale-{beta}", **{"algorithm.name": "fedstale", "algorithm.beta": beta, **common}
        )
        assert stale.metrics == ref.metrics
        assert torch.equal(_final_params(stale.path), _final_params(ref.path))
    # and the two ends really differ, so the equalities above say something
    assert not torch.equal(_final_params(tmp_path / "u-fedavg"), _final_params(tmp_path / "fedvarp"))
    middle = _run(tmp_path, "fedstale-0.5", **{"algorithm.name": "fedstale", "algorithm.beta": 0.5, **common})
    assert not torch.equal(_final_params(middle.path), _final_params(tmp_path / "fedvarp"))


def test_everyone_present_and_beta_zero_is_fedavg(tmp_path):
    """With every p_i = 1 (no Bernoulli wrapper) FedStale(beta=0) is FedAvg over all clients,
    up to float32 rounding of a different summation order."""
    always = {"system.participation": "always"}
    fedavg = _run(tmp_path, "fedavg", **{"algorithm.name": "fedavg", **always})
    stale = _run(tmp_path, "stale", **{"algorithm.name": "fedstale", "algorithm.beta": 0.0, **always})
    assert torch.allclose(_final_params(stale.path), _final_params(fedavg.path), atol=1e-5)
    for a, b in zip(stale.metrics, fedavg.metrics, strict=True):
        assert a["participants"] == b["participants"] == 8
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert stale.summary["final_test_accuracy"] == pytest.approx(
        fedavg.summary["final_test_accuracy"], abs=0.01
    )


def _algorithm(name, **options):
    return ALGORITHMS[name](build_options(name, options), TrainConfig())


def _fixed_round(num_clients=6, size=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    deltas = torch.randn(num_clients, size, generator=gen)
    memory = torch.randn(num_clients, size, generator=gen)
    probs = np.array([1.0, 0.8, 0.5, 0.3, 0.15, 0.6])[:num_clients]
    return deltas, memory, probs


def _as_memory(rows, weights):
    memory = ClientMemory(rows.shape[0], rows.shape[1], weights)
    for client, row in enumerate(rows):
        memory.set(client, row)
    return memory


def _monte_carlo_mean(algorithm, deltas, memory, probs, weights, draws=20000, seed=1):
    rng = np.random.default_rng(seed)
    total = torch.zeros(deltas.shape[1], dtype=torch.float64)
    for _ in range(draws):
        present = np.flatnonzero(rng.random(len(probs)) < probs)
        updates = [ClientUpdate(int(i), Coverage(1), 1, 1, 0.0, deltas[i], torch.zeros(0)) for i in present]
        total += algorithm.direction(_as_memory(memory, weights), updates, weights, 1.0 / probs).double()
    return total / draws


@pytest.mark.parametrize(
    "name,options",
    [("u-fedavg", {}), ("fedvarp", {}), ("fedstale", {"beta": 0.5}), ("fedstale", {"beta": 0.2})],
)
@pytest.mark.parametrize("weights", ["uniform", "samples"])
def test_aggregate_is_unbiased_over_participation_draws(name, options, weights):
    """For fixed client updates and memory, E[D] over Bernoulli(p_i) participation equals the
    full-participation aggregate sum_i q_i Delta_i (FedStale Lemma: unbiased for any beta)."""
    deltas, memory, probs = _fixed_round()
    q = np.full(6, 1 / 6) if weights == "uniform" else np.array([1, 2, 3, 4, 5, 6]) / 21
    algorithm = _algorithm(name, weights=weights, **options)
    mean = _monte_carlo_mean(algorithm, deltas, memory, probs, q)
    target = (torch.as_tensor(q)[:, None] * deltas.double()).sum(0)
    assert torch.allclose(mean, target, atol=0.03), (mean, target)


def test_mifa_is_biased_towards_its_memory():
    """MIFA averages stale memory in without correction: its mean aggregate is not the full
    mean, which shows the unbiasedness test can tell the difference."""
    deltas, memory, probs = _fixed_round()
    q = np.full(6, 1 / 6)
    mean = _monte_carlo_mean(_algorithm("mifa"), deltas, memory, probs, q, draws=4000)
    target = (torch.as_tensor(q)[:, None] * deltas.double()).sum(0)
    assert (mean - target).abs().max() > 0.1


def test_memory_holds_last_updates_and_its_cost_is_reported(tmp_path):
    result = _run(tmp_path, "mem", **{"algorithm.name": "fedstale", "algorithm.participation": "fedau"})
    state = torch.load(result.path / "checkpoint.pt", weights_only=False)["algorithm"]
    memory = ClientMemory.restore(state["memory"]["reference"], result.path / "client-memory").rows
    assert memory.shape == (8, result.summary["num_params"])
    stored = memory.abs().sum(1) > 0
    assert np.array_equal(stored.numpy(), state["has_memory"])
    report = json.loads((result.path / "server_memory.json").read_text())
    assert report["bytes"] == 8 * result.summary["num_params"] * 4
    assert report["clients_stored"] == int(stored.sum())
    participation = json.loads((result.path / "participation.json").read_text())
    assert participation["rounds"] == 12 and len(participation["fedau_estimate_history"]) == 12
    assert participation["known_prob"].count(1.0) == 4 and participation["known_prob"].count(0.3) == 4
    assert all(0 < p <= 1 for p in participation["fedau_estimate"])


def test_interrupted_fedau_run_resumes_identically(tmp_path):
    config = make_config({**PARTIAL, "algorithm.name": "fedstale", "algorithm.participation": "fedau"})
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=5)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert resumed.metrics == whole.metrics
    assert torch.equal(_final_params(tmp_path / "cut"), _final_params(tmp_path / "whole"))


def test_slow_present_clients_count_as_absent_with_the_right_probability(tmp_path):
    """Participation on top of stragglers: only full updates are used, and the known p_i is
    P[present] x P[finished every layer]."""
    result = _run(
        tmp_path,
        "slow",
        **{
            "algorithm.name": "u-fedavg",
            "system.model": "uniform-depth",
            "system.participation": "list",
            "system.participation_probs": [1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2],
        },
    )
    participation = json.loads((result.path / "participation.json").read_text())
    num_layers = result.summary["num_layers"]
    expected = np.array([1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2]) / (num_layers + 1)
    assert np.allclose(participation["known_prob"], expected)
    assert all(r["participants"] <= 8 for r in result.metrics)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("algorithm.beta", 1.5, "algorithm.beta = 1.5"),
        ("algorithm.participation", "guess", "algorithm.participation = 'guess'"),
        ("algorithm.fedau_cutoff", 0, "algorithm.fedau_cutoff = 0"),
        ("algorithm.server_lr", 0.0, "algorithm.server_lr = 0.0"),
        ("system.participation_min", 0.0, "system.participation_min = 0.0"),
        ("system.participation", "weekly", "system.participation = 'weekly'"),
    ],
)
def test_bad_options_give_one_line_errors_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        make_config({**PARTIAL, "algorithm.name": "fedstale", key: value})


def test_beta_map_picks_the_best_beta_per_cell_and_draws_it(tmp_path):
    """Small real grid: two heterogeneity cells x three betas (u-fedavg standing for beta 0);
    beta_opt is the argmax of the averaged accuracy and Delta_0/Delta_1 its gains."""
    from fedhet.errors import FedhetError
    from fedhet.studies.beta_map import beta_map, collect, markdown_table, records_csv
    from fedhet.studies.plots import plot_beta_map, plot_stale_slices

    runs = tmp_path / "grid"
    for p_min in (0.5, 0.25):
        for name, beta in (("u-fedavg", None), ("fedstale", 0.5), ("fedstale", 1.0)):
            overrides = {"algorithm.name": name, "system.participation_min": p_min, "run.rounds": 4}
            if beta is not None:
                overrides["algorithm.beta"] = beta
            run(make_config({**PARTIAL, **overrides}), runs / f"{p_min}-{name}-{beta}")
    cells = beta_map(collect(runs, last=2))
    assert [round(c.participation_ratio, 3) for c in cells] == [1.5, 2.5]
    for cell in cells:
        assert set(cell.accuracy) == {0.0, 0.5, 1.0}
        best = max(cell.accuracy.values())
        assert cell.accuracy[cell.beta_opt] == best
        assert cell.gain_over(0.0) == pytest.approx(best - cell.accuracy[0.0])
        assert cell.gain_over(1.0) >= 0.0
    table = markdown_table(cells)
    assert table.count("\n") == 4 and "beta_opt" in table
    # the per-run table a results page commits gives the same map, and refuses another --last
    saved = tmp_path / "records.csv"
    saved.write_text(records_csv(collect(runs, last=2), last=2))
    again = beta_map(collect(saved, last=2))
    assert [(c.swap_fraction, c.participation_ratio, c.per_seed) for c in again] == [
        (c.swap_fraction, c.participation_ratio, c.per_seed) for c in cells
    ]
    assert markdown_table(again) == table
    with pytest.raises(FedhetError, match="records.csv: its runs average 2 evaluations, not 3"):
        collect(saved, last=3)
    assert plot_beta_map(cells, tmp_path / "map.png").stat().st_size > 1000
    assert plot_stale_slices(cells, tmp_path / "slices.png", sigma=0.0, ratio=1.5).stat().st_size > 1000


def test_adel_fl_refuses_bernoulli_participation_with_a_clear_error(tmp_path):
    config = make_config(
        {
            "algorithm.name": "adel-fl",
            "system.model": "exponential",
            "system.participation": "two-group",
            "run.time_budget": 30.0,
        }
    )
    with pytest.raises(ConfigError, match="system.participation: adel-fl plans for clients that are always"):
        run(config, tmp_path / "adel")


def test_beta_opt_bootstrap_and_the_intermediate_beta_test_use_paired_seeds():
    """Hand-made cell, 5 seeds: beta 0.5 is above both ends in every seed by a margin larger
    than the seeds' spread of differences -> beta_opt = 0.5 in (nearly) every resample and a
    significant win; make beta 1 tie with 0.5 in mean and the interval widens to [0.5, 1]
    and the win disappears."""
    from fedhet.studies.beta_map import (
        MapCell,
        bootstrap_beta_opt,
        intermediate_tests,
        intermediate_wins,
        trends,
        wins_significantly,
    )

    base = {1: 0.70, 2: 0.75, 3: 0.68, 4: 0.72, 5: 0.74}  # seeds differ a lot
    per_seed = {
        0.0: dict(base),
        0.5: {s: v + 0.02 + 0.001 * s for s, v in base.items()},
        1.0: {s: v + 0.005 for s, v in base.items()},
    }

    def cell(per_seed, sigma=0.0, ratio=1.5):
        accuracy = {b: float(np.mean(list(v.values()))) for b, v in per_seed.items()}
        return MapCell(sigma, ratio, 0.5, accuracy, {b: 5 for b in per_seed}, per_seed)

    clear = cell(per_seed)
    interval = bootstrap_beta_opt(clear)
    assert (interval.low, interval.high) == (0.5, 0.5) and interval.share[0.5] == 1.0
    best, p0, p1 = intermediate_wins(clear)
    assert best == 0.5 and p0 < 1e-4 and p1 < 1e-3 and wins_significantly(clear)
    tied = dict(per_seed)
    tied[1.0] = {s: v + (0.03 if s % 2 else 0.015) for s, v in base.items()}  # mean about 0.5's
    unclear = cell(tied)
    interval = bootstrap_beta_opt(unclear)
    assert interval.low == 0.5 and interval.high == 1.0 and 0.05 < interval.share[1.0] < 0.95
    assert not wins_significantly(unclear)
    found = trends([cell(per_seed, 0.0), cell(tied, 1.0)])
    assert found["intermediate_wins_share"] == 0.5 and found["cells_tested"] == 2
    # Holm over the table: the corrected p-values are at least the raw ones, and a win that is
    # significant alone stops being one among enough tests of similar strength
    tests = intermediate_tests([cell(per_seed, 0.0), cell(tied, 1.0)])
    assert tests[0].wins and tests[0].p0_holm >= tests[0].p0 and tests[0].p1_holm >= tests[0].p1
    weak = dict(per_seed)
    weak[0.5] = {s: v + (0.006 if s % 2 else 0.02) for s, v in per_seed[1.0].items()}  # p about 0.03
    alone = cell(weak)
    assert wins_significantly(alone)
    many = intermediate_tests([cell(weak, sigma) for sigma in (0.0, 0.3, 0.6, 1.0)])
    assert not any(t.wins for t in many)
