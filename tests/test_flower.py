"""The Flower engine: the same run on Flower's simulation runtime (Ray) gives the embedded
engine's metrics; a failing or late client is absent for its round and the run goes on."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr", reason="the Flower engine needs the extra: pip install 'fedhet[flower]'")

for _key, _value in {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}.items():
    os.environ[_key] = _value

from fedhet.config import from_dict  # noqa: E402
from fedhet.engine.flower import decode_task, decode_update, encode_task, encode_update  # noqa: E402
from fedhet.engine.flower import run_simulation as run_on_flower  # noqa: E402
from fedhet.engine.loop import RunLoop  # noqa: E402

# Every test here starts Flower (and Ray, or a SuperLink): the second tier.
pytestmark = [pytest.mark.slow, pytest.mark.extended]

BASE = {
    "run": {"name": "fl", "seed": 3, "rounds": 3, "threads": 1, "eval_every": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 8, "local_steps": 2},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
}

CASES = {
    # momentum kept between rounds lives in the ClientApp's context.state
    "salf": {"algorithm": {"name": "salf"}, "train": {"momentum": 0.9, "keep_momentum": True}},
    "fedavg": {"algorithm": {"name": "fedavg"}},
    # a probe round (ADEL-FL's warm-up) before round 1, planned deadlines
    "adel-fl": {
        "algorithm": {"name": "adel-fl", "estimate_constants": True},
        "run": {"time_budget": 6.0},
        "system": {
            "model": "exponential",
            "deadline": 0.0,
            "time_per_sample_layer": 0.02,
            "capability_profile": "uniform",
        },
    },  # fmt: skip
    # planned epochs and top layers per client against its own deadline
    "timelyfl": {
        "algorithm": {"name": "timelyfl"},
        "system": {
            "model": "per-step",
            "time_per_sample_step": 0.01,
            "capability_profile": "uniform",
            "capability_low": 0.1,
            "capability_high": 2.0,
        },
    },  # fmt: skip
    # a width per client and per batch: ordered dropout and self-distillation on the client
    "fjord": {
        "algorithm": {"name": "fjord"},
        "system": {
            "model": "per-step",
            "time_per_sample_step": 0.05,
            "capability_profile": "uniform",
            "capability_low": 0.1,
            "capability_high": 2.0,
        },
    },  # fmt: skip
    # a local depth per client, its classifiers distilling each other on the client
    "depthfl": {
        "algorithm": {"name": "depthfl"},
        "model": {"name": "mlp-exits", "hidden": [16, 16]},
        "system": {
            "model": "per-step",
            "time_per_sample_step": 0.05,
            "capability_profile": "uniform",
            "capability_low": 0.1,
            "capability_high": 2.0,
        },
    },  # fmt: skip
    # the server optimizer kind on a rule's global update (moments in the run's state)
    "salf-yogi": {"algorithm": {"name": "salf"}, "server": {"optimizer": "yogi", "lr": 0.05}},
    # event-driven: every arrival mixed from the model its client was sent
    "fedasync": {"algorithm": {"name": "fedasync", "max_concurrency": 2}},
    "fedstale": {
        "algorithm": {"name": "fedstale", "beta": 0.5},
        "system": {"participation": "two-group", "participation_min": 0.4},
    },
}


def _config(case: dict, **run):
    document = {k: dict(v) for k, v in BASE.items()}
    for section, values in case.items():
        document[section] = {**document.get(section, {}), **values}
    document["run"].update(run)
    return from_dict(document)


@pytest.mark.parametrize("name", list(CASES))
def test_flower_metrics_equal_the_embedded_engine(tmp_path, name):
    """Every task and update crosses Flower as a RecordDict; a dropped, reordered or
    mis-addressed message, or lost client state, would change the metrics."""
    embedded = RunLoop(_config(CASES[name]), tmp_path / "embedded").run()
    flower = run_on_flower(_config(CASES[name], engine="flower"), tmp_path / "flower")
    assert len(flower.metrics) == len(embedded.metrics) == 3
    for mine, theirs in zip(flower.metrics, embedded.metrics, strict=True):
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), (name, key)
        assert mine["participants"] == theirs["participants"]
    assert flower.summary["engine"] == "flower" and flower.summary["finished"]
    assert (tmp_path / "flower" / "summary.json").exists() and (tmp_path / "flower" / "metrics.csv").exists()


def test_a_resumed_flower_run_keeps_the_clients_state(tmp_path):
    """Momentum kept between rounds is client state: the pool holds it on the server side,
    where the checkpoint keeps it, so a Flower run stopped after round 2 and resumed (a new
    simulation, new ClientApps) ends with the metrics of an uninterrupted run."""
    case = CASES["salf"]
    whole = RunLoop(_config(case, rounds=4), tmp_path / "embedded").run()
    run_on_flower(_config(case, engine="flower", rounds=2), tmp_path / "flower")
    resumed = run_on_flower(_config(case, engine="flower", rounds=4), tmp_path / "flower", resume=True)
    assert len(resumed.metrics) == 4
    for mine, theirs in zip(resumed.metrics, whole.metrics, strict=True):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], abs=1e-6)
        assert mine["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=1e-6)


def test_a_failing_client_is_absent_and_the_run_goes_on(tmp_path, caplog):
    # a client's exception is a bug that stops the run unless the run treats it as a fault
    config = _config(CASES["fedavg"], engine="flower", on_client_error="skip")
    embedded = RunLoop(_config(CASES["fedavg"]), tmp_path / "embedded").run()
    with caplog.at_level("WARNING", logger="fedhet"):
        result = run_on_flower(config, tmp_path / "flower", fail_clients=(1,))
    assert result.summary["finished"] and len(result.metrics) == 3
    for mine, theirs in zip(result.metrics, embedded.metrics, strict=True):
        assert mine["participants"] == theirs["participants"] - 1
    assert "client 1 absent: client error" in caplog.text and "fails on purpose" in caplog.text


def test_a_late_client_is_absent_after_the_round_timeout(tmp_path, caplog):
    config = _config(CASES["fedavg"], engine="flower", round_timeout=5.0, rounds=2)
    with caplog.at_level("WARNING", logger="fedhet"):
        result = run_on_flower(config, tmp_path / "flower", delay_clients={2: 12.0})
    # client 2 never answers in time; in Ray's simulation a sleeping client also holds a
    # worker, so another client may be late too (wall-clock timeouts drop fast clients too,
    # and on a loaded machine a whole round can time out): some fast client must get through
    assert result.summary["finished"] and len(result.metrics) == 2
    assert all(r["participants"] <= 3 for r in result.metrics)
    assert max(r["participants"] for r in result.metrics) >= 1
    assert "round 1: client 2 absent: no reply within the round's timeout" in caplog.text


def test_tasks_and_updates_survive_a_record_dict_round_trip():
    import torch

    from fedhet.messages import ClientTask, ClientUpdate, Coverage

    task = ClientTask(4, 2, 0.1, 8, 3, Coverage(2), 1.5, 3, payload={"control": torch.arange(5.0), "k": 2})
    params, buffers = torch.randn(7), torch.zeros(0)
    back, p, b, _ = decode_task(encode_task(task, params, buffers))
    assert back.to_dict().keys() == task.to_dict().keys() and back.round == 4 and back.coverage.depth == 2
    assert torch.equal(back.payload["control"], task.payload["control"]) and back.payload["k"] == 2
    assert torch.equal(p, params) and b.numel() == 0
    update = ClientUpdate(
        2, Coverage(2), 3, 40, 0.7, torch.randn(4), payload={"delta_control": torch.ones(3)}
    )
    again, _ = decode_update(encode_update(update))
    assert torch.equal(again.delta, update.delta) and again.steps == 3 and again.loss == pytest.approx(0.7)
    assert torch.equal(again.payload["delta_control"], torch.ones(3))


# --- real deployment: a SuperLink and three SuperNodes on this machine ---------------------

import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "examples" / "flower-app"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bin(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else (shutil.which(name) or name)


# The `flower-supernode` command with two of its fixed intervals shortened, neither of which
# Flower 1.41 has an option for: its heartbeat (10 s, Flower's smallest accepted interval,
# instead of 30 s, so the SuperLink declares a killed node lost after 20 s instead of 60 s)
# and its wait between two requests for work (at most 0.2 s instead of 3 s; every sleep of
# that loop is a poll). What the node does with a message is unchanged.
QUICK_SUPERNODE = (
    "import sys, time, types\n"
    "import flwr.supercore.heartbeat as beat, flwr.supernode.fleet_http_connection as link\n"
    "import flwr.supernode.start_client_internal as node\n"
    "beat.HEARTBEAT_DEFAULT_INTERVAL = link.HEARTBEAT_DEFAULT_INTERVAL = 10\n"
    "node.time = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if k[0] != '_'})\n"
    "node.time.sleep = lambda seconds: time.sleep(min(seconds, 0.2))\n"
    "from flwr.supernode.cli import flower_supernode\n"
    "sys.argv[0] = 'flower-supernode'\n"
    "sys.exit(flower_supernode())\n"
)


class Deployment:
    """A SuperLink and SuperNodes started as the README's deployment section says (the
    SuperNodes through QUICK_SUPERNODE: shorter heartbeat and work-poll intervals)."""

    def __init__(self, home: Path, node_configs: list[str]):
        self.home, self.procs = home, []
        self.port = _free_port()
        self.env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local-test"\n\n[superlink.local-test]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self._start([_bin("flower-superlink"), "--insecure", "--port", str(self.port),
                     "--disable-runtime-dependency-installation"], "superlink")  # fmt: skip
        self.wait_for(lambda: "Uvicorn running" in self.log("superlink"), 60)
        for i, node_config in enumerate(node_configs):
            self.start_node(node_config, f"supernode{i}")
        self.wait_for(lambda: self.activated() >= len(node_configs), 60)

    def start_node(self, node_config: str, name: str) -> None:
        """A SuperNode serving ``node_config``, connected to this SuperLink."""
        launch = [sys.executable, "-c", QUICK_SUPERNODE]
        link = f"127.0.0.1:{self.port}"
        self._start([*launch, "--insecure", "--superlink", link, "--port", str(_free_port()),
                     "--node-config", node_config], name)  # fmt: skip

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def activated(self) -> int:
        """How many SuperNode activations the SuperLink has logged."""
        return self.log("superlink").count("[Fleet.ActivateNode] Activated")

    @staticmethod
    def wait_for(check, limit: float) -> None:
        end = time.monotonic() + limit
        while not check() and time.monotonic() < end:
            time.sleep(0.2)

    def _start(self, cmd: list[str], name: str) -> None:
        log = (self.home / f"{name}.log").open("w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))  # fmt: skip

    def run(self, *run_config: str, timeout: float = 300) -> subprocess.CompletedProcess:
        cmd = [_bin("flwr"), "run", str(APP), "local-test", "--stream"]
        for item in run_config:
            cmd += ["--run-config", item]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)

    def start_run(self, *run_config: str) -> subprocess.Popen:
        """``flwr run`` started, not awaited: its output (stdout and stderr) in one pipe."""
        cmd = [_bin("flwr"), "run", str(APP), "local-test", "--stream"]
        for item in run_config:
            cmd += ["--run-config", item]
        out = subprocess.PIPE
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=self.env)

    def stop(self) -> None:
        for proc in self.procs:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _deadlines_scenario(home: Path) -> dict:
    """The example app on a SuperLink and three SuperNodes (SuperNode 2 slow on purpose:
    node config layer-delay = 0.3 s per layer, acting on wall-clock tasks only), run twice:
    one round on fedhet's simulated clock, then two with a real 0.5 s deadline."""
    configs = [f"partition-id={i} num-partitions=3" for i in range(3)]
    configs[2] += " layer-delay=0.3"
    deployment = Deployment(home / "flwr", configs)
    try:
        simulated = deployment.run(f'out="{home / "run"}"', 'set="run.rounds=1"')
        wall = 'set="run.rounds=2 system.model=wall-clock system.deadline=0.5"'
        real = deployment.run(f'out="{home / "wall"}"', wall)
    finally:
        deployment.stop()
    return {"home": home, "simulated": simulated, "real": real}


def _kill_scenario(home: Path) -> dict:
    """A 4-round FedAvg run on three SuperNodes (beating every 10 s, Flower's shortest
    accepted interval, so a lost node is declared after 20 s, not 60 s): SuperNode 2 is
    killed with SIGKILL after round 1 and restarted, with the same node config, once a round
    has counted it absent."""
    configs = [f"partition-id={i} num-partitions=3" for i in range(3)]
    deployment = Deployment(home / "flwr", configs)
    metrics = home / "run" / "metrics.csv"

    def rows() -> list[str]:
        return metrics.read_text().splitlines()[1:] if metrics.exists() else []

    try:
        run = deployment.start_run(
            f'out="{home / "run"}"', 'set="run.rounds=4 system.model=full algorithm.name=fedavg"'
        )
        deployment.wait_for(lambda: len(rows()) >= 1, 240)
        victim = deployment.procs[3]  # SuperNode 2 (the SuperLink is procs[0])
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        deployment.wait_for(lambda: any(r.endswith(",1") for r in rows()), 240)  # a round with one fault
        deployment.start_node(configs[2], "supernode2-restarted")
        output, _ = run.communicate(timeout=400)
    finally:
        deployment.stop()
    return {"home": home, "returncode": run.returncode, "output": output}


def test_a_superlink_and_three_supernodes_run_the_app_with_simulated_and_real_deadlines(tmp_path):
    """The example Flower App on real SuperNodes (each its own partition from its node
    config). On fedhet's simulated clock it gives the embedded engine's metrics for the same
    fedhet.toml. With system.model = "wall-clock" (a real 0.5 s deadline) SuperNode 2, made
    slow on purpose (node config layer-delay = 0.3 s per layer), delivers only the output
    layer, which SALF aggregates, while the fast ones deliver every layer."""
    from fedhet.config import load_config
    from fedhet.results import RunDirectory

    scenario = _deadlines_scenario(tmp_path)
    home, simulated, real = scenario["home"], scenario["simulated"], scenario["real"]
    assert (home / "run" / "summary.json").exists(), simulated.stdout[-3000:] + simulated.stderr[-2000:]
    embedded = RunLoop(load_config(APP / "fedhet.toml", ["run.rounds=1"]), home / "embedded").run()
    deployed = (home / "run" / "metrics.csv").read_text()
    assert deployed == (home / "embedded" / "metrics.csv").read_text()
    assert len(embedded.metrics) == 1

    assert (home / "wall" / "metrics.csv").exists(), real.stdout[-3000:] + real.stderr[-2000:]
    rows = RunDirectory(home / "wall").read_metrics()
    assert len(rows) == 2 and all(r["participants"] == 3 for r in rows)
    # depths 1, 1 and 3 (layers 3..3 of an MLP with 3 layers) in every round
    assert [r["mean_depth"] for r in rows] == pytest.approx([5 / 3] * 2)
    assert [r["sim_time"] for r in rows] == pytest.approx([0.5, 1.0])


def test_a_killed_supernode_is_absent_and_rejoins_when_restarted(tmp_path):
    """A SuperNode killed (SIGKILL) mid-run: the next round counts its client as absent (the
    SuperLink answers for the lost node; a line says so) and the run goes on with the others;
    restarted with the same node config, the node is found before the next round and its
    client delivers again. The run finishes all its rounds."""
    from fedhet.results import RunDirectory

    scenario = _kill_scenario(tmp_path)
    output = scenario["output"]
    assert scenario["returncode"] == 0, output[-3000:]
    table = RunDirectory(scenario["home"] / "run").read_metrics()
    assert len(table) == 4
    lost = [r for r in table if r["faults"]]
    assert lost and all(r["participants"] == 2 and r["faults"] == 1 for r in lost)
    assert table[-1]["participants"] == 3 and table[-1]["faults"] == 0  # rejoined
    assert "client 2 absent: its SuperNode is unavailable" in output
    assert "client 2: its SuperNode rejoined" in output


# --- experiment grids on Ray ----------------------------------------------------------------


def test_a_grid_on_a_local_ray_matches_the_local_runner_and_skips_finished_cells(tmp_path):
    import tomli_w

    from fedhet.results import RunDirectory
    from fedhet.studies.grid import load_experiment, run_experiment

    document = {k: dict(v) for k, v in BASE.items()}
    document["algorithm"] = {"name": "salf"}
    document["experiment"] = {"name": "raygrid", "jobs": 2}
    document["grid"] = {"run.seed": [1, 2], "algorithm.name": ["salf", "drop"]}
    path = tmp_path / "e.toml"
    path.write_text(tomli_w.dumps(document))
    experiment = load_experiment(path)
    on_ray = run_experiment(experiment, tmp_path / "ray", ray="local")
    local = run_experiment(experiment, tmp_path / "local", jobs=1)
    assert sorted(on_ray) == sorted(local) and len(on_ray) == 4
    for name in on_ray:
        mine = RunDirectory(tmp_path / "ray" / name).metrics_path.read_text()
        assert mine == RunDirectory(tmp_path / "local" / name).metrics_path.read_text()
    seen = []
    again = run_experiment(
        experiment, tmp_path / "ray", ray="local", on_cell=lambda c, s: seen.append(c.name)
    )
    assert sorted(seen) == sorted(on_ray) and again == on_ray  # nothing ran again


def test_a_command_of_several_flower_runs_starts_ray_once_and_stops_it(tmp_path):
    """A comparison of two runs on the Flower engine starts one local Ray for the command
    (one line says so and how long it took; each run says when its nodes answered), and
    the Ray is gone when the command ends."""
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "fedhet", "run", str(root / "examples" / "quickstart.toml"),
               "--engine", "flower", "--out", str(tmp_path / "q"), "--quiet",
               "--set", "run.time_budget=0.6", "--set", 'compare.algorithms=["salf", "drop"]']  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    starts = [line for line in done.stderr.splitlines() if "starting one local Ray" in line]
    ready = [line for line in done.stderr.splitlines() if "ready in" in line]
    answered = [line for line in done.stderr.splitlines() if "client nodes answered in" in line]
    assert len(starts) == 1 and len(ready) == 1 and len(answered) == 2, done.stderr
    host, port = ready[0].split("Ray at ")[1].split(" ")[0].rsplit(":", 1)
    with pytest.raises(OSError):  # the head's GCS no longer takes connections
        socket.create_connection((host, int(port)), timeout=5).close()
