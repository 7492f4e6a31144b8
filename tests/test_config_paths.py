"""A relative file or folder in a configuration file is read against that file's folder,
wherever fedhet is started from; a path only the current folder holds (how fedhet read it
before) still works, with a warning; one typed on the command line stays the current
folder's. Experiments' cases and grids and suites' scenarios are read the same way."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import tomli_w

from fedhet.config import load_config, resolve_paths

PROFILES = "device,compute,upload,download\nphone,0.01,1000000,1000000\n"


def _config(folder: Path, profiles: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "run": {"name": "p", "rounds": 1, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 2, "fraction": 0.3},
        "system": {"model": "per-step", "capability_profile": "devices", "device_profiles": profiles},
        "algorithm": {"name": "fedavg"},
    }
    path = folder / "run.toml"
    path.write_text(tomli_w.dumps(document))
    return path


def test_a_relative_path_is_read_against_the_file_s_folder(tmp_path, monkeypatch):
    """Started from another folder, ``device_profiles = "phones.csv"`` names the file beside
    the configuration (it used to name ./phones.csv, which is not there)."""
    config = _config(tmp_path / "study", "phones.csv")
    (tmp_path / "study" / "phones.csv").write_text(PROFILES)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    profiles = load_config(config).system.device_profiles
    assert Path(profiles).resolve() == (tmp_path / "study" / "phones.csv").resolve()
    relative = load_config(os.path.relpath(config)).system.device_profiles  # a relative file path
    assert relative == os.path.join("..", "study", "phones.csv")


def test_a_path_only_the_current_folder_holds_is_kept_with_a_warning(tmp_path, monkeypatch, caplog):
    config = _config(tmp_path / "study", "phones.csv")
    (tmp_path / "phones.csv").write_text(PROFILES)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        assert load_config(config).system.device_profiles == "phones.csv"
    assert (
        "read against the current folder, as before" in caplog.text
        and "system.device_profiles" in caplog.text
    )


def test_a_path_both_folders_hold_is_the_file_s_and_the_warning_names_both(tmp_path, monkeypatch, caplog):
    config = _config(tmp_path / "study", "phones.csv")
    for place in (tmp_path, tmp_path / "study"):
        (place / "phones.csv").write_text(PROFILES)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        chosen = load_config(config).system.device_profiles
    assert Path(chosen).resolve() == (tmp_path / "study" / "phones.csv").resolve()
    assert "not the current folder" in caplog.text


def test_a_path_set_on_the_command_line_is_the_current_folder_s(tmp_path, monkeypatch):
    config = _config(tmp_path / "study", "phones.csv")
    monkeypatch.chdir(tmp_path)
    config_set = load_config(config, ["system.device_profiles=other.csv"])
    assert config_set.system.device_profiles == "other.csv"


def test_cases_grids_and_scenarios_are_read_against_their_file(tmp_path):
    """Dotted settings in an experiment's cases and grid, and in a suite's scenarios, are
    resolved like a section's keys; other keys and absolute paths are left as written."""
    raw = {
        "cases": [{"system.measured_times": "t.json", "train.lr": 0.1}],
        "grid": {"system.availability_trace": ["a.txt", "/abs/b.txt"]},
        "scenarios": {"s": {"data.data_dir": "data", "system.model": "full"}},
        "data": {"data_dir": "~/datasets"},
    }
    out = resolve_paths(raw, tmp_path / "sub" / "exp.toml")
    sub = tmp_path / "sub"
    assert out["cases"][0] == {"system.measured_times": str(sub / "t.json"), "train.lr": 0.1}
    assert out["grid"]["system.availability_trace"] == [str(sub / "a.txt"), "/abs/b.txt"]
    assert out["scenarios"]["s"] == {"data.data_dir": str(sub / "data"), "system.model": "full"}
    assert out["data"]["data_dir"] == "~/datasets"
