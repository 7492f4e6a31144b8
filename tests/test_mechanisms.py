"""Mechanisms declared: a rule says under which settings each of its mechanisms acts. A run
whose settings make one inert says so in one warning line, kept with its caveats, and its
summary names it (``inert_mechanisms``); ``fedhet bench`` does not tune the knobs only an
inert mechanism reads in that scenario, and says so on its page; a declaration naming a knob
that is not an option is refused when the rule is registered."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from conftest import BENCH_PLUGIN, SMOKE_SUITE, config_from, rule_setting

from fedhet.errors import ConfigError

BASE = {
    "run": {"name": "mech", "seed": 1, "rounds": 3, "threads": 1, "eval_every": 3},
    "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
}
# the mechanism each rule's run at one local step must name as inert
INERT_AT_ONE_STEP = {
    "fedprox": ["its proximal term", "its acceptance of partial local work"],
    "fedcompass": ["its computing-power-aware step assignment"],
    "fedbalancer": ["its sample selection", "its deadline interpolation"],
    "fednova": ["its normalised averaging"],
}


# a rule that assigns work from clients' times runs on a model with a law of time, where
# its mechanism can act at several steps (on a depth-only model it is inert at any count)
TIMED = {"fedcompass": {"model": "per-step", "deadline": 2.0, "capability_profile": "uniform"}}


def _run(tmp_path, name: str, steps: int):
    from fedhet.engine.launch import run

    run_keys, system, options = rule_setting(name)
    system = TIMED.get(name, system)
    config = config_from(BASE, {"run": run_keys, "system": system, "algorithm": {"name": name, **options}},
                         train={"local_steps": steps})  # fmt: skip
    return run(config, tmp_path / f"{name}-{steps}")


@pytest.mark.parametrize("name", sorted(INERT_AT_ONE_STEP))
def test_a_rule_at_one_local_step_says_which_mechanism_is_inert(tmp_path, caplog, name):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        one = _run(tmp_path, name, 1)
    names = one.summary["inert_mechanisms"]
    assert [n for n in names if any(n.startswith(m) for m in INERT_AT_ONE_STEP[name])] == names
    assert len(names) == len(INERT_AT_ONE_STEP[name])
    for mechanism in names:
        line = f"{name}: {mechanism} is inert here: it needs "
        assert line in caplog.text  # one warning line each
        assert any(c.startswith(line) for c in one.summary["caveats"])  # kept with the caveats
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        several = _run(tmp_path, name, 3)
    assert "inert_mechanisms" not in several.summary and "is inert here" not in caplog.text


def test_the_line_names_the_knobs_that_do_nothing():
    from fedhet.algorithms.base import AlgorithmContext
    from fedhet.algorithms.mechanisms import inert_knobs, inert_lines
    from fedhet.registry import resolve

    @dataclass
    class Train:
        local_steps: int

    cls = resolve("algorithm", "fedcompass", "x").cls
    one = cls.build(cls.Options(), AlgorithmContext(Train(1)))
    (line,) = inert_lines(one, "fedcompass")
    assert line.endswith("; algorithm.min_ratio does nothing in this run")
    assert inert_knobs(one) == {"algorithm.min_ratio"}
    # Q_max from max_steps: a range of steps again, whatever train.local_steps is
    wide = cls.build(cls.Options(max_steps=5), AlgorithmContext(Train(1)))
    assert inert_lines(wide, "fedcompass") == [] and inert_knobs(wide) == set()
    # min_ratio = 1: Q_min = Q_max, one step count for everyone
    assert inert_knobs(cls.build(cls.Options(max_steps=5, min_ratio=1.0), AlgorithmContext(Train(1))))
    # AMSFL allocates 1..max_steps steps: with max_steps = 1 there is nothing to allocate
    amsfl = resolve("algorithm", "amsfl", "x").cls
    fixed = amsfl.build(amsfl.Options(round_budget=10.0, max_steps=1), AlgorithmContext(Train(1)))
    assert inert_knobs(fixed) == {"algorithm.mu", "algorithm.allocation"}
    assert not inert_knobs(amsfl.build(amsfl.Options(round_budget=10.0), AlgorithmContext(Train(1))))


def test_a_declared_knob_that_is_not_an_option_is_refused_at_registration():
    from fedhet.algorithms.base import check_algorithm_class
    from fedhet.algorithms.fedprox import FedProx
    from fedhet.algorithms.mechanisms import Mechanism

    class Wrong(FedProx):
        mechanisms = (Mechanism("a term", needs="two steps", acts=lambda rule: False, knobs=("muu",)),)

    with pytest.raises(ConfigError, match="mechanism 'a term': knob 'muu' is not one of its options") as err:
        check_algorithm_class(Wrong, "wrong")
    assert "\n" not in str(err.value)

    class NotOne(FedProx):
        mechanisms = ("the proximal term",)

    with pytest.raises(ConfigError, match="not a Mechanism"):
        check_algorithm_class(NotOne, "not-one")


def _suite(tmp_path, extra: str = "", steps_in_persistent: int | None = None):
    text = SMOKE_SUITE.read_text()
    if steps_in_persistent is not None:
        steps = f'"train.local_steps" = {steps_in_persistent}\n'
        text = text.replace("[scenarios.persistent-90]\n", "[scenarios.persistent-90]\n" + steps)
    path = tmp_path / "suite.toml"
    path.write_text(text + extra)
    return path


def test_the_bench_does_not_tune_a_knob_whose_mechanism_is_inert_in_that_scenario(tmp_path):
    """FedProx's mu is searched where the suite runs three local steps, not where it runs
    one; the study's settings (its identity) follow; the page names what was not tuned."""
    from fedhet.bench.command import header
    from fedhet.bench.study import settings_of
    from fedhet.bench.suite import Tuning, load_suite

    suite = load_suite(_suite(tmp_path, steps_in_persistent=3))
    pairs = {(s.name, m.label): (s, m) for s, m in suite.pairs()}
    one, three = pairs[("random-50", "fedprox")], pairs[("persistent-90", "fedprox")]
    assert "algorithm.mu" not in [p.key for p in suite.params_for(*one)] and suite.own_for(*one) == []
    assert "algorithm.mu" in [p.key for p in suite.params_for(*three)] and suite.own_for(*three) == [
        "algorithm.mu"
    ]
    assert "algorithm.mu" not in settings_of(suite, Tuning(*one))["params"]
    assert "algorithm.mu" in settings_of(suite, Tuning(*three))["params"]
    assert suite.inert == {("random-50", "fedprox"): ["algorithm.mu"]}
    said = header(suite)["settings"]["knobs not tuned (their mechanism is inert there)"]
    assert said == "fedprox: algorithm.mu in random-50"


def test_a_knob_stays_searched_when_a_searched_key_can_make_its_mechanism_act(tmp_path):
    """With train.local_steps searched over 1..3, FedProx's proximal term acts in some
    trials: mu stays in the search."""
    from fedhet.bench.suite import load_suite

    extra = '\n[algorithm_params.fedprox]\n"train.local_steps" = { low = 1, high = 3, int = true }\n'
    suite = load_suite(_suite(tmp_path, extra))
    assert suite.inert == {}
    for scenario, method in suite.pairs():
        if method.label == "fedprox":
            assert "algorithm.mu" in [p.key for p in suite.params_for(scenario, method)]


MECHANISM_RULE = """
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.mechanisms import Mechanism


def broken(rule):
    raise KeyError("steps")


class Checked(FedAvg):
    name = "checked"
    mechanisms = (Mechanism("a broken test", needs="nothing", acts=broken),)
"""


def test_a_plugins_mechanism_test_that_raises_is_one_line_when_the_suite_loads(tmp_path, monkeypatch):
    from fedhet.bench.suite import load_suite

    (tmp_path / "mechanism_rule.py").write_text(MECHANISM_RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(BENCH_PLUGIN))
    with pytest.raises(
        ConfigError, match="method Checked: its mechanisms' test of the settings raised KeyError"
    ):
        load_suite(_suite(tmp_path), ["mechanism_rule:Checked"])


def test_fedhet_list_shows_a_rules_mechanisms_and_what_they_need(capsys):
    from fedhet.cli import main

    assert main(["list", "algorithm", "fedcompass"]) == 0
    out = capsys.readouterr().out
    assert "mechanism: its computing-power-aware step assignment" in out and "(reads min_ratio)" in out
    assert main(["list", "algorithm", "salf"]) == 0
    assert "mechanism:" not in capsys.readouterr().out  # nothing declared


def test_a_step_assignment_from_clients_times_is_inert_on_a_model_without_a_law_of_time(tmp_path, caplog):
    """FedCompass assigns steps from the clients' speeds: on the straggler-ratio model times
    are the deadline's, so at 3 local steps its assignment is inert there (the run says so,
    the bench leaves ``algorithm.min_ratio`` out), and acts on the per-step model."""
    from fedhet.algorithms.mechanisms import NO_TIME_LAW
    from fedhet.bench.suite import load_suite
    from fedhet.engine.launch import run

    config = config_from(BASE, {"system": {"model": "straggler-ratio", "straggler_ratio": 0.5},
                                "algorithm": {"name": "fedcompass"}}, train={"local_steps": 3})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        summary = run(config, tmp_path / "depth-only").summary
    assert [n for n in summary["inert_mechanisms"] if n.startswith("its computing-power-aware")]
    assert f"is inert here: it needs {NO_TIME_LAW}; algorithm.min_ratio does nothing" in caplog.text
    per_step = (
        '\n[scenarios.per-step]\n"system.model" = "per-step"\n"system.deadline" = 2.0\n'
        '"system.capability_profile" = "uniform"\n"train.local_steps" = 3\n'
    )
    suite = load_suite(_suite(tmp_path, extra=per_step, steps_in_persistent=3), extra_methods=["fedcompass"])
    pairs = {(s.name, m.label): (s, m) for s, m in suite.pairs()}
    assert "algorithm.min_ratio" not in [
        p.key for p in suite.params_for(*pairs[("persistent-90", "fedcompass")])
    ]
    assert "algorithm.min_ratio" in [p.key for p in suite.params_for(*pairs[("per-step", "fedcompass")])]
