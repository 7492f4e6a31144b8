"""A field given to ``fedhet bench --against`` (a leaderboard.csv or a bench folder) that is
damaged or hand-edited is refused in one line naming the file, the row and what is wrong:
not CSV text, a missing column, a score that is not a number, NaN or outside the metric's
range, tuned values that are not JSON objects, a duplicated row, a bench.json row without a
field. The published field reads whole."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedhet.bench.against import read_rows
from fedhet.bench.leaderboard import read_csv
from fedhet.errors import FedhetError

FIELD = Path(__file__).resolve().parents[1] / "docs" / "results" / "data" / "leaderboard.csv"


def _table() -> list[dict]:
    with FIELD.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _write(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(FedhetError) as err:
        read_rows(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message
    return message


def test_the_published_field_reads_whole():
    rows = read_csv(FIELD)
    assert len(rows) == len(_table()) and all(r["tunings"] for r in rows if r["status"] == "ok")


def _score_edited(value: str) -> list[dict]:
    rows = _table()
    first = next(r for r in rows if r["status"] == "ok")
    key, _, rest = first["accuracy_by_seed"].partition(":")
    first["accuracy_by_seed"] = f"{key}:{value};{rest.partition(';')[2]}"
    return rows


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("abc", ("row 1", "could not convert")),
        ("nan", ("is not a accuracy",)),
        ("1.7", ("in [0, 1]",)),
        ("-0.2", ("in [0, 1]",)),
    ],  # fmt: skip
)
def test_a_score_that_is_no_score_is_refused(tmp_path, value, words):
    _refused(_write(tmp_path / "f.csv", _score_edited(value)), *words)


def test_a_missing_column_tuned_values_not_json_and_a_duplicated_row_are_refused(tmp_path):
    rows = _table()
    columns = [c for c in rows[0] if c != "tuned"]
    _refused(_write(tmp_path / "a.csv", rows, columns), "no column tuned")
    bad = _table()
    bad[0]["tuned"] = "{not json"
    _refused(_write(tmp_path / "b.csv", bad), "row 1", "not a leaderboard row")
    bad[0]["tuned"] = "[1, 2]"
    _refused(_write(tmp_path / "c.csv", bad), "is not the tuned values")
    twice = _table()
    _refused(_write(tmp_path / "d.csv", [*twice, twice[0]]), f"row {len(twice) + 1}", "appears twice")


def test_a_field_that_is_not_text_or_a_bench_json_row_without_a_field_is_refused(tmp_path):
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)) * 4)
    _refused(tmp_path / "binary.csv", "not CSV text")
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "bench.json").write_text(
        json.dumps({"rows": [{"scenario": "s", "method": "m", "status": "ok"}]})
    )
    _refused(folder, "bench.json, row 1", "'tunings'")


def test_a_rerun_of_a_method_the_field_holds_is_refused_in_one_line(tmp_path):
    """--against takes the suite's own methods from the field and runs none of them: a
    --rerun of one of them would be ignored; it is refused before anything runs."""
    from conftest import BENCH_PLUGIN, SMOKE_BENCH_ARGS, SMOKE_SUITE, fedhet_in_process

    argv = ["bench", str(SMOKE_SUITE), *SMOKE_BENCH_ARGS, "--against", str(tmp_path / "none.csv"),
            "--rerun", "fedavg", "--out", str(tmp_path / "b"), "--quiet"]  # fmt: skip
    status, stderr = fedhet_in_process(argv, paths=(BENCH_PLUGIN,))
    assert status == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert "--rerun fedavg: its rows come from --against" in stderr
    assert not (tmp_path / "b").exists()


def _suite_with(tmp_path: Path, old: str, new: str) -> Path:
    from conftest import SMOKE_SUITE

    text = SMOKE_SUITE.read_text()
    assert old in text
    path = tmp_path / "suite.toml"
    path.write_text(text.replace(old, new, 1))
    return path


LR = '"train.lr" = {'
SUITE_CASES = {
    "validation split": (LR, '"data.validation_fraction" = { low = 0.1, high = 0.3 }\n' + LR,
                         "data.validation_fraction is set by the bench itself"),
    "threads": (LR, '"run.threads" = { choices = [1, 2] }\n' + LR, "run.threads is set by the bench"),
    "fixed shared knob": ('methods = ["fedavg", "drop", "salf", "fedprox"]',
                          'methods = ["fedavg", { name = "fedprox", mu = 0.1 }]', "fixes algorithm.mu"),
    "sampler seed": ("tuning_repeats = 5", "tuning_repeats = 5\nsampler_seed = 4294967295",
                     "suite.sampler_seed = 4294967295: at most 4294967291"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SUITE_CASES))
def test_a_suite_that_would_search_nothing_or_unequal_knobs_is_refused_in_one_line(tmp_path, case):
    """A searched key the bench sets itself, a method fixing a shared knob, a sampler seed
    past numpy's range: one ConfigError naming the key, before anything runs."""
    from fedhet.bench.suite import load_suite
    from fedhet.errors import ConfigError

    old, new, words = SUITE_CASES[case]
    path = _suite_with(tmp_path, old, new)
    if "fixes algorithm.mu" in words:  # the shared knob: mu searched for every method
        path.write_text(
            path.read_text().replace("[params]\n", '[params]\n"algorithm.mu" = { low = 0.001, high = 1 }\n')
        )
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_suite_benched_into_another_suites_folder_is_refused_in_one_line(tmp_path):
    """A bench folder holds one suite's studies and seeds: another suite's bench there would
    mix with them; it is refused before anything runs."""
    from conftest import BENCH_PLUGIN, SMOKE_BENCH_ARGS, SMOKE_SUITE, fedhet_in_process

    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / ".bench-suite").write_text("heterogeneity\n")
    argv = ["bench", str(SMOKE_SUITE), *SMOKE_BENCH_ARGS, "--out", str(folder), "--quiet"]
    status, stderr = fedhet_in_process(argv, paths=(BENCH_PLUGIN,))
    assert status == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert "holds the bench of suite 'heterogeneity'; bench suite 'smoke' into another folder" in stderr
    assert (
        sorted(p.name for p in folder.iterdir()) == [".bench-suite", ".bench.lock"]
        or not (folder / "bench.db").exists()
    )


def test_a_label_that_crossing_selections_would_double_is_refused_in_one_line(tmp_path):
    """A method labelled as a crossing of another would be (``salf+uniform``) next to
    ``[selections.uniform]``: one line naming the label, not two methods merged."""
    from fedhet.bench.suite import load_suite
    from fedhet.errors import ConfigError

    path = _suite_with(
        tmp_path,
        'methods = ["fedavg", "drop", "salf", "fedprox"]',
        'methods = ["salf", { name = "salf", label = "salf+uniform", "selection.rule" = "uniform" }]',
    )
    path.write_text(path.read_text() + '\n[selections.uniform]\nrule = "uniform"\nclients_per_round = 4\n')
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert "method 'salf+uniform' comes twice once [selections] are crossed" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_method_tables_relative_file_is_read_against_the_suites_folder(tmp_path, monkeypatch):
    """A path in a method's own settings is read against the suite file's folder, as one in
    a scenario is, whatever the current folder."""
    import shutil

    from conftest import SMOKE_SUITE

    from fedhet.config import read_toml

    folder = tmp_path / "suite"
    folder.mkdir()
    shutil.copy(
        Path(SMOKE_SUITE).parent.parent / "examples" / "devices" / "synthetic-phones.csv",
        folder / "phones.csv",
    )
    text = (
        Path(SMOKE_SUITE)
        .read_text()
        .replace(
            'methods = ["fedavg", "drop", "salf", "fedprox"]',
            'methods = ["fedavg", { name = "salf", "system.device_profiles" = "phones.csv" }]',
        )
    )
    (folder / "s.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    method = read_toml(folder / "s.toml")["suite"]["methods"][1]  # read as the bench reads a suite
    assert Path(method["system.device_profiles"]).resolve() == (folder / "phones.csv").resolve()
