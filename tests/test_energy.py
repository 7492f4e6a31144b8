"""Energy on the clock: each asked client's joules are its training, communication and
waiting seconds times its power draw (computed here by hand), the account survives a resume,
``run.energy_budget`` stops a run before the round that would pass it, device files give
per-device power draws, and a failed client is charged up to its failure."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import FOUR_CLIENTS_PER_STEP as PER_STEP
from conftest import make_config

from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import FedhetError
from fedhet.system.energy import PowerDraw, spent_in_round
from fedhet.system.types import Outcomes


def hand_energy(finish, comm, duration, watts=(2.0, 1.0, 0.27)):
    """E_u = P_train (f_u - c_u) + P_upload c_u + P_idle (D - f_u), c_u <= f_u here."""
    finish, comm = np.asarray(finish), np.asarray(comm)
    return watts[0] * (finish - comm) + watts[1] * comm + watts[2] * (duration - finish)


@pytest.mark.parametrize(
    ("algorithm", "finish", "duration"),
    [
        ("drop", [3.0, 3.0, 2.3, 1.4], 3.0),  # cut at the deadline: the round lasts 3 s
        ("fedavg", [4.1, 4.2, 2.3, 1.4], 4.2),  # waits for everyone: 2 c_u + b_u
    ],
)
def test_a_rounds_energy_is_the_hand_computed_sum(tmp_path, algorithm, finish, duration):
    result = run(make_config({**PER_STEP, "algorithm.name": algorithm}), tmp_path / algorithm)
    expected = hand_energy(finish, [0.1, 0.2, 0.3, 0.4], duration)
    rows = result.metrics
    assert rows[0]["round_time"] == pytest.approx(duration)
    assert [r["energy"] for r in rows] == pytest.approx([expected.sum()] * 3)
    assert rows[-1]["energy_total"] == pytest.approx(3 * expected.sum())
    assert result.summary["energy"] == pytest.approx(3 * expected.sum())
    with open(tmp_path / algorithm / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [float(r["joules"]) for r in table] == pytest.approx(list(3 * expected))
    assert [float(r["idle_s"]) for r in table] == pytest.approx([3 * (duration - f) for f in finish])


def test_the_account_survives_a_resume(tmp_path):
    config = make_config({**PER_STEP, "algorithm.name": "drop", "run.rounds": 4, "system.step_jitter": 0.3})
    whole = run(config, tmp_path / "whole")
    RunLoop(config, tmp_path / "cut").run(stop_after=2)
    resumed = RunLoop(config, tmp_path / "cut").run(resume=True)
    assert [r["energy_total"] for r in resumed.metrics] == [r["energy_total"] for r in whole.metrics]
    assert (tmp_path / "cut" / "clients.csv").read_text() == (tmp_path / "whole" / "clients.csv").read_text()


def test_the_energy_budget_stops_before_the_round_that_would_pass_it(tmp_path):
    per_round = hand_energy([3.0, 3.0, 2.3, 1.4], [0.1, 0.2, 0.3, 0.4], 3.0).sum()
    budget = 4.5 * per_round
    config = make_config({**PER_STEP, "algorithm.name": "drop", "run.rounds": 100,
                          "run.energy_budget": budget})  # fmt: skip
    summary = run(config, tmp_path / "run").summary
    assert summary["stopped_by"] == "energy_budget" and summary["finished"]
    assert summary["rounds"] == 4 and summary["energy"] == pytest.approx(4 * per_round)
    too_small = make_config({**PER_STEP, "algorithm.name": "drop", "run.energy_budget": per_round / 2})
    with pytest.raises(FedhetError, match=r"run.energy_budget = .*less than the first round spends"):
        run(too_small, tmp_path / "small")


def test_an_energy_budget_the_time_budget_never_lets_a_run_reach_is_a_caveat(tmp_path):
    """Every client at its highest draw for the whole time budget spends at most a ceiling:
    an energy budget at or above it can never bind, and the run says so; one below it does
    not get the caveat."""
    base = {**PER_STEP, "algorithm.name": "drop", "run.rounds": 100, "run.time_budget": 10.0}
    ceiling = 10.0 * 4 * 2.0  # 4 clients, [system]'s default compute_watts = 2 W the highest
    never = run(make_config({**base, "run.energy_budget": ceiling}), tmp_path / "never").summary
    caveats = [c for c in never.get("caveats", []) if "run.energy_budget" in c]
    assert len(caveats) == 1 and "can never bind" in caveats[0] and "at most 80 J" in caveats[0]
    assert never["stopped_by"] == "time_budget"
    binding = run(make_config({**base, "run.energy_budget": ceiling * 0.99}), tmp_path / "binding").summary
    assert not [c for c in binding.get("caveats", []) if "run.energy_budget" in c]


@pytest.mark.parametrize("rule", ["fedbuff", "fedcompass", "asyncfl"])
def test_an_event_driven_runs_energy_accounts_agree_at_a_time_budget_stop(tmp_path, rule):
    """Starts are charged when they happen: those after the last server step are in the
    summary and clients.csv but in no metrics row, and the summary says how much
    (``energy_in_flight``): summary = rows + in flight = the clients' joules."""
    extra = {"algorithm.buffer_size": 3} if rule == "fedbuff" else {}
    config = make_config({**PER_STEP, "algorithm.name": rule, "run.rounds": 1000, "run.time_budget": 60.0,
                          "system.deadline": 20.0, **extra})  # fmt: skip
    result = run(config, tmp_path / "run")
    summary = result.summary
    rows = sum(float(r["energy"]) for r in result.metrics)
    with (tmp_path / "run" / "clients.csv").open() as fh:
        clients = sum(float(c["joules"]) for c in csv.DictReader(fh))
    assert summary["stopped_by"] == "time_budget"
    assert summary["energy"] == pytest.approx(rows + summary["energy_in_flight"], rel=1e-9)
    assert summary["energy"] == pytest.approx(clients, rel=1e-9)
    assert result.metrics[-1]["energy_total"] == pytest.approx(rows, rel=1e-9)
    if rule == "fedbuff":  # clients were working when the budget ran out
        assert summary["energy_in_flight"] > 0


def test_device_files_give_each_device_its_power_draw(tmp_path):
    devices = tmp_path / "devices.csv"
    devices.write_text(
        "device,compute,upload,download,compute_watts,idle_watts\n"
        "slow,0.02,1000000,1000000,1.5,0.1\n"
        "fast,0.01,1000000,1000000,4.0,0.5\n"
    )
    config = make_config({**PER_STEP, "algorithm.name": "drop", "system.capability_profile": "devices",
                          "system.capabilities": [], "system.device_profiles": str(devices),
                          "system.device_assignment": "in-order", "system.upload_watts": 0.7})  # fmt: skip
    run(config, tmp_path / "run")
    with open(tmp_path / "run" / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [r["device"] for r in table] == ["slow", "fast", "slow", "fast"]
    assert [float(r["compute_watts"]) for r in table] == [1.5, 4.0, 1.5, 4.0]
    assert [float(r["idle_watts"]) for r in table] == [0.1, 0.5, 0.1, 0.5]
    assert [float(r["upload_watts"]) for r in table] == [0.7] * 4  # no column: [system]'s value
    for r in table:
        spent = float(r["compute_watts"]) * float(r["train_s"]) + 0.7 * float(r["comm_s"])
        assert float(r["joules"]) == pytest.approx(spent + float(r["idle_watts"]) * float(r["idle_s"]))


def test_a_failed_client_is_charged_up_to_its_failure_and_an_absent_one_nothing():
    power = PowerDraw.of(3, {"compute_watts": 2.0, "upload_watts": 1.0, "idle_watts": 0.5})
    outcomes = Outcomes(
        participates=np.array([True, False, False]),
        depth=np.array([1, 1, 1]),
        full_time=np.array([4.0, 4.0, 4.0]),
        finish_time=np.array([4.0, 1.5, 4.0]),
        failure_time=np.array([np.inf, 1.5, np.inf]),  # client 1 failed at 1.5 s; client 2 absent
        comm_time=np.array([1.0, 1.0, 1.0]),
    )
    from fedhet.system.energy import involved

    spent = spent_in_round(power, outcomes, involved(outcomes, np.ones(3, dtype=bool)), duration=5.0)
    assert spent.joules.tolist() == pytest.approx([2 * 3 + 1 + 0.5 * 1, 2 * 0.5 + 1 + 0.5 * 3.5, 0.0])
    alone = spent_in_round(power, outcomes, np.array([True, False, False]), duration=5.0, waits=False)
    assert alone.idle_s.tolist() == [0.0, 0.0, 0.0] and alone.total == pytest.approx(7.0)


def test_an_event_driven_rule_is_charged_when_its_clients_start(tmp_path):
    config = make_config({**PER_STEP, "algorithm.name": "fedasync", "run.rounds": 6})
    result = run(config, tmp_path / "run")
    rows = result.metrics
    assert np.cumsum([r["energy"] for r in rows]) == pytest.approx([r["energy_total"] for r in rows])
    with open(tmp_path / "run" / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    assert all(float(r["idle_s"]) == 0.0 for r in table)  # asynchronous clients never wait
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["energy"] == pytest.approx(
        sum(float(r["joules"]) for r in table)
    )


def test_a_straggler_training_past_the_deadline_is_charged_its_whole_work_once(tmp_path):
    """REFL's stragglers (clients 0 and 1: 4.1 and 4.2 s of work against a 3 s deadline) keep
    training and deliver in round 2: round 1 charges their whole work, round 2 nothing for
    them (they are still at work and get no task), round 3 their next whole work."""
    result = run(make_config({**PER_STEP, "algorithm.name": "refl"}), tmp_path / "refl")
    on_time = hand_energy([2.3, 1.4], [0.3, 0.4], 3.0)
    whole = 2.0 * (4.1 - 0.1) + 1.0 * 0.1 + 2.0 * (4.2 - 0.2) + 1.0 * 0.2  # no waiting
    rows = result.metrics
    assert [r["round_time"] for r in rows] == pytest.approx([3.0] * 3)
    assert [r["energy"] for r in rows] == pytest.approx(
        [whole + on_time.sum(), on_time.sum(), whole + on_time.sum()]
    )
    with open(tmp_path / "refl" / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [float(r["train_s"]) for r in table] == pytest.approx([2 * 4.0, 2 * 4.0, 3 * 2.0, 3 * 1.0])
    assert [float(r["idle_s"]) for r in table] == pytest.approx([0.0, 0.0, 3 * 0.7, 3 * 1.6])
    assert json.loads((tmp_path / "refl" / "refl.json").read_text())["rounds"][1]["stale"][0]["client"] == 0


@pytest.mark.parametrize(("algorithm", "deadline"), [("fiarse", 3.0), ("heterofl", 3.0), ("depthfl", 3.9)])
def test_a_sub_model_is_charged_its_share_of_the_work_then_waits(tmp_path, algorithm, deadline):
    """A straggler sent a sub-model works the share s of its full time T the rule sized it by
    (FIARSE: s = its rate, 1/2 here: 4.1 and 4.2 s of work, 2.05 and 2.1 s; HeteroFL and
    DepthFL: their sub-model's FLOPs share), communication included, then waits for the
    deadline; it is charged neither the full model's work nor training up to the deadline."""
    model = {"model.name": "mlp-exits"} if algorithm == "depthfl" else {}  # a model with exits
    config = make_config({**PER_STEP, **model, "system.deadline": deadline, "algorithm.name": algorithm})
    result = run(config, tmp_path / algorithm)
    with open(tmp_path / algorithm / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    fulls, comms = [4.1, 4.2], [0.1, 0.2]  # the stragglers' (clients 0 and 1) work
    shares = [float(r["train_s"]) / 3 / (f - c) for r, f, c in zip(table[:2], fulls, comms, strict=True)]
    assert all(0 < s < deadline / f for s, f in zip(shares, fulls, strict=True))  # it fits the deadline
    for r, full, comm, s in zip(table[:2], fulls, comms, shares, strict=True):
        assert float(r["comm_s"]) == pytest.approx(3 * s * comm)
        assert float(r["idle_s"]) == pytest.approx(3 * (deadline - s * full))
    if algorithm == "fiarse":
        assert shares == pytest.approx([0.5, 0.5])
        expected = hand_energy([2.05, 2.1, 2.3, 1.4], [0.05, 0.1, 0.3, 0.4], 3.0)
        assert [r["energy"] for r in result.metrics] == pytest.approx([expected.sum()] * 3)


def test_a_client_no_sub_model_fits_is_not_asked_to_work(tmp_path):
    """DepthFL's shallowest local model is 0.74 of the work, which fits neither straggler's
    3 s (4.1 and 4.2 s of full work): they get no task and spend nothing; the others as
    under any rule."""
    config = make_config({**PER_STEP, "model.name": "mlp-exits", "algorithm.name": "depthfl"})
    result = run(config, tmp_path / "depthfl")
    with open(tmp_path / "depthfl" / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [float(r["joules"]) for r in table[:2]] == [0.0, 0.0]
    expected = hand_energy([2.3, 1.4], [0.3, 0.4], 3.0)
    assert [r["energy"] for r in result.metrics] == pytest.approx([expected.sum()] * 3)


def test_a_sub_model_sized_from_an_estimate_its_time_does_not_meet_is_charged_to_the_deadline():
    """HeteroFL's planner sizes client 3 from its estimate (1.4 s of full work: the whole
    model fits 3 s); drawn at 4.4 s this round, it trains until the deadline and delivers
    nothing: charged 3 s of work (as drop-stragglers' late clients), not nothing. Clients 0
    and 1, whom no width fits, were told not to work: nothing."""
    from types import SimpleNamespace

    from fedhet.algorithms.types import RoundContext
    from fedhet.engine.drivers import RoundDriver
    from fedhet.engine.plugin_errors import Hooks
    from fedhet.world import build_world

    config = make_config({**PER_STEP, "algorithm.name": "heterofl", "algorithm.rates": [1.0, 0.9]})
    world = build_world(config)
    rule = world.algorithm
    state = rule.init_state(world.setting())
    plan = rule.planner.plan(0, state, world.server_system, 3.0)
    assert plan.record["estimated_full_time"] == pytest.approx([4.1, 4.2, 2.3, 1.4])
    full = np.array([4.1, 4.2, 2.3, 4.4])  # client 3 slower than its estimate this round
    outcomes = Outcomes(np.ones(4, bool), np.ones(4, int), full, np.minimum(full, 3.0),
                        comm_time=np.array([0.1, 0.2, 0.3, 0.4]))  # fmt: skip
    context = RoundContext(plan, outcomes, None, 4, world.flat.num_layers, client_sizes=world.client_sizes)
    tasks = [t for c in range(4) if (t := rule.planner.client_task(context, c, state)) is not None]
    assert [t.client for t in tasks] == [2] and state["late_sub_models"] == 1
    run_state = SimpleNamespace(algorithm=state)
    hooks = Hooks("heterofl", 1)
    spent, _ = RoundDriver._energy(world, run_state, context, np.ones(4, bool), tasks, 3.0, hooks)
    assert spent.joules[:2] == pytest.approx([0.0, 0.0])  # no width fits: not asked to work
    assert spent.joules[3] == pytest.approx(hand_energy([3.0], [0.4], 3.0)[0])  # worked until the deadline
