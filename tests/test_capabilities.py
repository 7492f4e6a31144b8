"""Capabilities are derived from the hooks a class defines, or checked against them: a
flag set against its hook, an unknown partial_work, a class that is not an Algorithm are
refused in one line naming the class (built-ins and plug-ins alike); a subclass that
overrides streaming_aggregator alone streams with it; presence wrappers forward every
capability of the wrapped model and checkpoint their own state; the event driver keeps
the system model's state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import RULE_MODELS, rule_data, rule_setting

from fedhet.algorithms.base import Algorithm, check_algorithm_class
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.fedprox import FedProx
from fedhet.algorithms.streaming import ListAggregator
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.errors import ConfigError
from fedhet.registry import builtins
from fedhet.system.base import SystemModel
from fedhet.system.depth import NoStragglers
from fedhet.system.participation import BernoulliParticipation
from fedhet.system.types import Workload

BASE = {
    "run": {"name": "cap", "seed": 1, "rounds": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "system": {"model": "full"},
}


class FlagWithoutHook(FedAvg):
    corrects_gradients = True  # but no gradient_correction: it would never be called


class HookWithoutFlag(FedAvg):
    corrects_gradients = False

    def gradient_correction(self, task, state, region, local, anchor):
        return torch.zeros_like(local)


class UnknownPartialWork(FedAvg):
    partial_work = "layer"  # misspelt "layers"


class NotAnAlgorithm:
    from fedhet.registry import NoOptions as Options

    @classmethod
    def build(cls, options, ctx):
        return cls()


class StreamsAlone(FedAvg):
    """Overrides streaming_aggregator only: its own streaming rule must be the one used."""

    used = 0

    def streaming_aggregator(self, params, buffers, tasks, state, context, layout):
        StreamsAlone.used += 1
        return super().streaming_aggregator(params, buffers, tasks, state, context, layout)


def _refused(path: str) -> str:
    with pytest.raises(ConfigError) as err:
        from_dict({**BASE, "algorithm": {"name": path}})
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_flag_set_against_its_hook_is_refused_in_one_line_naming_the_class():
    message = _refused("test_capabilities:FlagWithoutHook")
    assert "test_capabilities.FlagWithoutHook" in message and "corrects_gradients = True" in message
    assert "does not define gradient_correction" in message
    message = _refused("test_capabilities:HookWithoutFlag")
    assert "corrects_gradients = False" in message and "defines gradient_correction" in message


def test_an_unknown_partial_work_or_a_class_that_is_no_algorithm_is_refused():
    assert "partial_work = 'layer': one of none, layers, steps" in _refused(
        "test_capabilities:UnknownPartialWork"
    )
    assert "not a subclass of fedhet.algorithms.Algorithm" in _refused("test_capabilities:NotAnAlgorithm")


def test_every_built_in_passes_the_check_and_its_flags_follow_its_hooks():
    for name, entry in builtins("algorithm").items():
        check_algorithm_class(entry.cls, name)
    assert FedProx.corrects_gradients and not FedAvg.corrects_gradients
    assert FedAvg.streams and builtins("algorithm")["amsfl"].cls.tracks_gradient_differences


def test_a_subclass_overriding_streaming_aggregator_alone_streams_with_it(tmp_path):
    StreamsAlone.used = 0
    assert StreamsAlone.streams
    run(from_dict({**BASE, "algorithm": {"name": "test_capabilities:StreamsAlone"}}), tmp_path / "r")
    assert StreamsAlone.used == 2  # once a round


def test_a_subclass_overriding_aggregate_alone_is_not_bypassed():
    class AggregatesAlone(FedAvg):
        def aggregate(self, params, buffers, updates, state, context, layout):
            return params, buffers

    assert not AggregatesAlone.streams
    rule = AggregatesAlone(FedAvg.Options(), None)
    aggregator = rule.aggregator(torch.zeros(2), torch.zeros(0), [], {}, None, None)
    assert isinstance(aggregator, ListAggregator)


class Quirky(NoStragglers):
    """Non-default answers to every declared capability, to see them through a wrapper."""

    wall_clock = True
    law = object()

    def time_law(self):
        return self.law

    @property
    def independent_clients(self) -> bool:
        return False


def test_a_presence_wrapper_forwards_every_capability_of_the_wrapped_model():
    base = Quirky(4, 3)
    wrapped = BernoulliParticipation(base, torch.full((4,), 0.5).numpy())
    assert wrapped.wall_clock is True and wrapped.time_law() is Quirky.law
    assert wrapped.independent_clients is False and wrapped.always_present is False
    # drawing presence makes any wrapped model random: the wrapper answers that itself
    assert base.deterministic is True and wrapped.deterministic is False
    answered = {"sample", "marginals", "no_reach_given_presence", "always_present", "deterministic",
                "observe", "state_dict", "load_state_dict", "reports", "build", "Options",
                "name"}  # fmt: skip
    work = Workload(None, np.full(4, 8), np.full(4, 2), np.ones(4, dtype=int))
    arguments = {"full_times": (work, np.random.default_rng(0))}  # the methods that take any
    for name in vars(SystemModel):
        if name.startswith("_") or name in answered:
            continue
        mine, theirs = getattr(wrapped, name), getattr(base, name)
        if callable(theirs):
            args = arguments.get(name, ())
            assert np.array_equal(mine(*args), theirs(*args)) if args else mine() == theirs(), name
        else:
            assert mine == theirs, name


class CountingPresence(BernoulliParticipation):
    def __init__(self, base, probs):
        super().__init__(base, probs)
        self.draws = 0

    def present(self, work, rng):
        self.draws += 1
        return super().present(work, rng)

    def wrapper_state_dict(self):
        return {"draws": self.draws}

    def load_wrapper_state_dict(self, state):
        self.draws = state["draws"]


def test_a_wrappers_own_state_is_checkpointed_beside_the_wrapped_models():
    import numpy as np

    wrapped = CountingPresence(NoStragglers(3, 2), np.full(3, 0.5))
    wrapped.draws = 7
    again = CountingPresence(NoStragglers(3, 2), np.full(3, 0.5))
    again.load_state_dict(wrapped.state_dict())
    assert again.draws == 7
    plain = BernoulliParticipation(NoStragglers(3, 2), np.full(3, 0.5))
    assert plain.state_dict() == NoStragglers(3, 2).state_dict()  # unchanged where a wrapper keeps nothing


class ObservingFull(NoStragglers):
    """Counts the updates it was shown, as a model that learns from arrivals would."""

    name = "observing-full"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = 0

    def observe(self, updates) -> None:
        self.seen += len(updates)

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state.get("seen", 0)


def test_the_event_driver_keeps_the_system_models_state(tmp_path):
    document = {**BASE, "algorithm": {"name": "fedbuff", "buffer_size": 2},
                "system": {"model": "test_capabilities:ObservingFull"}}  # fmt: skip
    run(from_dict(document), tmp_path / "r")
    saved = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)
    assert saved["system"] == {"seen": 4}  # two server steps of two arrivals each


def test_algorithm_base_defaults_are_off():
    assert not Algorithm.streams and not Algorithm.corrects_gradients


def _same(a, b) -> bool:
    """Structural equality of server states (tensors by value; a client memory kept in files
    is its own object, compared by its tensors elsewhere)."""
    import numpy as np

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    if hasattr(a, "persist"):
        return type(a) is type(b)
    return a == b or (a != a and b != b)


@pytest.mark.parametrize(
    "name", sorted(n for n, e in builtins("algorithm").items() if e.cls.driver == "round")
)
def test_plan_is_pure(name):
    """plan() reads the server state and writes none of it: a plan can be priced and
    dropped (the first-round check, a round past the time budget) without a trace."""
    import copy

    from fedhet.engine.pool import InProcessPool, WorkerSide
    from fedhet.world import build_world

    run_keys, system, options = rule_setting(name)
    model = RULE_MODELS.get(name, BASE.get("model", {"name": "mlp"}))
    data = rule_data(name, BASE["data"])
    config = from_dict({**BASE, "run": {**BASE["run"], **run_keys}, "system": system, "model": model,
                        "data": data, "algorithm": {"name": name, **options}})  # fmt: skip
    world = build_world(config)
    setting = world.setting()
    probes = world.algorithm.probe_tasks(setting)
    if probes:
        setting.probes = list(
            InProcessPool(WorkerSide(world, 0)).run(probes, world.initial_params, world.initial_buffers)
        )
    state = world.algorithm.init_state(setting)
    before = copy.deepcopy(state)
    for round_index in range(2):
        world.algorithm.plan(round_index, state, world.system, config.round_deadline)
    assert _same(before, state)


class ListInState(FedAvg):
    def finish_local_work(self, task, update, state, region, local, anchor):
        state["seen"] = [task.round]  # not a tensor: it could not be checkpointed or sent


@pytest.mark.parametrize("pool", ["in-process", "processes"])
def test_client_state_that_is_not_tensors_is_refused_in_one_line_in_every_pool(tmp_path, pool):
    from fedhet.errors import FedhetError

    document = {**BASE, "run": {**BASE["run"], "pool": pool, "workers": 2 if pool == "processes" else 1},
                "algorithm": {"name": "test_capabilities:ListInState"}}  # fmt: skip
    # with two workers, whichever client finishes first is the one named
    with pytest.raises(FedhetError, match=r"client \d+: its state 'seen'.* is a list; client state must be"):
        run(from_dict(document), tmp_path / "r")


class ShortAggregate(FedAvg):
    def aggregate(self, params, updates):  # the hook is (params, buffers, updates, state, context, layout)
        return params


def test_a_hook_with_the_wrong_signature_is_refused_in_one_line():
    """A plug-in overriding a hook with parameters the engine cannot pass is refused when it
    is resolved, naming the class and both signatures, not a TypeError rounds later."""
    expected = r"ShortAggregate\): aggregate\(self, params, updates\) does not take the hook's arguments"
    with pytest.raises(ConfigError, match=expected) as refused:
        from_dict({**BASE, "algorithm": {"name": "test_capabilities:ShortAggregate"}})
    assert "\n" not in str(refused.value)
