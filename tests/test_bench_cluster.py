"""``fedhet bench`` on a cluster: its Optuna studies in a real PostgreSQL server (``--storage
postgresql://...``) and its studies and seeds as tasks of a two-node Ray cluster
(``--ray ADDRESS``), giving the leaderboard.csv of a bench on one process with SQLite.

Both servers are started and stopped by the tests themselves on this machine: PostgreSQL
with ``initdb`` and ``pg_ctl`` (as the ``postgres`` user when the tests run as root), Ray
with ``ray start --head`` and a second ``ray start --address`` with its own temp folder.
Where either is missing, the test skips with the reason."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import SMOKE_BENCH_ARGS, SMOKE_SUITE, bench_env, fedhet_in_process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres_user() -> list[str]:
    """``runuser -u postgres --`` when running as root (initdb refuses root), else nothing."""
    if os.geteuid() != 0:
        return []
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("the tests run as root and there is no postgres user to run PostgreSQL as")
    if shutil.which("runuser") is None:
        pytest.skip("the tests run as root and runuser is missing to start PostgreSQL as postgres")
    return ["runuser", "-u", "postgres", "--"]


def _new_postgres() -> tuple[str, list[str], Path]:
    """A PostgreSQL server of its own, made but not started: its URL, the ``pg_ctl`` command
    line that starts or stops it (add ``start`` or ``-m immediate stop``) and its folder."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not on this machine")
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver (psycopg2-binary) is not installed")
    user = _as_postgres_user()
    folder = Path(tempfile.mkdtemp(prefix="fedhet-pg-"))
    if user:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", _free_port()
    subprocess.run([*user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)  # fmt: skip
    server = [*user, pg_ctl, "-D", str(data), "-o", f"-p {port} -k {folder} -h 127.0.0.1", "-l",
              str(folder / "log"), "-w"]  # fmt: skip
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", server, folder


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own on a free loopback port: its URL."""
    url, server, folder = _new_postgres()
    subprocess.run([*server, "start"], check=True, capture_output=True)
    try:
        yield url
    finally:
        subprocess.run([*server, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _processes_of(marker: str) -> list[int]:
    """The processes whose command line names ``marker`` (a node's temp folder), and theirs."""
    parents: dict[int, int] = {}
    named = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                named.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    found, grew = set(named), True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grew = bool(children)
    return sorted(found)


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node and a second node, one CPU each, each with its own temp folder: the
    address, and the two folders (their logs say where tasks ran)."""
    pytest.importorskip("ray")
    ray = Path(sys.executable).parent / "ray"
    if not ray.exists():
        pytest.skip("the ray command is not installed beside this Python")
    root = Path(tempfile.mkdtemp(prefix="fedhet-ray-"))
    head, second, port = root / "head", root / "second", _free_port()
    env = bench_env()  # the nodes' workers import the test package's rules
    try:
        start = {"check": True, "capture_output": True, "env": env, "timeout": 180}
        subprocess.run([str(ray), "start", "--head", f"--port={port}", "--num-cpus=1",
                        "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={head}"],
                       **start)  # type: ignore[call-overload]  # fmt: skip
        subprocess.run([str(ray), "start", f"--address=127.0.0.1:{port}", "--num-cpus=1",
                        f"--temp-dir={second}"], **start)  # type: ignore[call-overload]  # fmt: skip
        yield f"127.0.0.1:{port}", head, second
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _processes_of(str(root)):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            time.sleep(1.0)
        shutil.rmtree(root, ignore_errors=True)


def _bench(out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fedhet", "bench", str(SMOKE_SUITE), *SMOKE_BENCH_ARGS,
               "--out", str(out), "--quiet", *extra]  # fmt: skip
    done = subprocess.run(command, env=bench_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _worker_logs(node: Path) -> list[Path]:
    return list(node.glob("session_*/logs/worker-*"))


@pytest.mark.slow
@pytest.mark.extended
def test_a_bench_on_a_two_node_ray_cluster_with_postgresql_studies_gives_the_one_process_leaderboard(
    tmp_path, postgres, ray_cluster, smoke_bench
):
    """Studies in PostgreSQL (named after the suite, so that benches share one database),
    studies and seeds run by the tasks of both Ray nodes: the same leaderboard.csv as
    the finished smoke bench (``--jobs 1``, the folder's SQLite, in one process); run again, it
    resumes (nothing runs twice)."""
    import optuna

    address, head, second = ray_cluster
    _bench(tmp_path / "cluster", "--ray", address, "--jobs", "2", "--storage", postgres)
    expected = (smoke_bench / "leaderboard.csv").read_text()
    assert (tmp_path / "cluster" / "leaderboard.csv").read_text() == expected
    assert not (tmp_path / "cluster" / "bench.db").exists()
    names = optuna.get_all_study_names(storage=postgres)
    assert "smoke/random-50/salf" in names and len(names) == 3 * 5 * 2
    assert _worker_logs(head) and _worker_logs(second), "both nodes ran tasks"
    seeds = sorted((tmp_path / "cluster").glob("seeds/**/seed-*/summary.json"))
    assert len(seeds) == 3 * 5 * 2 * 2
    stamps = [p.stat().st_mtime_ns for p in seeds]
    _bench(tmp_path / "cluster", "--ray", address, "--jobs", "2", "--storage", postgres)
    assert [p.stat().st_mtime_ns for p in seeds] == stamps  # resumed: no seed ran again
    assert (tmp_path / "cluster" / "leaderboard.csv").read_text() == expected


def test_a_storage_url_that_does_not_open_is_refused_in_one_line(tmp_path):
    port = _free_port()  # nothing listens there
    argv = ["bench", str(SMOKE_SUITE), "--trials", "2", "--out", str(tmp_path / "out"), "--quiet",
            "--storage", f"postgresql://postgres@127.0.0.1:{port}/postgres"]  # fmt: skip
    status, stderr = fedhet_in_process(argv)
    assert status != 0 and stderr.count("\n") == 1, stderr
    assert "--storage 'postgresql://postgres@127.0.0.1" in stderr and "cannot open the database" in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.extended
def test_a_database_server_stopped_mid_bench_is_one_line_and_the_bench_resumes(tmp_path):
    """The study database's server stops while the bench tunes: the command ends with one
    line naming it (no traceback); with the server back, the same command finishes the
    bench."""
    url, server, folder = _new_postgres()
    subprocess.run([*server, "start"], check=True, capture_output=True)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fedhet", "bench", str(SMOKE_SUITE), *SMOKE_BENCH_ARGS,
               "--out", str(out), "--quiet", "--storage", url]  # fmt: skip
    try:
        bench = subprocess.Popen(
            command, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(out.glob("trials/**/metrics.csv")):
            time.sleep(0.05)
        subprocess.run([*server, "-m", "immediate", "stop"], check=True, capture_output=True)
        _, stderr = bench.communicate(timeout=300)
        lines = stderr.strip().splitlines()
        assert bench.returncode == 2, stderr[-3000:]
        assert len(lines) == 1 and "the study database stopped answering" in lines[0], stderr[-3000:]
        subprocess.run([*server, "start"], check=True, capture_output=True)
        done = subprocess.run(command, env=bench_env(), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        assert (out / "leaderboard.csv").exists()
    finally:
        subprocess.run([*server, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.extended
def test_study_connections_give_up_on_a_server_that_stops_answering(postgres):
    """Every study's connection to a PostgreSQL server carries TCP keepalives and a 60 s
    limit on unacknowledged data (a server gone mid-command is given up on, not waited for
    for ever), and the server accepts them."""
    from fedhet.studies.trials import DRIVER_TIMEOUTS, rdb_storage

    storage = rdb_storage(postgres)
    try:
        with storage.engine.connect() as connection:
            used = connection.connection.dbapi_connection.get_dsn_parameters()
    finally:
        storage.engine.dispose()
    wanted = DRIVER_TIMEOUTS["postgresql"]
    assert {key: used.get(key) for key in wanted} == {key: str(value) for key, value in wanted.items()}
