"""Damaged run folders never crash a command: every reader (run --resume, compare, plot,
report, reproduce) answers a foreign or damaged file with one line naming it and exit
status 2, and a resume never drops rows already on disk."""

from __future__ import annotations

import json
import shutil

import pytest
import tomli_w
import torch

from fedhet.cli import main
from fedhet.config import from_dict
from fedhet.engine.loop import RunLoop

BASE = {
    "run": {"name": "t", "seed": 1, "rounds": 3, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-round run and its config file (copied per test before damaging)."""
    root = tmp_path_factory.mktemp("finished")
    config = root / "c.toml"
    config.write_text(tomli_w.dumps(BASE))
    assert main(["run", str(config), "--out", str(root / "run"), "--quiet"]) == 0
    return root


@pytest.fixture
def run(finished, tmp_path):
    shutil.copytree(finished / "run", tmp_path / "run")
    shutil.copy(finished / "c.toml", tmp_path / "c.toml")
    return tmp_path / "run"


def _one_line(capsys, code: int, expected_code: int = 2) -> str:
    err = capsys.readouterr().err.strip()
    assert code == expected_code, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _resume(run, capsys, *extra) -> str:
    code = main(["run", str(run.parent / "c.toml"), "--out", str(run), "--resume", "--quiet",
                 "--set", "run.rounds=4", *extra])  # fmt: skip
    return _one_line(capsys, code)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([1, 2, 3], "not a fedhet checkpoint (it holds a list)"),
        ({"version": 4}, "not a fedhet checkpoint (no 'config')"),
        ("text", "not a fedhet checkpoint (it holds a str)"),
    ],
)
def test_a_foreign_checkpoint_is_one_line(run, capsys, content, message):
    torch.save(content, run / "checkpoint.pt")
    line = _resume(run, capsys)
    assert "checkpoint.pt" in line and message in line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(round="3"), "damaged checkpoint (round is a str)"),
        (
            lambda c: c.update(params=torch.zeros(5)),
            "damaged checkpoint (params: (5,) float32, the model has",
        ),
        (lambda c: c.update(params=torch.zeros(2, 2)), "damaged checkpoint (params: (2, 2) float32"),
        (lambda c: c.update(metrics=[]), "damaged checkpoint (3 rounds but 0 metrics rows)"),
        (lambda c: c.update(config={"run": 3}), "its config is not a table of sections"),
    ],
)
def test_a_damaged_checkpoint_is_one_line(run, capsys, change, message):
    saved = torch.load(run / "checkpoint.pt", weights_only=False)
    change(saved)
    torch.save(saved, run / "checkpoint.pt")
    line = _resume(run, capsys)
    assert message in line


@pytest.mark.parametrize("name", ["checkpoint.pt", ".lock", "metrics.csv"])
def test_a_folder_where_a_file_belongs_is_one_line(run, capsys, name):
    target = run / name
    if target.exists():
        target.unlink()
    target.mkdir()
    line = _resume(run, capsys)
    assert f"{name}: is a folder where fedhet keeps its {name} file" in line


def test_resume_without_a_checkpoint_but_with_rows_refuses(run, capsys):
    (run / "checkpoint.pt").unlink()
    rows_before = (run / "metrics.csv").read_text()
    line = _resume(run, capsys)
    assert "checkpoint.pt: missing, but metrics.csv holds 3 rounds" in line
    assert (run / "metrics.csv").read_text() == rows_before


def test_a_resume_never_drops_rows_on_disk(run, capsys):
    lines = (run / "metrics.csv").read_text().splitlines()
    extra = [*lines, *[line.replace(line.split(",")[0], str(4 + i), 1) for i, line in enumerate(lines[1:])]]
    (run / "metrics.csv").write_text("\n".join(extra) + "\n")  # rounds 1..6 on disk, 3 in the checkpoint
    before = (run / "metrics.csv").read_bytes()
    line = _resume(run, capsys)
    assert "metrics.csv: holds 6 rows, more than run.rounds = 4; nothing rewritten" in line
    assert (run / "metrics.csv").read_bytes() == before


def test_rows_past_the_checkpoint_that_a_resume_does_not_reproduce_stop_it(run, tmp_path, capsys):
    """Rows after the checkpoint are checked as the resume runs their rounds again: one of
    another run stops it in one line, and no row on disk is lost."""
    RunLoop(from_dict({**BASE, "run": {**BASE["run"], "checkpoint_every": 0}}), tmp_path / "cut").run(
        stop_after=2
    )
    lines = (run / "metrics.csv").read_text().splitlines()
    shutil.copy(tmp_path / "cut" / "checkpoint.pt", run / "checkpoint.pt")  # round 2's; rows 1-4 on disk
    lines[3] = lines[3].replace(lines[3].split(",")[1], "123.5", 1)  # round 3 of another run
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    before = (run / "metrics.csv").read_bytes()
    line = _resume(run, capsys)
    assert "metrics.csv: round 3's row on disk (sim_time 123.5) disagrees with the resumed run's" in line
    assert (run / "metrics.csv").read_bytes() == before


def test_a_resume_with_a_metrics_file_of_another_run_refuses(run, capsys):
    text = (run / "metrics.csv").read_text().splitlines()
    header, first = text[0], text[1].split(",")
    first[1] = "123.5"  # sim_time of another run
    (run / "metrics.csv").write_text("\n".join([header, ",".join(first), *text[2:]]) + "\n")
    line = _resume(run, capsys)
    assert "disagree with the checkpoint" in line


def test_a_row_the_kill_interrupted_is_rewritten_from_the_checkpoint(finished, tmp_path, capsys):
    # killed after appending round 3's row but before its checkpoint: the checkpoint has 2
    # rounds, the file 3; the resume redoes round 3 and the file ends as an unbroken run's
    reference = (finished / "run" / "metrics.csv").read_text()
    out = tmp_path / "run"
    RunLoop(from_dict(BASE), out).run(stop_after=2)
    with (out / "metrics.csv").open("a") as fh:
        fh.write(reference.splitlines()[3] + "\n")
    code = main(["run", str(finished / "c.toml"), "--out", str(out), "--resume", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert (out / "metrics.csv").read_text() == reference


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"round,sim_time\n1,\xff\xfe\n", "not UTF-8 text (byte"),
        (b"round,sim_time,test_accuracy\n1,abc,0.5\n", "line 2, column 'sim_time': 'abc' is not a number"),
        (b"sim_time\n1\n", "not a fedhet table (no 'round' column"),
        (b"round,sim_time\n1,2,3,4\n", "line 2: 2 columns expected"),
    ],
)
@pytest.mark.parametrize("command", ["plot", "report", "resume"])
def test_a_damaged_metrics_file_is_one_line_in_every_reader(run, capsys, tmp_path, content, message, command):
    (run / "metrics.csv").write_bytes(content)
    if command == "resume":
        line = _resume(run, capsys)
        assert "nothing rewritten" in line
        assert (run / "metrics.csv").read_bytes() == content
    else:
        code = main([command, str(run), "--out", str(tmp_path / "figures" / "x")])
        line = _one_line(capsys, code)
    assert "metrics.csv" in line and message in line


def test_a_header_only_metrics_file_makes_no_empty_figure(run, capsys, tmp_path):
    header = (run / "metrics.csv").read_text().splitlines()[0]
    (run / "metrics.csv").write_text(header + "\n")
    code = main(["plot", str(run), "--out", str(tmp_path / "fig" / "x")])
    line = _one_line(capsys, code)
    assert "no evaluated round yet" in line and "nothing to plot" in line
    assert not list((tmp_path / "fig").glob("*.png")) if (tmp_path / "fig").exists() else True
    code = main(["report", str(run), "--out", str(tmp_path / "page.html")])
    assert code == 0
    assert "data:image/png" not in (tmp_path / "page.html").read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"name": "t", "rounds"', "not valid JSON (line 1"),
        ("[]", "not a summary (a JSON list, expected an object)"),
        ("{}", "not a fedhet summary (no 'name' key)"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
)
@pytest.mark.parametrize("command", ["compare", "plot", "report"])
def test_a_damaged_summary_is_one_line(run, capsys, tmp_path, content, message, command):
    path = run / "summary.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    argv = [command, str(run)] + ([] if command == "compare" else ["--out", str(tmp_path / "o" / "x")])
    line = _one_line(capsys, main(argv))
    assert "summary.json" in line and message in line


def test_reproduce_runs_a_cell_with_a_damaged_summary_again(tmp_path, capsys):
    experiment = {
        "experiment": {"name": "e", "jobs": 1},
        **BASE,
        "grid": {"algorithm.name": ["salf", "fedavg"]},
        "report": {"rows": ["algorithm.name"]},
    }
    path = tmp_path / "e.toml"
    path.write_text(tomli_w.dumps(experiment))
    out = tmp_path / "out"
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    cells = sorted(p for p in out.iterdir() if (p / "summary.json").exists())
    good = json.loads((cells[0] / "summary.json").read_text())
    (cells[0] / "summary.json").write_text('{"name": ')
    capsys.readouterr()
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    assert (
        json.loads((cells[0] / "summary.json").read_text())["final_test_accuracy"]
        == good["final_test_accuracy"]
    )


def _disk_memory_run(tmp_path) -> tuple:
    document = {
        **BASE,
        "system": {
            "model": "full",
            "participation": "uniform",
            "participation_low": 0.5,
            "participation_high": 0.5,
        },  # fmt: skip
        "algorithm": {"name": "fedvarp", "memory_dtype": "float16", "memory_storage": "disk"},
    }
    document["run"] = {**document["run"], "checkpoint_every": 0}  # a journal record every round
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps(document))
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    return config, out


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_client_memory_journal_is_one_line(tmp_path, capsys, damage):
    config, out = _disk_memory_run(tmp_path)
    journals = sorted((out / "client-memory").glob("journal-*.bin"))
    assert journals
    journal = journals[-1]
    if damage == "missing":
        journal.unlink()
    else:
        journal.write_bytes(journal.read_bytes()[:100])
    capsys.readouterr()
    code = main(["run", str(config), "--out", str(out), "--resume", "--quiet", "--set", "run.rounds=5"])
    line = _one_line(capsys, code)
    assert journal.name in line and damage in line and "--overwrite" in line
