"""A rule is a few small parts: no class a rule subclasses carries more than a dozen hooks;
every built-in names its parts itself and shares the defaults (FedProx is FedAvg with
another client part, the presets FedAvg with a server step, the sub-model rules one
planner); a rule written as one class still runs, its hooks moved into parts; each part's
server state is saved as its own; and the planner plans before the round is drawn."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from conftest import make_config

from fedhet.algorithms import parts
from fedhet.algorithms.base import PART_KEYS, Algorithm, check_algorithm_class, part_classes
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.heterofl import HeteroFL
from fedhet.engine.launch import run
from fedhet.errors import ConfigError
from fedhet.registry import builtins
from fedhet.system.types import Outcomes

BASES = (parts.Planner, parts.ClientPart, parts.Aggregation, parts.Reporting, parts.EventScheduler,
         parts.EventAggregation)  # fmt: skip


def _public_methods(cls: type) -> set[str]:
    return {
        name for klass in cls.__mro__ if klass is not object
        for name, value in vars(klass).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    }  # fmt: skip


def test_no_class_a_rule_subclasses_has_more_than_a_dozen_hooks():
    for base in BASES:
        assert _public_methods(base) == set(base.hooks), base.__name__
        assert len(base.hooks) <= 12, base.__name__
    assert len(_public_methods(Algorithm)) <= 12  # build, init_state, state_dict, ...


def test_every_built_in_names_its_parts_itself():
    for name, entry in builtins("algorithm").items():
        for slot, part in part_classes(entry.cls).items():
            assert not hasattr(part, "moved_from"), f"{name}: its {slot} was moved from the rule class"


def test_the_defaults_are_shared_parts():
    rules = {name: entry.cls for name, entry in builtins("algorithm").items()}
    fedprox, fedadam = rules["fedprox"], rules["fedadam"]
    assert fedprox.Aggregation is FedAvg.Aggregation and fedprox.Planner is FedAvg.Planner
    assert fedprox.Client is not FedAvg.Client
    assert issubclass(fedadam.Aggregation, FedAvg.Aggregation)
    assert fedadam.Aggregation.aggregate is FedAvg.Aggregation.aggregate  # only the server step differs
    from fedhet.algorithms.sub_models import KnowledgePlanner

    for name in ("heterofl", "fedrolex", "fjord", "fiarse", "depthfl"):
        assert issubclass(rules[name].Planner, KnowledgePlanner), name


class OneClass(FedAvg):
    """A rule written as one class: its hooks move into parts; super() reaches the parent's."""

    calls = 0

    def aggregate(self, params, buffers, updates, state, context, layout):
        OneClass.calls += 1
        return super().aggregate(params, buffers, updates, state, context, layout)


def test_a_rule_written_as_one_class_runs_with_its_hooks_moved_into_parts(tmp_path):
    assert OneClass.Aggregation.moved_from is OneClass and "aggregate" not in vars(OneClass)
    assert not OneClass.streams  # its own aggregate is never bypassed by FedAvg's streaming one
    OneClass.calls = 0
    run(make_config({"algorithm.name": "test_rule_parts:OneClass", "run.rounds": 2}), tmp_path / "r")
    assert OneClass.calls == 2


class WrongPart(FedAvg):
    Client = parts.Reporting  # not a client part


class TwoKeepers(FedAvg):
    class Planner(parts.Planner):
        def init_state(self, setting):
            return {"count": 0}

    class Aggregation(FedAvg.Aggregation):
        def init_state(self, setting):
            return {"count": 1}


def test_a_part_of_the_wrong_kind_or_a_key_two_parts_keep_is_refused_in_one_line(tmp_path):
    with pytest.raises(
        ConfigError, match=r"Client = .*Reporting.* is not a fedhet.algorithms.parts.ClientPart"
    ):
        check_algorithm_class(WrongPart, "wrong")
    with pytest.raises(
        ConfigError, match="server state key 'count' is kept by both its planner and its aggregation"
    ):
        run(make_config({"algorithm.name": "test_rule_parts:TwoKeepers", "run.rounds": 1}), tmp_path / "r")


def test_each_part_saves_its_own_keys_and_a_resumed_run_gets_them_back(tmp_path):
    config = make_config({"algorithm.name": "scaffold", "run.rounds": 3})
    whole = run(config, tmp_path / "whole").summary
    run(config, tmp_path / "cut", stop_after=2)
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["algorithm"]
    assert set(saved[PART_KEYS]) == {"planner", "aggregation"}
    assert set(saved[PART_KEYS]["aggregation"]) <= set(saved)
    resumed = run(config, tmp_path / "cut", resume=True).summary
    assert resumed["final_test_loss"] == whole["final_test_loss"]


SEEN: list = []


def _holds_outcomes(value, depth: int = 0) -> bool:
    """Whether ``value`` (or anything it holds, four levels down) is a round's draw."""
    if isinstance(value, Outcomes):
        return True
    if depth > 4 or isinstance(value, str | bytes | np.ndarray | torch.Tensor | int | float):
        return False
    if isinstance(value, dict):
        return any(_holds_outcomes(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set):
        return any(_holds_outcomes(v, depth + 1) for v in value)
    return any(_holds_outcomes(v, depth + 1) for v in getattr(value, "__dict__", {}).values())


class Watched(HeteroFL):
    """HeteroFL whose planner notes what it could see when it planned."""

    class Planner(HeteroFL.Planner):
        def plan(self, round_index, state, system, deadline):
            SEEN.append((round_index, _holds_outcomes((state, system, deadline))))
            return super().plan(round_index, state, system, deadline)


def test_the_planner_sees_no_draw_of_the_round_it_plans(tmp_path):
    """Structural: nothing the planner is handed (server state, system model, deadline)
    holds an ``Outcomes``: the round's outcomes are drawn after its plan, from it."""
    SEEN.clear()
    overrides = {"algorithm.name": "test_rule_parts:Watched", "run.rounds": 3, "system.deadline": 1.0}
    run(make_config(overrides), tmp_path / "r")
    assert [t for t, _ in SEEN][-3:] == [0, 1, 2] and not any(leak for _, leak in SEEN)
