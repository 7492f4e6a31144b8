"""What the server knows when it sizes a sub-model (``algorithm.planner_knowledge``). By
default (``history``) a sub-model rule sizes each client's work from the time the client
reported the last time it was asked (the system model's expected time before that), never
from this round's draw: where stragglers are drawn anew each round it sometimes sends a
client more work than fits, which the client cannot deliver, and the run counts those clients
(``late_sub_models``). The labelled ``oracle`` restores sizing from this round's drawn time
(none late). The summary records what the planner knew."""

from __future__ import annotations

import pytest
from conftest import config_from

from fedhet.errors import ConfigError

BASE = {
    "run": {"name": "know", "seed": 1, "rounds": 8, "threads": 1, "eval_every": 8},
    "data": {"dataset": "digits", "num_clients": 8, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16, 8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}
SUB_MODEL_RULES = {"heterofl": {}, "fedrolex": {}, "fjord": {}, "fiarse": {},
                   "depthfl": {"model": {"name": "mlp-exits", "hidden": [8]}}}  # fmt: skip


def _run(tmp_path, name: str, knowledge: str | None, **system):
    from fedhet.engine.launch import run

    algorithm = {"name": name, **({"planner_knowledge": knowledge} if knowledge else {})}
    config = config_from(BASE, SUB_MODEL_RULES[name], algorithm=algorithm, system=system)
    return run(config, tmp_path / f"{name}-{knowledge}-{len(system)}")


def _late(result) -> int:
    return int(result.metrics[-1]["late_sub_models"])


@pytest.mark.parametrize("name", sorted(SUB_MODEL_RULES))
def test_stragglers_drawn_anew_are_not_known_in_advance(tmp_path, name):
    """Half the clients straggle, drawn again each round: sized from what they reported
    (the default), some clients get more work than their drawn time fits; the oracle, which
    knows the draw, sends none such."""
    default = _run(tmp_path, name, None)
    assert default.summary["planner_knowledge"] == "history"
    assert _late(default) > 0
    oracle = _run(tmp_path, name, "oracle")
    assert oracle.summary["planner_knowledge"] == "oracle" and _late(oracle) == 0


def test_the_late_count_is_the_clients_whose_sized_work_missed_the_deadline(tmp_path):
    """``late_sub_models`` counts the asked, present clients whose sub-model's work at their
    drawn time exceeds the deadline; they deliver nothing (fewer participants than asked)."""
    default = _run(tmp_path, "heterofl", None)
    late = [int(r["late_sub_models"]) for r in default.metrics]
    assert late == sorted(late)  # a running total
    delivered = sum(int(r["participants"]) for r in default.metrics)
    oracle = _run(tmp_path, "heterofl", "oracle")
    # the oracle sends each client only what fits: every present client delivers
    assert sum(int(r["participants"]) for r in oracle.metrics) > delivered


def test_a_speed_the_server_can_know_is_never_late(tmp_path):
    """Clients of fixed, different speeds (the per-step model, no jitter): the declared
    expectation is each client's time, so work sized from it always fits."""
    per_step = {"model": "per-step", "time_per_sample_step": 0.02, "comm_time": 0.05, "deadline": 0.3,
                "capability_profile": "uniform", "capability_low": 0.2, "capability_high": 2.0}  # fmt: skip
    known = _run(tmp_path, "heterofl", None, **per_step)
    assert _late(known) == 0 and known.summary["planner_knowledge"] == "history"
    assert all(r["participants"] for r in known.metrics)  # every round trained someone


def test_history_reads_the_last_reports_and_the_profile_before_them():
    """The plan's estimate of a client is what it reported last; before its first report,
    the system model's expectation (identical for every client under a random straggler set)."""
    from types import SimpleNamespace

    from fedhet.algorithms.base import RoundPlan
    from fedhet.algorithms.sub_models import with_estimates

    class Halves:  # half the clients take 4 s, half 1 s, drawn at random each time
        num_clients, deterministic = 4, False

        def full_times(self, work, rng):
            return rng.permutation([1.0, 1.0, 4.0, 4.0])

    state = {"reported_time": [None, 3.0, None, 0.5], "late_sub_models": 0, "model_bytes": 4.0}
    train = SimpleNamespace(batch_size=8, local_steps=1)
    plan = RoundPlan(0, 2.0, 0.1, [])
    estimates = with_estimates(plan, state, Halves(), "history", train).record["estimated_full_time"]
    assert estimates[1] == 3.0 and estimates[3] == 0.5  # the reports
    # the expectation, 2.5 s for everyone (the mean of 32 draws)
    assert estimates[0] == pytest.approx(2.5, abs=1.0) and estimates[2] == pytest.approx(2.5, abs=1.0)
    profile = with_estimates(plan, state, Halves(), "profile", train).record["estimated_full_time"]
    assert profile[1] == pytest.approx(2.5, abs=1.0)  # reports ignored
    assert with_estimates(plan, state, Halves(), "oracle", train) is plan  # this round's draw decides


def test_a_profile_planner_uses_the_declared_expectation_only(tmp_path):
    profile = _run(tmp_path, "fiarse", "profile")
    assert profile.summary["planner_knowledge"] == "profile" and _late(profile) > 0


def test_a_bad_knowledge_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.planner_knowledge") as err:
        _run(tmp_path, "heterofl", "psychic")
    assert "\n" not in str(err.value)


def test_rules_that_plan_from_speeds_say_what_they_knew(tmp_path):
    from conftest import rule_setting

    from fedhet.engine.launch import run

    for name, knowledge in (("timelyfl", "profile"), ("fedbalancer", "history")):
        run_keys, system, options = rule_setting(name)
        config = config_from(BASE, {"run": {**run_keys, "rounds": 2}, "system": system},
                             algorithm={"name": name, **options})  # fmt: skip
        assert run(config, tmp_path / name).summary["planner_knowledge"] == knowledge
    salf = run(config_from(BASE, algorithm={"name": "salf"}, run={"rounds": 1}), tmp_path / "salf")
    assert "planner_knowledge" not in salf.summary  # a rule that plans from no speed


def test_the_leaderboard_shows_what_each_planner_knew(tmp_path):
    """A row's seed runs say what the planner knew; the row keeps it (leaderboard.csv's
    planner_knowledge, read back) and the page shows it beside the method."""
    from fedhet.bench import leaderboard

    def row(method: str, knowledge: str, values: list[float]) -> dict:
        result = {"score_metric": "accuracy", "higher_is_better": True, "time_to_target": None,
                  "planner_knowledge": knowledge}  # fmt: skip
        seeds = {s + 1: {**result, "score": v} for s, v in enumerate(values)}
        return {"scenario": "s", "method": method, "status": "ok", "reason": "",
                "tunings": [{"repeat": 1, "params": {}, "validation": 0.5, "seeds": seeds}]}  # fmt: skip

    rows = [row("heterofl", "history", [0.7, 0.72, 0.71]), row("salf", "", [0.69, 0.7, 0.7])]
    board = leaderboard.build(rows)
    entries = {e.method: e for e in board.scenarios["s"]}
    assert entries["heterofl"].knowledge == "history" and entries["salf"].knowledge == ""
    path = leaderboard.write_csv(board, tmp_path / "leaderboard.csv")
    again = {e.method: e for e in leaderboard.build(leaderboard.read_csv(path)).scenarios["s"]}
    assert again["heterofl"].knowledge == "history"
    page = "\n".join(leaderboard.scenario_lines(board.scenarios["s"], None, board.alpha))
    (heterofl,) = [line for line in page.splitlines() if "| heterofl" in line]
    assert heterofl.split("|")[2].strip().endswith("(knew: history)") and "salf (knew" not in page
