"""One server learning rate, ``server.lr``: the ``[server]`` step's rate for every rule,
and a server optimizer's preset's own rate (FedAdam); the older ``algorithm.server_lr`` (a
rule's own eta_s) is still read as it always was, with one line naming ``server.lr``; a
preset's resolved configuration holds ``server.lr`` and reads back to itself."""

from __future__ import annotations

import logging

import pytest
from conftest import make_config

from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.errors import ConfigError


def _losses(tmp_path, name: str, overrides: dict) -> list[float]:
    result = run(make_config({"run.rounds": 3, **overrides}), tmp_path / name)
    return [row["test_loss"] for row in result.metrics if row.get("test_loss") is not None]


def test_the_older_key_is_read_as_before_with_one_line_and_server_lr_gives_the_same_update(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        older = _losses(tmp_path, "older", {"algorithm.name": "fedavg", "algorithm.server_lr": 0.5})
    assert (
        "algorithm.server_lr = 0.5: the older key of the one server learning rate, server.lr" in caplog.text
    )
    one = _losses(tmp_path, "one", {"algorithm.name": "fedavg", "server.lr": 0.5})
    assert len(one) == len(older) >= 1
    assert one == pytest.approx(older, rel=1e-4)  # w + 0.5 (w' - w) in either step
    assert one != pytest.approx(_losses(tmp_path, "plain", {"algorithm.name": "fedavg"}), rel=1e-4)


def test_server_lr_is_a_presets_optimizer_rate_and_the_server_step_of_any_other_rule():
    preset = make_config({"algorithm.name": "fedadam", "server.lr": 0.02})
    assert preset.algorithm.options.server_lr == 0.02 and preset.server.options("optimizer").lr == 1.0
    assert make_config({"algorithm.name": "fedadam"}).algorithm.options.server_lr == 0.1  # its default
    for name in ("salf", "fedavg"):
        config = make_config({"algorithm.name": name, "server.lr": 0.5})
        assert config.server.options("optimizer").lr == 0.5
        assert getattr(config.algorithm.options, "server_lr", 1.0) == 1.0


def test_a_presets_resolved_configuration_holds_server_lr_and_reads_back_to_itself():
    resolved = make_config({"algorithm.name": "fedadam", "server.lr": 0.02}).to_dict()
    assert resolved["server"]["lr"] == 0.02 and "server_lr" not in resolved["algorithm"]
    assert from_dict(resolved).to_dict() == resolved


def test_two_different_rates_for_a_preset_are_refused_in_one_line():
    with pytest.raises(
        ConfigError, match=r"algorithm.server_lr = 0.05 and server.lr = 0.02: one server learning"
    ):
        make_config({"algorithm.name": "fedadam", "algorithm.server_lr": 0.05, "server.lr": 0.02})


def test_a_server_lr_of_the_wrong_type_is_one_config_error():
    """The older key's note reads any value; validation then names it (no traceback)."""
    with pytest.raises(ConfigError, match="algorithm.server_lr"):
        make_config({"algorithm.name": "fedavg", "algorithm.server_lr": []})
