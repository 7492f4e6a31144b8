"""Bad input to the features of the last wave: each case is refused in one line naming the
problem, or reported and run, never a traceback and never silent nonsense."""

from __future__ import annotations

import logging

from conftest import make_config


def test_an_option_of_another_model_is_reported_not_refused_when_its_owner_accepts_it(caplog, monkeypatch):
    """mlp's ``hidden = [32, 16]`` left in a file whose model is another one is reported as
    mlp's and kept (it used to be checked against char-mlp's integer ``hidden`` and refused)."""
    monkeypatch.setattr("fedhet.config._WARNED", set())  # a process says each such line once
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        config = make_config({"model.name": "linear", "model.hidden": [32, 16]})
    assert config.model.name == "linear"
    said = "model.hidden is an option of models 'mlp', 'mlp-exits'"  # the models whose hidden it fits
    assert any(said in r.getMessage() for r in caplog.records)


def test_an_option_several_plug_ins_share_names_them_all(caplog, monkeypatch):
    """``comm_time`` left in a file whose system model is ``full`` is an option of both
    per-step and measured: the message names both (it used to name only 'measured', so a
    per-step user read that the key belonged to another model)."""
    monkeypatch.setattr("fedhet.config._WARNED", set())  # a process says each such line once
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        make_config({"system.model": "full", "system.comm_time": 0.25})
    text = caplog.text
    assert "system.comm_time is an option of system models 'measured', 'per-step'" in text


def test_a_missing_dropout_trace_names_the_key_that_named_it(tmp_path):
    """A trace dropout whose file is missing names ``system.dropout_trace`` (it used to name
    ``system.availability_trace``, a key the file did not set)."""
    import pytest

    from fedhet.errors import FedhetError

    config = make_config({"system.model": "full", "system.dropout": "trace",
                          "system.dropout_trace": str(tmp_path / "none.txt")})  # fmt: skip
    from fedhet.engine.loop import RunLoop

    with pytest.raises(FedhetError) as raised:
        RunLoop(config, tmp_path / "run").run()
    assert "system.dropout_trace" in str(raised.value)
    assert "availability_trace" not in str(raised.value)


def _tune_files(tmp_path):
    import tomli_w

    config = {
        "run": {"name": "st", "seed": 1, "rounds": 2, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3, "validation_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"lr": 0.1, "batch_size": 8},
        "algorithm": {"name": "fedavg"},
    }
    space = {"params": {"train.lr": {"low": 0.01, "high": 0.5, "log": True}}, "pruner": {"name": "none"}}
    (tmp_path / "c.toml").write_text(tomli_w.dumps(config))
    (tmp_path / "s.toml").write_text(tomli_w.dumps(space))
    return str(tmp_path / "c.toml"), str(tmp_path / "s.toml")


def test_every_bad_storage_url_is_one_line_before_any_trial(tmp_path, capsys):
    """``fedhet tune --storage``: a URL Optuna cannot use is refused in one line naming it
    before any trial runs (each used to be a traceback); an empty SQLite file is used."""
    import sqlite3

    import pytest

    pytest.importorskip("optuna")
    from fedhet.cli import main

    config, space = _tune_files(tmp_path)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "noise.db").write_bytes(bytes(range(256)) * 8)
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("create table users (id integer)")
    other.commit()
    other.close()
    cases = {
        "not a url": "not a database URL",
        "nosuch://host/db": "unknown database scheme 'nosuch'",
        "sqlite:///:memory:": "in-memory database is lost",
        f"sqlite:///{tmp_path / 'a-file' / 'study.db'}": "is a file, not a folder",
        f"sqlite:///{tmp_path / 'noise.db'}": "cannot open the database",
        f"sqlite:///{tmp_path / 'other.db'}": "holds another program's tables (users)",
    }
    import importlib.util

    if importlib.util.find_spec("psycopg2") is None:  # PostgreSQL's driver, not one of fedhet's
        cases["postgresql://user@localhost/db"] = "database driver is not installed (psycopg2)"
    for url, expected in cases.items():
        out = tmp_path / f"out-{len(url)}"
        args = ["tune", config, "--space", space, "--trials", "1", "--storage", url, "--out", str(out)]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert expected in err and f"--storage {url!r}" in err and "Traceback" not in err, (url, err)
        assert not list(out.glob("*/trial-*"))  # no trial ran
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    url = f"sqlite:///{empty}"
    args = [
        "tune",
        config,
        "--space",
        space,
        "--trials",
        "1",
        "--storage",
        url,
        "--out",
        str(tmp_path / "ok"),
    ]
    assert main(args) == 0


def test_a_suite_checks_every_seed_and_the_targets_type(tmp_path):
    """A suite whose seeds include one no run accepts is refused before anything runs (it
    used to rank every method on the one seed that ran); ``target = true`` is no number."""
    import re
    from pathlib import Path

    import pytest

    from fedhet.bench.suite import load_suite
    from fedhet.errors import ConfigError

    text = (Path(__file__).resolve().parents[1] / "suites" / "smoke.toml").read_text()
    (tmp_path / "seeds.toml").write_text(re.sub(r"(?m)^seeds = 3$", "seeds = [1, -1]", text))
    with pytest.raises(ConfigError, match=r"run.seed = -1"):
        load_suite(tmp_path / "seeds.toml")
    (tmp_path / "target.toml").write_text(re.sub(r"(?m)^target = 0.7$", "target = true", text))
    with pytest.raises(ConfigError, match=r"suite.target = True: a value of the task's score"):
        load_suite(tmp_path / "target.toml")


def test_fedhet_devices_refuses_a_name_its_file_cannot_hold_and_writes_nothing(tmp_path, capsys):
    """A FedScale client key that starts with '#' (read back as a comment: a device lost) or
    holds a line break (a file fedhet run refuses) is refused in one line; no file is left."""
    import pickle

    from fedhet.cli import main

    for key in ("#7", "a\nb"):
        source = tmp_path / "device_info.pkl"
        source.write_bytes(pickle.dumps({1: {"computation": 20.0, "communication": 800.0},
                                          key: {"computation": 5.0, "communication": 90.0}}))  # fmt: skip
        out = tmp_path / "devices.csv"
        assert main(["devices", str(source), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"device {key!r}: its name" in err and "Traceback" not in err and not out.exists()


def test_label_swap_with_nothing_to_swap_says_so(caplog):
    """``partition = "label-swap"`` at its default ``swap_fraction = 0`` swaps nothing: the
    run says the split is iid instead of running as if the labels were swapped."""
    from fedhet import world

    world._SAID.discard("label-swap")
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        built = world.build_world(make_config({"data.partition": "label-swap", "run.rounds": 1}))
    assert any("swap_fraction = 0 swaps no label" in r.getMessage() for r in caplog.records)
    assert built.train_labels is not None


def test_quadratic_entries_must_be_numbers_and_a_broken_exact_gradient_contract_is_said(caplog):
    """The quadratic dataset's matrices and optima take numbers only (numpy read ``true`` as
    1 and ``"2"`` as 2); a partition other than natural, or batches smaller than a client's
    rows, give sampled gradients: the run says so once."""
    import pytest

    from fedhet import world
    from fedhet.errors import ConfigError

    base = {"data.dataset": "quadratic", "data.partition": "natural", "data.num_clients": 2,
            "model.name": "linear", "train.batch_size": 2, "run.rounds": 1}  # fmt: skip
    matrices = [[[1.0, "0"], [0.0, 0.3]], [[0.3, 0.0], [0.0, 1.0]]]
    optima = [[5.0, True], [-3.0, 6.0]]
    for key, bad in (("data.quadratic_optima", optima), ("data.quadratic_matrices", matrices)):
        with pytest.raises(ConfigError, match=rf"{key}: .* is not a number"):
            make_config({**base, key: bad})
    world._SAID.discard("quadratic")
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        world.build_world(make_config(base))
    assert not any("exact gradients only" in r.getMessage() for r in caplog.records)
    for change in ({"train.batch_size": 1}, {"data.partition": "iid"}):
        world._SAID.discard("quadratic")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fedhet"):
            world.build_world(make_config({**base, **change}))
        assert any("exact gradients only with data.partition = 'natural'" in r.getMessage()
                   for r in caplog.records), change  # fmt: skip


def test_a_leaf_split_without_examples_or_an_example_without_features_is_one_line(tmp_path):
    """A LEAF split whose users hold no examples (a numpy ValueError before), and examples
    whose x is empty (a model of biases only), are refused in one line naming the place."""
    import json

    import pytest

    from fedhet.data.leaf import load_leaf
    from fedhet.errors import DataError

    def write(root, split, users):
        (root / split).mkdir(parents=True, exist_ok=True)
        document = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                    "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}  # fmt: skip
        (root / split / "all.json").write_text(json.dumps(document))

    good = {"a": ([[0.0, 1.0], [1.0, 0.0]], [0, 1])}
    write(tmp_path / "empty", "train", good)
    write(tmp_path / "empty", "test", {"b": ([], [])})
    with pytest.raises(DataError, match=r"test: no examples") as err:
        load_leaf(str(tmp_path / "empty"))
    assert "\n" not in str(err.value)
    write(tmp_path / "blank", "train", {"a": ([[], []], [0, 1])})
    write(tmp_path / "blank", "test", good)
    with pytest.raises(DataError, match=r"user 'a': an example's x is empty"):
        load_leaf(str(tmp_path / "blank"))


def test_an_objective_the_task_does_not_report_is_refused_before_tune_or_bench_runs(tmp_path, capsys):
    """An accuracy objective on a regression: ``fedhet bench`` used to spend its budget and
    exit 0 with every method failed; it and ``fedhet tune`` now refuse it in one line."""
    import re
    from pathlib import Path

    import pytest
    import tomli_w

    pytest.importorskip("optuna")
    from fedhet.cli import main

    suite = (Path(__file__).resolve().parents[1] / "suites" / "smoke.toml").read_text()
    suite = re.sub(r'(?m)^dataset = "digits"$', 'dataset = "diabetes"', suite)
    suite = re.sub(r'(?m)^partition = "dirichlet"$', 'partition = "iid"', suite)
    (tmp_path / "suite.toml").write_text(suite)
    out = tmp_path / "bench"
    args = ["bench", str(tmp_path / "suite.toml"), "--trials", "1", "--seeds", "1", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "objective 'final_test_accuracy': dataset 'diabetes' is a regression task" in err
    assert not (out / "trials").exists()
    config, space = _tune_files(tmp_path)
    (tmp_path / "c.toml").write_text((tmp_path / "c.toml").read_text().replace('"digits"', '"diabetes"'))
    lr = {"low": 0.01, "high": 0.3}
    space2 = {"objective": {"value": "best_test_accuracy"}, "params": {"train.lr": lr}}
    (tmp_path / "s2.toml").write_text(tomli_w.dumps(space2))
    space_path = str(tmp_path / "s2.toml")
    assert main(["tune", config, "--space", space_path, "--trials", "1", "--out", str(tmp_path / "t")]) == 2
    assert "judge it by final_test_rmse" in capsys.readouterr().err


def test_the_batched_pool_says_how_many_tasks_trained_one_at_a_time_and_why(tmp_path, caplog):
    """A batched run of FjORD (its loss draws per client: groups computed row by row) and of
    ADEL-FL estimating its constants (a gradient probe per client, each alone) records, per
    reason, how many tasks trained one client at a time, and says so once per reason."""
    from fedhet.config import from_dict
    from fedhet.engine.batched import GROUP_OF_ONE
    from fedhet.engine.launch import run

    stragglers = {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0}

    def document(algorithm: dict, system: dict = stragglers, **run_keys):
        return from_dict({
            "run": {"name": "b", "seed": 3, "rounds": 3, "threads": 1, "pool": "batched", **run_keys},
            "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.5},
            "model": {"name": "mlp", "hidden": [16]},
            "train": {"lr": 0.1, "batch_size": 8, "local_steps": 2},
            "algorithm": algorithm,
            "system": system,
        })  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="fedhet"):
        # sized from this round's times (the oracle), as when this test was written: every width
        # group holds several clients (a group of one would be counted alone)
        fjord = run(document({"name": "fjord", "planner_knowledge": "oracle"}), tmp_path / "fjord").summary
    reason = "fjord's local loss reads one client's own data"
    assert fjord["tasks_one_at_a_time"] == {reason: fjord["tasks_grouped"]}
    assert any(f"trained one client at a time: {reason}" in r.getMessage() for r in caplog.records)
    adel_fl = {"name": "adel-fl", "estimate_constants": True}
    adel = run(document(adel_fl, {"model": "exponential"}, time_budget=6.0), tmp_path / "adel").summary
    probes = adel["tasks_one_at_a_time"].get("probes (gradients at the sent model) run alone", 0)
    groups_of_one = adel["tasks_one_at_a_time"].get(GROUP_OF_ONE, 0)  # counted alone too
    assert probes == adel["tasks_alone"] - groups_of_one == 6
