"""The configuration stays a plain tree: each plug-in's options beside its name, checked
once by the plug-in's Options, and the resolved tree reads back to the same configuration."""

from __future__ import annotations

import logging
import tomllib

import pytest

from fedhet.config import from_dict
from fedhet.errors import ConfigError

BASE = {"algorithm": {"name": "salf"}, "data": {"num_clients": 4}}


def test_a_plugins_options_read_like_keys_of_its_section():
    config = from_dict({**BASE, "system": {"model": "per-step", "comm_time": 0.5, "upload_bandwidth": 10.0}})
    assert config.system.comm_time == 0.5 and config.system.upload_bandwidth == 10.0
    assert config.system.options("model").time_per_sample_step == 1.0  # the plug-in's default
    assert config.system.entry("model").name == "per-step"
    with pytest.raises(AttributeError):
        config.system.straggler_ratio  # noqa: B018  (not an option of per-step)


def test_the_resolved_tree_reads_back_to_the_same_configuration():
    import tomli_w

    config = from_dict({
        **BASE,
        "train": {"optimizer": "adam", "beta2": 0.99,
                  "postprocess": [{"name": "compress", "method": "topk"}]},
        "system": {"model": "exponential", "participation": "two-group", "participation_min": 0.3},
        "model": {"name": "mlp", "hidden": [8]},
    })  # fmt: skip
    resolved = config.to_dict()
    assert resolved["train"]["beta2"] == 0.99 and resolved["system"]["participation_min"] == 0.3
    assert resolved["system"]["time_per_sample_layer"] == 1.0  # defaults written out
    again = from_dict(tomllib.loads(tomli_w.dumps(resolved)))
    assert again.to_dict() == resolved


def test_an_option_of_another_choice_is_checked_kept_and_reported(caplog):
    import fedhet.config

    fedhet.config._WARNED.clear()  # said once per process: forget what earlier tests triggered
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        config = from_dict({**BASE, "system": {"model": "exponential", "straggler_ratio": 0.25}})
    assert "system.straggler_ratio is an option of system model 'straggler-ratio'" in caplog.text
    assert config.to_dict()["system"]["straggler_ratio"] == 0.25
    assert config.system.get("straggler_ratio") == 0.25
    with pytest.raises(ConfigError, match=r"system.straggler_ratio = 2.0: must be in \[0.0, 1.0\]"):
        from_dict({**BASE, "system": {"model": "exponential", "straggler_ratio": 2.0}})


def test_an_unknown_key_lists_the_sections_and_the_plugins_keys():
    with pytest.raises(ConfigError) as caught:
        from_dict({**BASE, "system": {"model": "per-step", "comm_tme": 1.0}})
    message = str(caught.value)
    assert message.startswith("system.comm_tme: unknown key (known: model, deadline, participation")
    assert "comm_time" in message and "\n" not in message
