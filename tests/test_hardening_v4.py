"""Bad input to the features of the last wave: each case is refused in one line naming the
problem, or reported and run, never a traceback and never silent nonsense."""

from __future__ import annotations

import logging

from conftest import make_config


def test_an_option_of_another_model_is_reported_not_refused_when_its_owner_accepts_it(caplog):
    """mlp's ``hidden = [32, 16]`` left in a file whose model is another one is reported as
    mlp's and kept (it used to be checked against char-mlp's integer ``hidden`` and refused)."""
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        config = make_config({"model.name": "linear", "model.hidden": [32, 16]})
    assert config.model.name == "linear"
    assert any("model.hidden is an option of model 'mlp'" in r.getMessage() for r in caplog.records)
