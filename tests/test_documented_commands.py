"""Every ``fedhet`` command the README and the docs show, and those in the example
configurations' headers, runs as shown and exits 0 with no traceback; every example
configuration runs, and every experiment file expands and runs its first cell for one round.

Tiny budgets keep it fast: ``fedhet run`` gets ``--set run.rounds=2``, ``tune`` and ``bench``
one trial (and one seed), ``reproduce`` lists its cells (``--list``: every cell built and
checked; the experiments' first cells then run below). Synopses (``fedhet run CONFIG.toml
[--set ...]``) are not commands. The few commands that need what the test cannot have are
listed in :data:`SKIPPED` with the reason.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import fedhet_in_process

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs").glob("*/*.md")),
]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.toml") if p.name != "pyproject.toml")
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.toml"))
FMNIST = Path("/usr/share/datasets/fashion-mnist")
SUBCOMMANDS = {"run", "reproduce", "plan", "calibrate", "trace", "devices", "plot", "compare", "report",
               "tune", "check", "list", "bench"}  # fmt: skip

# commands that need what a test cannot have: (start of the command, why)
SKIPPED = [
    ("fedhet plot runs/", "draws the run folders of a grid shown above it (hours of runs)"),
    ("fedhet report runs/", "reports on the run folders of a grid shown above it (hours of runs)"),
    ("fedhet compare runs/a runs/b", "compares two run folders the reader made"),
    ("fedhet bench suites/heterogeneity.toml",
     "thousands of runs on Fashion-MNIST; its suite is checked below and the smoke suite runs the same code"),
    ("fedhet bench suites/peers", "hundreds of runs on Fashion-MNIST; the suites are checked below and the "
     "smoke suite runs the same code"),
]  # fmt: skip
PLACEHOLDER = re.compile(r"(^|[\s=])([A-Z][A-Z_]*[A-Z](\.[a-z]+)?|RUN_DIRS\.\.\.)(\s|$|,)")
USER_FILES = {"data.data_dir=PATH": "reads the user's NSL-KDD files (data.data_dir)"}
NEEDS_FILES = {
    "cifar10": "CIFAR-10 is read from the user's folder",
    "nsl-kdd": "NSL-KDD is read from the user's folder",
}


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Lines of the shell code blocks (```bash, ```sh) of a markdown file, continuations
    joined (other blocks hold output, diagrams or usage)."""
    out, fenced, shell, pending, start = [], False, False, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            shell = fenced and line.strip()[3:].strip() in ("bash", "sh", "shell", "console")
            continue
        if not shell:
            continue
        if pending:
            pending += " " + line.strip()
        else:
            pending, start = line.strip(), number
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        out.append((start, pending))
        pending = ""
    return out


def _header_lines(path: Path) -> list[tuple[int, str]]:
    """Commands in a configuration's comment header (``#   fedhet ...``, continuations joined)."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.lstrip("#").strip() if line.startswith("#") else ""
        if pending:
            pending += " " + text
        elif re.match(r"(PYTHONPATH=\S+ )?fedhet ", text):
            pending, start = text, number
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        lines.append((start, pending))
        pending = ""
    return lines


def _strip_comment(command: str) -> str:
    return re.split(r"\s+#\s", command, maxsplit=1)[0].strip()


def documented_commands() -> dict[str, list[str]]:
    """Per document, the fedhet commands it shows, in order, once each."""
    found: dict[str, list[str]] = {}
    sources = [(p, _code_lines(p)) for p in DOCUMENTS] + [
        (p, _header_lines(p)) for p in EXAMPLES + EXPERIMENTS
    ]
    for path, lines in sources:
        for _, line in lines:
            command = _strip_comment(line)
            match = re.match(r"(PYTHONPATH=\S+ )?fedhet (\S+)", command)
            if match and (match.group(2) in SUBCOMMANDS or match.group(2).startswith("--")):
                commands = found.setdefault(str(path.relative_to(ROOT)), [])
                if command not in commands:
                    commands.append(command)
    return found


def _is_synopsis(command: str) -> bool:
    """A usage line with placeholders, not a command (``fedhet run CONFIG.toml [--set ...]``)."""
    if any(token in command for token in USER_FILES):
        return False
    return "[" in command or "..." in command or bool(PLACEHOLDER.search(command))


def _skip_reason(command: str) -> str | None:
    for start, why in SKIPPED:
        if command.startswith(start):
            return why
    for token, why in USER_FILES.items():
        if token in command:
            return why
    if "experiments/" in command and not FMNIST.is_dir():
        return "needs Fashion-MNIST (apt-get install dataset-fashion-mnist)"
    return None


def _runnable(command: str, index: int) -> tuple[list[str], list[str]]:
    """The command's environment assignments and argv, with the test's tiny budget and,
    for the commands that make run folders, a folder of its own."""
    env_part, _, rest = command.partition("fedhet ")
    argv = shlex.split(rest)
    verb = argv[0] if argv else ""
    out = f"runs/command-{index}"
    extra: list[str] = []
    if verb == "run":
        extra = ["--set", "run.rounds=2", "--out", out]
    elif verb == "reproduce":
        extra = ["--list"]
    elif verb == "tune":
        extra = ["--trials", "1", "--set", "run.rounds=2", "--out", out, "--quiet"]
    elif verb == "bench":
        extra = ["--trials", "1", "--seeds", "1", "--set", "run.rounds=2", "--out", out, "--quiet"]
    return shlex.split(env_part), [sys.executable, "-m", "fedhet", *argv, *extra]


def _environment(assignments: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        env[key] = os.pathsep.join(str(ROOT / part) for part in value.split(os.pathsep))
    paths = [env.get("PYTHONPATH", ""), str(ROOT / "src")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _tier(command: str) -> str:
    """``extended`` for a command that starts a bench or Ray (the second tier), else ``default``."""
    argv = shlex.split(command.partition("fedhet ")[2])
    return "extended" if (argv[:1] == ["bench"] or "--ray" in argv) else "default"


COMMANDS = documented_commands()
# (document, tier) for every document with a command of that tier to run
DOCUMENT_TIERS = sorted({(document, _tier(c)) for document, commands in COMMANDS.items() for c in commands
                         if not (_is_synopsis(c) or _skip_reason(c))})  # fmt: skip


def test_the_documents_show_commands_and_the_skip_list_stays_short():
    shown = [c for commands in COMMANDS.values() for c in commands]
    assert len(shown) > 20
    assert any(c.startswith("fedhet run examples/measured_cnn2.toml") for c in shown)
    assert len(SKIPPED) + len(USER_FILES) <= 6


@pytest.mark.parametrize(
    "document, tier",
    [
        pytest.param(d, t, marks=pytest.mark.extended) if t == "extended" else (d, t)
        for d, t in DOCUMENT_TIERS
    ],
)
def test_the_commands_a_document_shows_run_as_shown(document, tier, tmp_path):
    """A document's commands run in order in one folder (a later one may read what an
    earlier one wrote: calibrate's times.json, a tune folder), with the repository's
    examples, experiments, suites and docs beside them; those that start a bench or Ray in
    the second tier."""
    for name in ("examples", "experiments", "suites", "docs"):
        (tmp_path / name).symlink_to(ROOT / name)
    failures = []
    for index, command in enumerate(COMMANDS[document]):
        if _is_synopsis(command) or _skip_reason(command) or _tier(command) != tier:
            continue  # a usage line (its options run with the commands that use them), SKIPPED, other tier
        assignments, argv = _runnable(command, index)
        if not assignments and argv[3] == "reproduce":  # --list: cells built and checked, no run
            status, stderr = fedhet_in_process(argv[3:], tmp_path)
        else:
            done = subprocess.run(
                argv, env=_environment(assignments), cwd=tmp_path, capture_output=True, text=True, timeout=600
            )
            status, stderr = done.returncode, done.stderr
        if status != 0 or "Traceback" in stderr:
            failures.append(f"{document}: {command}\n{stderr[-2000:]}")
    assert not failures, "\n\n".join(failures)


def _experiment_kind(path: Path) -> str:
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    if "params" in raw or "objective" in raw:
        return "space"
    if "suite" in raw:
        return "suite"
    return "experiment" if {"experiment", "grid", "cases"} & set(raw) else "config"


@pytest.mark.parametrize(
    "path", EXAMPLES + EXPERIMENTS, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES + EXPERIMENTS]
)
def test_every_example_and_experiment_runs_its_first_cell_for_one_round(path, tmp_path, monkeypatch):
    from fedhet.config import from_dict, load_config, read_toml
    from fedhet.engine.launch import run
    from fedhet.studies.expansion import compare_cells
    from fedhet.studies.spec import load_experiment
    from fedhet.studies.tune import load_space

    kind = _experiment_kind(path)
    if kind == "space":  # a search space: it loads, and its study configuration is the one beside it
        load_space(path)
        return
    if "plugin" in path.parts:
        monkeypatch.syspath_prepend(str(ROOT / "examples" / "plugin" / "src"))
    if kind == "experiment":
        config = load_experiment(path).cells[0].config
    else:
        raw = read_toml(path)  # as `fedhet run` reads it: relative paths against the file's folder
        config = compare_cells(raw, path)[0].config if raw.get("compare") else load_config(path)
    if config.data.dataset in NEEDS_FILES:
        pytest.skip(NEEDS_FILES[config.data.dataset])
    if config.data.dataset == "fmnist" and not FMNIST.is_dir():
        pytest.skip("needs Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    if config.run.engine == "flower":
        pytest.skip("a Flower App's configuration; tests/test_flower.py runs it on Flower")
    raw = tomllib.loads(config.to_toml())
    raw["run"]["rounds"] = 1
    raw["run"]["threads"] = 1
    summary = run(from_dict(raw), tmp_path / "run").summary
    assert summary["rounds"] == 1 or summary.get("stopped_by"), summary


def test_the_shipped_suites_load_and_check_every_configuration():
    from fedhet.bench.suite import load_suite

    if not FMNIST.is_dir():
        pytest.skip("needs Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    suite = load_suite(ROOT / "suites" / "heterogeneity.toml")
    assert len(suite.pairs()) == 198  # 30 methods x 7 scenarios, less the skipped
    assert len(load_suite(ROOT / "suites" / "selection.toml").pairs()) == 258
    assert len(load_suite(ROOT / "suites" / "peers.toml").pairs()) == 57
    assert len(load_suite(ROOT / "suites" / "peers-cnn.toml").pairs()) == 46
    assert len(load_suite(ROOT / "suites" / "peers-dropout.toml").pairs()) == 24


def test_the_repository_holds_no_database_archive_or_large_file():
    """Generated files stay out of the repository: no database, no archive, and nothing
    above 200 KB outside the documentation's figures, but for the results pages' per-run
    tables (up to 1 MB: a published field keeps every tuning's seeds and trials, which
    ``--against`` reads back)."""
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    banned = (".db", ".sqlite", ".sqlite3", ".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z")
    banned += (".pt", ".pkl")
    problems = []
    for name in filter(None, tracked.stdout.split("\0")):
        path = ROOT / name
        if name.endswith(banned):
            problems.append(f"{name}: a database, archive or binary dump")
        elif path.is_file() and "/figures/" not in f"/{name}":
            limit = 1_000_000 if name.startswith("docs/results/data/") else 200_000
            if path.stat().st_size > limit:
                problems.append(f"{name}: {path.stat().st_size:,} bytes (> {limit // 1000} KB)")
    assert not problems, "\n".join(problems)
