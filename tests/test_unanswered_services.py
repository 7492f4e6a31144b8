"""Services that never answer, or stop answering: a study database whose server accepts the
connection and says nothing, a Ray address where nothing listens, a database connection
lost in the middle of a command. Each is one line, in seconds, not a hang or a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from fedhet.errors import FedhetError, database_lost


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    server.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_study_database_that_never_answers_is_one_line_within_the_timeout(silent_server, monkeypatch):
    pytest.importorskip("psycopg2")
    from fedhet.studies import trials

    monkeypatch.setattr(trials, "STORAGE_TIMEOUT", 1.5)
    began = time.monotonic()
    with pytest.raises(FedhetError, match="did not answer within 1.5 s") as caught:
        trials.check_storage(f"postgresql://fedhet@127.0.0.1:{silent_server}/study")
    assert time.monotonic() - began < 10
    assert "\n" not in str(caught.value) and "--storage" in str(caught.value)


@pytest.mark.extended  # waits out the 20 s default timeout
def test_tune_with_a_storage_that_never_answers_ends_in_one_line(silent_server, tmp_path):
    """The command itself: exit 2, one line on stderr, no traceback (the default timeout)."""
    pytest.importorskip("psycopg2")
    config, space = tmp_path / "c.toml", tmp_path / "space.toml"
    config.write_text("[run]\nrounds = 2\n")
    space.write_text('[params]\n"train.lr" = { low = 0.01, high = 0.1 }\n')
    url = f"postgresql://fedhet@127.0.0.1:{silent_server}/study"
    began = time.monotonic()
    command = [
        "tune",
        str(config),
        "--space",
        str(space),
        "--trials",
        "1",
        "--storage",
        url,
        "--out",
        str(tmp_path / "t"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "fedhet", *command], capture_output=True, text=True, timeout=120
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "did not answer" in lines[0] and time.monotonic() - began < 60


def test_a_ray_address_where_nothing_listens_is_one_line_at_once():
    """What ``start_ray`` checks before ``ray.init`` (which waits minutes for an address
    nothing serves): a port nothing listens on; a form Ray resolves itself passes."""
    from fedhet.studies.executor import check_listening

    port = _free_port()
    began = time.monotonic()
    with pytest.raises(FedhetError, match=f"--ray 127.0.0.1:{port}: nothing answers there"):
        check_listening(f"127.0.0.1:{port}", "--ray")
    with pytest.raises(FedhetError, match="nothing answers there"):
        check_listening(f"ray://127.0.0.1:{port}", "--ray")
    assert time.monotonic() - began < 10
    check_listening("auto", "--ray")  # Ray's own address lookup


def test_a_database_connection_lost_mid_command_is_named_in_one_line():
    """The driver's error as SQLAlchemy wraps it (a real refused connection), anywhere in
    the chain of what a command raises, is recognised; other errors are not."""
    pytest.importorskip("psycopg2")
    from sqlalchemy import create_engine
    from sqlalchemy.exc import OperationalError

    engine = create_engine(f"postgresql://fedhet@127.0.0.1:{_free_port()}/study")
    with pytest.raises(OperationalError) as caught:
        engine.connect()
    try:
        raise RuntimeError("a trial failed") from caught.value
    except RuntimeError as wrapped:
        line = database_lost(wrapped)
    assert line is not None and line.startswith("the study database stopped answering (")
    assert "\n" not in line
    assert database_lost(ValueError("not a database")) is None


def test_a_ray_address_that_accepts_but_never_answers_is_one_line_within_the_timeout(silent_server):
    """A port that accepts connections and never answers is no Ray head (Ray's ``ray.init``
    would retry for ever): the gRPC preface check says so in one line within its timeout;
    a real head (the Flower engine's local Ray) passes it."""
    from fedhet.studies.executor import check_speaks_grpc

    began = time.monotonic()
    with pytest.raises(FedhetError, match=r"no Ray head answers there \(no answer within 1 s\)") as caught:
        check_speaks_grpc(f"127.0.0.1:{silent_server}", "--ray", timeout=1.0)
    assert "\n" not in str(caught.value) and time.monotonic() - began < 5


@pytest.mark.extended  # starts a local Ray
def test_a_real_ray_head_speaks_the_protocol_the_check_expects():
    """The preface check passes a Ray head's GCS address (else every --ray would be refused)."""
    pytest.importorskip("ray")
    from fedhet.engine.flower_ray import start_head
    from fedhet.studies.executor import check_speaks_grpc

    head = start_head(1)
    try:
        check_speaks_grpc(head.address, "--ray")
    finally:
        head.stop()
    assert not head.alive()


@pytest.mark.extended  # a real command against a silent port
def test_tune_with_a_ray_address_that_accepts_but_is_no_ray_ends_in_one_line(silent_server, tmp_path):
    """A port that accepts connections and never answers is no Ray head: Ray would retry
    for ever; the command exits 2 with one line on stderr, within the stated timeout."""
    pytest.importorskip("ray")
    from fedhet.studies.executor import RAY_CONNECT_TIMEOUT

    config, space = tmp_path / "c.toml", tmp_path / "space.toml"
    config.write_text("[run]\nrounds = 2\n[data]\nvalidation_fraction = 0.2\n")
    space.write_text('[params]\n"train.lr" = { low = 0.01, high = 0.1 }\n')
    began = time.monotonic()
    command = ["tune", str(config), "--space", str(space), "--trials", "1", "--out", str(tmp_path / "t")]
    done = subprocess.run(
        [sys.executable, "-m", "fedhet", *command, "--ray", f"127.0.0.1:{silent_server}"],
        capture_output=True, text=True, timeout=RAY_CONNECT_TIMEOUT + 90,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "no Ray head answers there" in lines[0] and time.monotonic() - began < 30
