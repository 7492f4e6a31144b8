"""A plug-in's server-side hook that fails is named where it fails: an aggregate that returns
a wrong-size vector, None, or raises; a plan that is not a plan; round metrics that are not
numbers; busy clients that are not the run's; an init_state that raises. Each is one line
naming the plug-in, the hook and the round; the run folder keeps a summary (stopped_by =
"plugin_error") and the traceback, the checkpoint of the last finished round stays, and the
run resumes once the plug-in is fixed and ends with the metrics of a run that never failed."""

from __future__ import annotations

import json

import pytest
import torch

from fedhet.algorithms.fedavg import FedAvg
from fedhet.cli import main
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.errors import FedhetError

BASE = {
    "run": {"name": "plug", "seed": 3, "rounds": 5, "threads": 1, "eval_every": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "full"},
}
BROKEN = {"how": ""}  # how the plug-in below misbehaves from round 3 on ("" = it is fixed)


class Flaky(FedAvg):
    """FedAvg that misbehaves, from round 3, as ``BROKEN["how"]`` says."""

    def plan(self, round_index, state, system, deadline):
        if BROKEN["how"] == "plan" and round_index >= 2:
            return None
        return super().plan(round_index, state, system, deadline)

    def aggregate(self, params, buffers, updates, state, context, layout):
        new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
        how = BROKEN["how"] if context.plan.round >= 2 else ""
        if how == "size":
            return torch.cat([new_params, torch.zeros(5)]), new_buffers
        if how == "none":
            return None
        if how == "raise":
            raise KeyError("weights")
        return new_params, new_buffers

    def round_metrics(self, state):
        return {"norm": "big"} if BROKEN["how"] == "metrics" else {}

    def busy_clients(self, state, round_index):
        return {7} if BROKEN["how"] == "busy" and round_index >= 2 else set()


class FailsToStart(FedAvg):
    def init_state(self, setting):
        raise ValueError("no state for you")


def _config(name: str = "test_plugin_errors:Flaky"):
    return from_dict({**BASE, "algorithm": {"name": name}})


@pytest.fixture(autouse=True)
def _fixed():
    yield
    BROKEN["how"] = ""


@pytest.mark.parametrize(
    "how, message",
    [
        ("size", "aggregate (round 3): returned 615 values, the model has 610"),
        ("none", "aggregate (round 3): returned None; expected (params, buffers)"),
        ("raise", "aggregate (round 3): raised KeyError: 'weights'"),
        ("plan", "plan (round 3): returned None; expected a RoundPlan"),
        ("metrics", "round_metrics (round 1): returned a dict; expected a dict"),
        ("busy", "busy_clients (round 3): returned a set; expected a set of client indices 0..3"),
    ],
)
def test_a_failing_hook_is_one_line_and_the_run_resumes_after_the_fix(tmp_path, capsys, how, message):
    clean = run(_config(), tmp_path / "clean")
    BROKEN["how"] = how
    config_path = tmp_path / "c.toml"
    config_path.write_text(_config().to_toml())
    out = tmp_path / "run"
    assert main(["run", str(config_path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, repr(err)
    message = f"algorithm 'test_plugin_errors:Flaky'.{message}"
    assert message in err and "--resume" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "plugin_error" and message in summary["error"]
    assert not summary["finished"]
    assert (out / "plugin-error.txt").is_file()
    BROKEN["how"] = ""  # the plug-in is fixed
    assert main(["run", str(config_path), "--out", str(out), "--quiet", "--resume"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["finished"] and not (out / "plugin-error.txt").exists()
    assert _rows(out) == _rows(clean.path)  # as if it had never failed


def _rows(path) -> list[dict]:
    """metrics.csv without its wall-clock column."""
    import csv

    with open(path / "metrics.csv") as fh:
        return [{k: v for k, v in row.items() if "wall" not in k} for row in csv.DictReader(fh)]


def test_a_hook_that_fails_before_round_1_is_one_line(tmp_path):
    with pytest.raises(FedhetError, match=r"algorithm 'test_plugin_errors:FailsToStart'.init_state \(before "
                       r"round 1\): raised ValueError: no state for you") as failed:  # fmt: skip
        run(_config("test_plugin_errors:FailsToStart"), tmp_path / "r")
    assert "\n" not in str(failed.value)


def test_debug_prints_the_plugins_own_traceback_after_the_line(tmp_path, capsys):
    BROKEN["how"] = "raise"
    config_path = tmp_path / "c.toml"
    config_path.write_text(_config().to_toml())
    assert main(["--debug", "run", str(config_path), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedhet: error: algorithm 'test_plugin_errors:Flaky'.aggregate (round 3)")
    assert 'raise KeyError("weights")' in err and "test_plugin_errors.py" in err


class LosesAClient:
    """A system model plug-in whose sample forgets the last client (wraps the full model)."""

    name = "loses-a-client"
    from fedhet.registry import NoOptions as Options

    @classmethod
    def build(cls, options, ctx):
        from fedhet.system.depth import NoStragglers

        class Forgetful(NoStragglers):
            def sample(self, work, rng):
                outcomes = super().sample(work, rng)
                outcomes.participates = outcomes.participates[:-1]
                return outcomes

        return Forgetful.build(options, ctx)


def test_a_system_model_plugin_that_fails_is_named_too(tmp_path):
    document = {
        **BASE,
        "system": {"model": "test_plugin_errors:LosesAClient"},
        "algorithm": {"name": "fedavg"},
    }
    expected = r"'test_plugin_errors:LosesAClient'.sample \(round 1\): returned participates for 3 clients"
    with pytest.raises(FedhetError, match=expected):
        run(from_dict(document), tmp_path / "r")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["stopped_by"] == "plugin_error"


# -- every server-side hook is guarded: a test rule raises from the hook named in RAISES -----

RAISES = {"hook": ""}


def _raise_from(hook: str):
    def call(self, *args, **kwargs):
        if RAISES["hook"] == hook:
            raise RuntimeError(f"broken {hook}")
        return getattr(super(type(self), self), hook)(*args, **kwargs)

    return call


# (lr_at is a helper the rule's own plan and start_task call: a failure there names them)
ROUND_HOOKS = (
    "init_state",
    "plan",
    "aggregate",
    "round_metrics",
    "busy_clients",
    "warnings",
    "caveats",
    "reports",
    "state_dict",
)
EVENT_HOOKS = ("concurrency", "choose", "start_task", "buffer_size", "apply_buffer", "state_dict")


def _rule_raising(base: type, hooks: tuple[str, ...]) -> type:
    return type(f"Raising{base.__name__}", (base,), {hook: _raise_from(hook) for hook in hooks})


from fedhet.algorithms.fedbuff import FedBuff  # noqa: E402

RaisingFedAvg = _rule_raising(FedAvg, ROUND_HOOKS)
RaisingFedBuff = _rule_raising(FedBuff, EVENT_HOOKS)


@pytest.mark.parametrize(
    "rule, hook",
    [("test_plugin_errors:RaisingFedAvg", h) for h in ROUND_HOOKS]
    + [("test_plugin_errors:RaisingFedBuff", h) for h in EVENT_HOOKS],
)
def test_every_server_side_hook_that_raises_is_one_line_naming_it(tmp_path, rule, hook):
    document = {**BASE, "algorithm": {"name": rule}}
    document["run"] = {**BASE["run"], "rounds": 2}
    if "FedBuff" in rule:
        document["algorithm"]["buffer_size"] = 2
    RAISES["hook"] = hook
    try:
        with pytest.raises(FedhetError) as failed:
            run(from_dict(document), tmp_path / "r")
    finally:
        RAISES["hook"] = ""
    line = str(failed.value)
    assert "\n" not in line and f"algorithm '{rule}'.{hook} (" in line and f"broken {hook}" in line
