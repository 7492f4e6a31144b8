"""Shared helpers for fedhet's tests: small real configurations and IDX file writers."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# One torch thread for everything the tests run in this process: the suite's models are
# small, and a second thread waiting on a core that another process holds is many times
# slower (runs built from a config choose their own threads, "auto" by default).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """The longer real runs (marked slow) first, in their order, then the rest: on two
    xdist workers they run beside the short tests instead of ending the suite alone. A test
    that reads the session's smoke bench must be of the second tier: the bench is made by
    the session-scoped fixture, before the default tier's guard below could see it."""
    unmarked = [i.nodeid for i in items if "smoke_bench" in getattr(i, "fixturenames", ())
                and i.get_closest_marker("extended") is None]  # fmt: skip
    if unmarked:
        raise pytest.UsageError(f"{unmarked[0]} reads the smoke bench: mark it extended (the second tier)")
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# --- the two tiers ----------------------------------------------------------------------
# The default tier (`python -m pytest -q -n 2`) starts no bench, Flower, Ray, virtual
# environment, PostgreSQL, mkdocs or mypy; a test that does is marked `extended` and runs in
# the second tier (`python -m pytest -q -n 2 -m extended`, which .ci/run runs after the
# first). The fixture below holds the default tier to that: each of those starts, in this
# process or as a child process, fails an unmarked test with one line saying what it started.

# child processes that only the second tier may start: (what the line says, argv test)
HEAVY_COMMANDS = {
    "a bench": lambda argv: "fedhet" in argv and "bench" in argv,
    "mypy": lambda argv: "mypy" in argv,
    "mkdocs": lambda argv: "mkdocs" in argv,
    "a virtual environment": lambda argv: "venv" in argv or "virtualenv" in argv,
    "PostgreSQL": lambda argv: bool({"initdb", "pg_ctl", "postgres"} & set(argv)),
    "Ray": lambda argv: "ray" in argv,
    "Flower": lambda argv: any(a == "flwr" or a.startswith("flower-") for a in argv),
}
# what starts them in this process: (module, attribute, what the line says)
HEAVY_CALLS = [
    ("fedhet.bench.runner", "Bench._execute", "a bench"),  # after the checks, the studies and seeds
    ("fedhet.studies.executor", "start_ray", "Ray"),
    ("venv", "EnvBuilder.create", "a virtual environment"),
]
FLOWER_SIMULATION = "Flower's simulation (and Ray)"


def _argv_words(args) -> list[str]:
    """The words of a child process's command line, each reduced to its last path part."""
    argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    words = []
    for arg in argv:
        text = os.fsdecode(arg)
        words.extend(Path(word).name for word in text.split())
    return words


class SecondTierOnly(Exception):
    """A default-tier test started what only the second tier may start."""


@pytest.fixture(autouse=True)
def _default_tier_starts_nothing_heavy(request, monkeypatch):
    if request.node.get_closest_marker("extended") is not None:
        return

    def refuse(what: str):
        raise SecondTierOnly(f"{request.node.nodeid} starts {what}: mark it extended (the second tier)")

    import subprocess

    real_init = subprocess.Popen.__init__

    def checked_init(self, args, *rest, **kwargs):
        words = _argv_words(args)
        for what, starts in HEAVY_COMMANDS.items():
            if starts(words):
                refuse(what)
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)
    import importlib

    for module_name, attribute, what in HEAVY_CALLS:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        monkeypatch.setattr(owner, name, lambda *a, _what=what, **k: refuse(_what))
    # Flower's own entry point, refused once fedhet's engine is called (importing Flower for
    # every test would cost seconds): the engine's checks before it still run
    engine = importlib.import_module("fedhet.engine.flower")
    real_engine_entry = engine.run_simulation

    def flower_refused(*args, **kwargs):
        import flwr.simulation

        monkeypatch.setattr(flwr.simulation, "run_simulation", lambda *a, **k: refuse(FLOWER_SIMULATION))
        return real_engine_entry(*args, **kwargs)

    monkeypatch.setattr(engine, "run_simulation", flower_refused)


@pytest.fixture
def run_in_process():
    """``fedhet ARGV`` through ``fedhet.cli.main`` in this process from a folder: its exit
    status and stderr (an exception that escapes main is a traceback, as on the command line).
    Saves a child's interpreter start and torch import; as in a new process the fedhet logger
    starts with no handler (main adds its own, on this stderr), and its handlers are restored
    after."""
    return fedhet_in_process


def fedhet_in_process(argv: list, cwd: Path | None = None, paths: tuple = ()) -> tuple[int, str]:
    """See :func:`run_in_process`; ``paths`` are importable while it runs (plug-ins)."""
    import contextlib
    import io
    import logging
    import sys
    import traceback

    from fedhet.cli import main

    logger = logging.getLogger("fedhet")
    handlers, level, err = list(logger.handlers), logger.level, io.StringIO()
    logger.handlers.clear()
    before = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    added = [str(p) for p in paths]
    sys.path[:0] = added
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                status = main([str(a) for a in argv])
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 1
            except Exception:  # noqa: BLE001 - what the command line would print as a traceback
                status = 1
                err.write(traceback.format_exc())
    finally:
        del sys.path[: len(added)]
        os.chdir(before)
        logger.handlers[:] = handlers
        logger.setLevel(level)
    return status, err.getvalue()


# The base of make_config: a few rounds (a test that needs more says so with run.rounds).
SALF_DIGITS_TOML = """\
[run]
name = "salf-digits"
seed = 1
rounds = 5
eval_every = 5
[data]
dataset = "digits"
partition = "iid"
num_clients = 10
[model]
name = "mlp"
[train]
lr = 0.1
batch_size = 16
local_steps = 1
[system]
model = "straggler-ratio"
straggler_ratio = 0.9
[algorithm]
name = "salf"
"""


# The tests that run every built-in rule run it on STRAGGLERS with an MLP, except the rules
# below, which need a setting of their own: (run keys, [system] table, algorithm options).
STRAGGLERS = {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0}
EXPONENTIAL = {"model": "exponential"}
PER_STEP = {"model": "per-step", "time_per_sample_step": 0.01, "comm_time": 0.05}
RULE_SETTINGS = {
    "adel-fl": ({"time_budget": 6.0}, EXPONENTIAL, {}),  # plans against the exponential model
    "amsfl": ({}, PER_STEP, {"round_budget": 20.0}),  # allocates steps with per-step costs
    "timelyfl": ({}, PER_STEP, {}),  # plans from clients' times
    "fedbalancer": ({}, {**PER_STEP, "deadline": 1.0}, {"inference": "pipelined"}),  # likewise
    "fedbuff": ({}, STRAGGLERS, {"buffer_size": 4}),
    "ca2fl": ({}, STRAGGLERS, {"buffer_size": 4}),
    "fadas": ({}, STRAGGLERS, {"buffer_size": 4, "eta": 0.01}),
}
# Four clients on the per-step cost model, for hand-computed energy and traffic:
# c_u = 0.0625 * 16 / P_u seconds per step with P = [0.5, 0.5, 1, 2] (the list [1, 1, 2, 4]
# normalised to mean 1): 2, 2, 1, 0.5 s; two steps; communication 0.1..0.4 s
FOUR_CLIENTS_PER_STEP = {
    "data.num_clients": 4,
    "run.rounds": 3,
    "run.eval_every": 3,
    "train.local_steps": 2,
    "system.model": "per-step",
    "system.time_per_sample_step": 0.0625,
    "system.capability_profile": "list",
    "system.capabilities": [1.0, 1.0, 2.0, 4.0],
    "system.comm_times": [0.1, 0.2, 0.3, 0.4],
    "system.deadline": 3.0,
}


RULE_MODELS = {  # a model of the kind the rule needs
    "depthfl": {"name": "mlp-exits", "hidden": [8]},  # classifiers after its blocks
    "hetlora": {"name": "transformer", "width": 16, "heads": 2, "blocks": 1, "lora_rank": 4},  # adapters
    "fedra": {
        "name": "transformer",
        "width": 16,
        "heads": 2,
        "blocks": 2,
        "lora_rank": 4,
    },  # skippable blocks
    "flora": {  # adapters merged into a base held in the global model
        "name": "transformer",
        "width": 16,
        "heads": 2,
        "blocks": 1,
        "lora_rank": 4,
        "lora_base": "global",
    },
}
# what they read: a text
RULE_DATA = {name: {"dataset": "text", "context": 16} for name in ("hetlora", "fedra", "flora")}


def rule_data(name: str, data: dict) -> dict:
    """``data`` with the dataset rule ``name``'s model needs (its text, for adapters)."""
    return {**data, **RULE_DATA.get(name, {})}


def rule_setting(name: str) -> tuple[dict, dict, dict]:
    """The run keys, [system] table and algorithm options a test runs rule ``name`` with."""
    return RULE_SETTINGS.get(name, ({}, STRAGGLERS, {}))


def make_config(overrides: dict | None = None):
    """The digits configuration above (SALF, 10 clients, 90% stragglers, 5 rounds), with
    ``{"section.key": value}`` overrides."""
    import tomllib

    from fedhet.config import from_dict

    raw = tomllib.loads(SALF_DIGITS_TOML)
    for key, value in (overrides or {}).items():
        section, field = key.split(".")
        raw.setdefault(section, {})[field] = value
    return from_dict(raw)


def config_from(base: dict, *parts: dict, **sections):
    """A configuration from the document ``base`` with each section of ``parts`` and
    ``sections`` merged over it, key by key."""
    from fedhet.config import from_dict

    document = {k: dict(v) for k, v in base.items()}
    for part in (*parts, sections):
        for name, values in part.items():
            document[name] = {**document.get(name, {}), **values}
    return from_dict(document)


def write_idx(path: Path, array: np.ndarray, compress: bool = False, magic: int | None = None) -> Path:
    """Write ``array`` (uint8) as a real IDX file (optionally gzipped or with a bad magic)."""
    array = np.asarray(array, dtype=np.uint8)
    code = magic if magic is not None else (0x08 << 8) | array.ndim
    header = struct.pack(">I", code) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_idx_dataset(folder: Path, n_train=60, n_test=20, compress=True, seed=0) -> Path:
    """Four MNIST-format IDX files with random 28x28 images and labels 0..9."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte", rng.integers(0, 256, (n_train, 28, 28)), compress)
    write_idx(folder / "train-labels-idx1-ubyte", rng.integers(0, 10, n_train), compress)
    write_idx(folder / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28)), compress)
    write_idx(folder / "t10k-labels-idx1-ubyte", rng.integers(0, 10, n_test), compress)
    return folder


@pytest.fixture
def idx_folder(tmp_path: Path) -> Path:
    return write_idx_dataset(tmp_path / "idx")


# --- shared work: one finished smoke bench, copied by the tests that alter a bench ----------
SMOKE_SUITE = REPO / "suites" / "smoke.toml"
BENCH_PLUGIN = REPO / "tests" / "bench_plugin"
BENCH_PLUGIN_RULE = "bench_rules:TrimmedMean"
# the smoke suite with the test package's method, at a smaller budget, tuned twice
SMOKE_BENCH_ARGS = ["--method", BENCH_PLUGIN_RULE, "--trials", "2", "--seeds", "2", "--tuning-repeats", "2",
                    "--set", "run.time_budget=4"]  # fmt: skip


def bench_env(*paths: Path) -> dict:
    """The environment of a ``fedhet bench`` child process: the test package's rules (and
    ``paths``) importable, one thread."""
    search = [*map(str, paths), str(BENCH_PLUGIN), str(REPO / "src")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(search), "OMP_NUM_THREADS": "1",
            "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip


def bench_in_process(out: Path, *extra: str, args: list[str] | None = None, plugins: tuple = ()) -> str:
    """``fedhet bench`` of the smoke suite (with ``args``, default :data:`SMOKE_BENCH_ARGS`)
    into ``out`` in this process (its trials and seeds in forked workers); fails the test
    unless it exits 0; its stderr."""
    argv = ["bench", str(SMOKE_SUITE), *(SMOKE_BENCH_ARGS if args is None else args), "--out", str(out),
            "--quiet", *extra]  # fmt: skip
    status, stderr = fedhet_in_process(argv, paths=(BENCH_PLUGIN, *plugins))
    assert status == 0, stderr[-3000:]
    return stderr


@pytest.fixture(scope="session")
def smoke_bench(tmp_path_factory) -> Path:
    """A finished bench of the smoke suite with the test package's TrimmedMean (2 trials,
    2 seeds, 2 tunings): made once for the whole session (the xdist workers share it, made by
    the first that asks). Read it, or copy it with :func:`copy_bench` before altering it."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this session
    out = root / "smoke-bench"
    with FileLock(str(root / "smoke-bench.lock")):
        if not (out / "leaderboard.csv").exists():
            bench_in_process(out)
    return out


def copy_bench(bench: Path, to: Path) -> Path:
    """A copy of a finished bench folder to alter (its database, trials and seeds)."""
    import shutil

    shutil.copytree(bench, to, ignore=shutil.ignore_patterns("*.lock"))
    return to


# --- shared work: one folder of finished runs, for the tests that only read run folders -----
FINISHED_RUNS_CONFIG = {
    "run": {"name": "finished", "seed": 1, "rounds": 6, "eval_every": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 6, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0,
               "participation": "two-group", "participation_min": 0.3},
    "compare": {"algorithms": ["salf", "fedstale"]},
}  # fmt: skip


@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory) -> Path:
    """A folder of two finished runs (``salf`` and ``fedstale``: a [compare] of 6 rounds
    with deadlines and two-group participation), made once per test process by ``fedhet
    run``. Read it (write reports and figures elsewhere), or copy it before altering it."""
    import tomli_w

    folder = tmp_path_factory.mktemp("finished-runs")
    path = folder / "compare.toml"
    path.write_text(tomli_w.dumps(FINISHED_RUNS_CONFIG))
    status, stderr = fedhet_in_process(["run", path, "--out", folder / "runs", "--quiet"])
    assert status == 0, stderr
    return folder / "runs"
