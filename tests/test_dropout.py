"""Mid-round dropout: a client fails after Exp(hazard) seconds of work, or when an
availability trace takes it offline, and delivers nothing if that comes before its finish
time (or, with ``dropout_keeps = "finished"``, the pieces it finished by then). The sampled
delivery rates match the wrapper's marginals (exact where the wrapped model draws nothing,
Monte-Carlo estimated otherwise), and a zero hazard changes nothing."""

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


def _frequencies(system, work, draws=DRAWS, seed=0, steps=False, period=None):
    """Sampled P[u delivers], P[u delivers and reaches l] and P[no delivering client reaches l]
    (and P[u delivers k whole steps] with ``steps``); rounds start at uniform times of
    ``period`` when it is given."""
    rng = np.random.default_rng(seed)
    layers = np.arange(1, system.num_layers + 1)
    ks = np.arange(1, work.max_steps + 1)
    delivered = np.zeros(system.num_clients)
    reach = np.zeros((system.num_clients, system.num_layers))
    stepped = np.zeros((system.num_clients, work.max_steps))
    nobody = np.zeros(system.num_layers)
    for _ in range(draws):
        if period is not None:
            work.start_time = rng.uniform(0.0, period)
        out = system.sample(work, rng)
        hit = out.participates[:, None] & (out.depth[:, None] <= layers[None, :])
        delivered += out.participates
        reach += hit
        stepped += out.participates[:, None] & (out.steps_done[:, None] >= ks[None, :])
        nobody += ~hit.any(axis=0)
    found = delivered / draws, reach / draws, nobody / draws
    return (*found, stepped / draws) if steps else found


def _within(sampled, expected, draws, sigmas=4.5, extra=0.0):
    """|sampled - expected| within ``sigmas`` binomial standard errors (plus ``extra``, the
    variance share of an estimated marginal) and 5 counts (an event too rare for an estimate
    from a few thousand draws to have seen it)."""
    expected = np.asarray(expected)
    error = np.sqrt(np.clip(expected * (1 - expected), 1e-12, None) * (1 / draws + extra))
    slack = 5 / draws if extra else 1e-9
    assert np.all(np.abs(np.asarray(sampled) - expected) <= sigmas * error + slack), (sampled, expected)


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


# -- what a failed client finished ("dropout_keeps = finished") ----------------------------


@pytest.mark.parametrize(
    "system",
    [
        {"model": "exponential", "time_per_sample_layer": 0.05, "capability_profile": "uniform"},
        {"model": "per-step", "time_per_sample_step": 0.1, "comm_time": 0.05, "step_jitter": 0.3,
         "capability_profile": "uniform"},
        {"model": "straggler-ratio", "straggler_ratio": 0.5},
        {"model": "uniform-depth"},
        {"model": "full"},
    ],
    ids=lambda s: s["model"],
)  # fmt: skip
def test_piece_times_agree_with_the_deadline_reading(system):
    """Under a deadline T, layer_times[u, l] <= T iff the client reaches layer l, and
    step_times[u, k] <= T iff it finishes k whole steps; all the work is done at full_time.
    This is what lets a failure at F act as the deadline F."""
    model = _system(num_clients=30, **system)
    rng = np.random.default_rng(3)
    for deadline in (0.3, 1.0, 2.0):
        work = Workload(deadline, np.full(30, 16), rng.integers(1, 4, 30), rng.integers(1, 3, 30))
        out = model.sample(work, np.random.default_rng(1))
        slack = deadline * (1 + 1e-9)
        assert ((out.depth[:, None] <= np.arange(1, 5)) == (out.layer_times <= slack)).all()
        assert (
            (out.steps_done[:, None] >= np.arange(1, work.max_steps + 1)) == (out.step_times <= slack)
        ).all()
        last = np.where(np.isfinite(out.step_times), out.step_times, -np.inf).max(axis=1)
        assert last == pytest.approx(out.full_time)


def test_a_failed_client_keeps_the_pieces_it_finished_exactly():
    """Per-step cost without jitter, no deadline: K partial steps reach layer l at
    t_l = K c (L+1-l)/L + b and k whole steps end at k c + b, so P[u delivers layer l] =
    exp(-lambda t_l) and P[u delivers k steps] = exp(-lambda (k c + b)), exactly; 20,000
    sampled rounds agree within 4.5 sigma, and every probability is at least the
    deliver-nothing one, exp(-lambda f_u). A failed client stays a participant (its failure
    is its deadline)."""
    caps = np.array([0.5, 0.8, 1.0, 1.2, 1.5, 3.0])
    options = dict(model="per-step", time_per_sample_step=0.05, comm_time=0.2, capability_profile="list",
                   capabilities=caps.tolist(), dropout="hazard", dropout_hazard=0.4)  # fmt: skip
    kept = _system(dropout_keeps="finished", **options)
    nothing = _system(**options)
    work = Workload(None, np.full(6, 8), np.full(6, 3))
    c = 0.05 * 8 / (caps / caps.mean())
    marginals = kept.marginals(work)
    layer_time = 3 * c[:, None] * (5 - np.arange(1, 5))[None, :] / 4 + 0.2
    step_time = c[:, None] * np.arange(1, 4)[None, :] + 0.2
    assert marginals.reach_prob == pytest.approx(np.exp(-0.4 * layer_time))
    assert marginals.step_prob == pytest.approx(np.exp(-0.4 * step_time))
    assert marginals.participation_prob == pytest.approx(np.ones(6))  # a failed client still takes part
    assert kept.reports()["dropout"] == {
        "law": "hazard",
        "hazards": [0.4] * 6,
        "keeps": "finished",
        "marginals": "exact",
    }
    whole = nothing.marginals(work)
    assert (marginals.reach_prob >= whole.reach_prob).all() and (
        marginals.reach_prob > whole.reach_prob
    ).any()
    delivered, reach, nobody, steps = _frequencies(kept, work, steps=True)
    _within(delivered, marginals.participation_prob, DRAWS)
    _within(reach, marginals.reach_prob, DRAWS)
    _within(nobody, marginals.no_reach_prob, DRAWS)
    _within(steps, marginals.step_prob, DRAWS)


@pytest.mark.parametrize("model", ["exponential", "straggler-ratio"])
def test_estimated_marginals_with_finished_pieces_match_the_samples(model):
    """Wrapped models that draw (exponential times; a straggler set per round, which couples
    the clients): with ``dropout_keeps = finished`` the estimated marginals match 20,000
    sampled rounds within 4.5 standard errors, steps included."""
    options = {"exponential": {"time_per_sample_layer": 0.02, "capability_profile": "uniform"},
               "straggler-ratio": {"straggler_ratio": 0.5}}[model]  # fmt: skip
    system = _system(model=model, dropout="hazard", dropout_hazard=0.8, dropout_marginal_draws=4000,
                     dropout_keeps="finished", deadline=1.0, **options)  # fmt: skip
    work = Workload(1.0, np.full(6, 16), np.full(6, 2))
    marginals = system.marginals(work)
    delivered, reach, nobody, steps = _frequencies(system, work, seed=1, steps=True)
    for sampled, expected in ((delivered, marginals.participation_prob), (reach, marginals.reach_prob),
                              (nobody, marginals.no_reach_prob), (steps, marginals.step_prob)):  # fmt: skip
        _within(sampled, expected, DRAWS, extra=1 / 4000)


def test_finished_pieces_reach_salf_and_a_run_resumes_bit_identically(tmp_path):
    """SALF reads a failed client's top layers as a straggler's: more updates arrive than when
    failures deliver nothing, and kill + resume gives the same metrics."""
    system = {"dropout": "hazard", "dropout_hazard": 1.5}
    nothing = RunLoop(_config(run={"rounds": 6}, system=system), tmp_path / "nothing").run()
    config = _config(run={"rounds": 6}, system={**system, "dropout_keeps": "finished"})
    kept = RunLoop(config, tmp_path / "kept").run()
    assert sum(r["participants"] for r in kept.metrics) > sum(r["participants"] for r in nothing.metrics)
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == kept.metrics


@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedbuff", "buffer_size": 2}])
def test_rules_that_need_their_whole_work_get_the_same_from_both_readings(tmp_path, algorithm):
    """FedAvg (waits for every client) and FedBuff (event-driven) use no partial work: a
    failed client's finished pieces change no update, so both readings train the same
    models. FedAvg's rounds last longer when failures are kept as deadlines: it waits for a
    failed client until it fails."""
    runs = {}
    for keeps in ("nothing", "finished"):
        system = {"dropout": "hazard", "dropout_hazard": 1.5, "dropout_keeps": keeps}
        config = _config(run={"rounds": 5}, system=system, algorithm=algorithm)
        runs[keeps] = RunLoop(config, tmp_path / keeps).run().metrics
    trained = ("participants", "train_loss", "test_loss", "test_accuracy")
    assert [[r[k] for k in trained] for r in runs["finished"]] == [
        [r[k] for k in trained] for r in runs["nothing"]
    ]
    assert sum(r["participants"] for r in runs["nothing"]) > 0
    assert all(a["sim_time"] >= b["sim_time"] for a, b in zip(runs["finished"], runs["nothing"], strict=True))


def test_a_sub_model_counts_only_if_it_ended_before_the_failure():
    """HeteroFL sizes a slow client's width to the deadline; with failures kept as deadlines
    the client delivers its sub-model iff cost(rate) x full_time <= its failure time."""
    from fedhet.algorithms.base import ClientAssignment, RoundContext, RoundPlan
    from fedhet.algorithms.heterofl import HeteroFL
    from fedhet.system.types import Outcomes

    rule = HeteroFL(HeteroFL.Options(), None)
    plan = RoundPlan(0, 1.0, 0.1, [ClientAssignment(8, 1)] * 3)
    full = np.array([0.5, 4.0, 4.0])  # rate 1; rate 0.5 (cost 0.25 x 4 s = 1 s) twice
    outcomes = Outcomes(np.ones(3, bool), np.ones(3, int), full, np.minimum(full, 1.0),
                        failure_time=np.array([0.4, 0.9, np.inf]))  # fmt: skip
    context = RoundContext(plan, outcomes, None, 3, 2)
    tasks = [rule.planner.client_task(context, c, {"rate_cost": {"0.5": 0.25}}) for c in range(3)]
    assert tasks[0] is None and tasks[1] is None  # failed at 0.4 < 0.5 s and 0.9 < 1 s
    assert tasks[2] is not None and tasks[2].coverage.width == 0.5


def test_wall_clock_clients_cannot_keep_finished_pieces():
    with pytest.raises(ConfigError, match="dropout_keeps = 'finished'.*wall-clock"):
        _system(model="wall-clock", dropout="hazard", dropout_keeps="finished")


# -- failures from an availability trace ---------------------------------------------------

TRACE = """# period: 100
0-40 60-100
*
10-30 50-55
-
0-100
20-90
"""


def test_a_trace_fails_a_client_when_it_goes_offline(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text(TRACE)
    system = _system(model="full", dropout="trace", dropout_trace=str(path), deadline=1.0)
    left = [system.time_left(0, t) for t in (0.0, 39.0, 45.0, 70.0, 170.0)]
    assert left == [40.0, 1.0, 0.0, 70.0, 70.0]  # 60-100 runs on into 0-40 of the next period
    assert system.time_left(1, 12.0) == np.inf and system.time_left(3, 5.0) == 0.0
    assert system.time_left(4, 99.5) == np.inf and system.time_left(2, 52.0) == 3.0
    # spells of 80 (60-100 joined with 0-40); 20 and 5; none; 70
    assert system.survival(np.full(6, 10.0)) == pytest.approx([70 / 80, 1, (10 + 0) / 25, 0, 1, 60 / 70])


def test_trace_failures_match_the_stationary_marginals(tmp_path):
    """With the same trace deciding presence at the round's start and failures after it,
    rounds that start at uniform times of the period deliver with probability
    share_u * S_u(f_u) = sum_j max(len_j - f_u, 0) / period; 20,000 rounds agree."""
    path = tmp_path / "trace.txt"
    path.write_text(TRACE)
    system = _system(model="per-step", time_per_sample_step=1.0, capability_profile="list",
                     capabilities=[1, 1, 1, 1, 1, 1], availability="trace", availability_trace=str(path),
                     dropout="trace", dropout_trace=str(path))  # fmt: skip
    work = Workload(None, np.full(6, 8), np.full(6, 2))  # 16 s of work
    marginals = system.marginals(work)
    assert marginals.participation_prob == pytest.approx([64 / 100, 1, 4 / 100, 0, 1, 54 / 100])
    delivered, reach, nobody = _frequencies(system, work, period=100.0)
    _within(delivered, marginals.participation_prob, DRAWS)
    _within(reach, marginals.reach_prob, DRAWS)
    _within(nobody, marginals.no_reach_prob, DRAWS)


def test_a_run_with_trace_failures_resumes_bit_identically(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text(TRACE)
    system = {"model": "per-step", "time_per_sample_step": 0.5, "deadline": 10.0,
              "dropout": "trace", "dropout_trace": str(path), "dropout_keeps": "finished"}  # fmt: skip
    config = _config(run={"rounds": 6}, system=system)
    whole = RunLoop(config, tmp_path / "whole").run()
    assert 0 < sum(r["participants"] for r in whole.metrics) <= 5 * 6  # client 3 is never online
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    assert json.loads((tmp_path / "whole" / "dropout.json").read_text())["law"] == "trace"


def test_bad_failure_options_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="system.dropout_keeps = 'some'"):
        _config(system={"dropout": "hazard", "dropout_keeps": "some"})
    with pytest.raises(ConfigError, match="system.dropout_trace"):
        _config(system={"dropout": "trace"})
