"""One server learning rate, ``server.lr``: the rule's own step takes it where it has one
(FedAvg's eta_s, a preset's optimizer rate), the ``[server]`` step otherwise; the older
``algorithm.server_lr`` is still read, with one line saying so; a run's resolved
configuration holds ``server.lr`` and reads back to itself."""

from __future__ import annotations

import logging

import pytest
from conftest import make_config

from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.errors import ConfigError


def _metrics(tmp_path, name: str, overrides: dict) -> list[dict]:
    result = run(make_config({"run.rounds": 3, **overrides}), tmp_path / name)
    return [{k: v for k, v in row.items() if "wall" not in k} for row in result.metrics]


def test_server_lr_is_the_rules_own_step_bit_for_bit_as_the_older_key(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        older = _metrics(tmp_path, "older", {"algorithm.name": "fedavg", "algorithm.server_lr": 0.5})
    assert "algorithm.server_lr = 0.5 is read as server.lr = 0.5" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        one = _metrics(tmp_path, "one", {"algorithm.name": "fedavg", "server.lr": 0.5})
    assert "server_lr" not in caplog.text
    assert one == older
    assert one != _metrics(tmp_path, "plain", {"algorithm.name": "fedavg"})  # the rate acts


def test_server_lr_is_a_presets_optimizer_rate_and_the_server_step_of_a_rule_without_one(tmp_path):
    preset = make_config({"algorithm.name": "fedadam", "server.lr": 0.02})
    assert preset.algorithm.options.server_lr == 0.02 and preset.server.options("optimizer").lr == 1.0
    assert make_config({"algorithm.name": "fedadam"}).algorithm.options.server_lr == 0.1  # its default
    salf = make_config({"algorithm.name": "salf", "server.lr": 0.5})
    assert salf.server.options("optimizer").lr == 0.5


def test_the_resolved_configuration_holds_server_lr_and_reads_back_to_itself():
    config = make_config({"algorithm.name": "fedavg", "algorithm.server_lr": 0.5})
    resolved = config.to_dict()
    assert resolved["server"]["lr"] == 0.5 and "server_lr" not in resolved["algorithm"]
    assert from_dict(resolved).to_dict() == resolved


def test_two_different_server_rates_are_refused_in_one_line():
    with pytest.raises(
        ConfigError, match=r"algorithm.server_lr = 0.5 and server.lr = 0.8: one server learning rate"
    ):
        make_config({"algorithm.name": "fedavg", "algorithm.server_lr": 0.5, "server.lr": 0.8})
