"""The Flower engine: the same rounds as the embedded engine, with every client task sent as a
Flower ``Message`` to a ``ClientApp`` on its own SuperNode.

The ServerApp runs fedhet's run loop (:class:`~fedhet.engine.loop.RunLoop`: plan, system
model, virtual clock, aggregation, evaluation, checkpoints, run directory) with
:class:`FlowerPool` in place of the in-process pool. Each task travels as a ``RecordDict``:
a ``ConfigRecord`` ``"task"`` (the task's scalars), an ``ArrayRecord`` ``"model"`` (the
global parameters and buffers), an ``ArrayRecord`` ``"payload"`` (the algorithm's tensors,
e.g. SCAFFOLD's c) and an ``ArrayRecord`` ``"state"`` (the client's own state: momentum,
Adam's moments, c_i, g_i). The ClientApp loads its own partition (node config
``partition-id``), answers with the shared worker bootstrap
(:func:`~fedhet.engine.pool.bootstrap_worker`) and the client's own random stream, and
replies with its :class:`~fedhet.messages.ClientUpdate` (only the covered layers) and its
new state. The pool keeps every client's state on the server side, where the run's
checkpoint holds it, so a resumed Flower run continues with the same client states as an
uninterrupted one. Aggregation is fedhet's (Flower's FedAvg refuses replies whose arrays
differ).

A client whose reply does not arrive within the round's wall-clock timeout, or whose
SuperNode is gone (the SuperLink answers for a node that stopped or was killed), is absent
for that round (no update; ``participants`` and ``faults`` in metrics.csv say so, and a
line names the client and why); a ClientApp that raises stops the run or is absent, as
``run.on_client_error`` says. A SuperNode that (re)connects during the run is asked for its
partition before the next round and takes its client's tasks from then on, so a restarted
node rejoins.

The engine (:class:`FlowerEngine`, ``run.engine = "flower"``), its options
(:class:`FlowerOptions`, keys of ``[run]``) and its pool (:class:`FlowerPool`, built through
the registry like every pool, over the :class:`FlowerLink` the engine hands it) all live in
this module. Flower (``pip install 'fedhet[flower]'``) is imported only when this engine is
used.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.checks import in_range, resumable
from fedhet.client import ClientStates
from fedhet.config import Config
from fedhet.engine.client_errors import FaultLog, client_error_detail, client_failed
from fedhet.engine.launch import Engine, Launch, Placement
from fedhet.errors import ConfigError, FedhetError
from fedhet.messages import ClientTask, ClientUpdate
from fedhet.registry import NoOptions, register

log = logging.getLogger("fedhet")
say = logging.getLogger("fedhet.start")  # what is starting, shown by the command line

HELLO = "query.fedhet_hello"
TRAIN = "train"
QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def require_flower():
    """Import flwr or stop with one line saying how to install it."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise FedhetError(
            "run.engine = 'flower' needs Flower: pip install 'fedhet[flower]' (flwr[simulation]==1.41.0)"
        ) from None
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import flwr

    return flwr


# --- messages -------------------------------------------------------------------------


@dataclass
class FlowerOptions:
    """The Flower engine's keys of ``[run]``."""

    # wall-clock seconds to wait for the replies of a round (0 = no limit)
    round_timeout: float = resumable(0.0)
    flower_cpus_per_client: float = resumable(1.0)  # simulation: CPUs Ray reserves per client
    # simulation: the GPU share Ray reserves per client (0.1: 10 per GPU)
    flower_gpus_per_client: float = resumable(0.0)

    def validate(self) -> None:

        if self.round_timeout < 0:
            raise ConfigError(f"run.round_timeout = {self.round_timeout}: must be >= 0 (0 = no limit)")
        in_range("run.flower_cpus_per_client", self.flower_cpus_per_client, 0.0, 1024.0, low_open=True)
        in_range("run.flower_gpus_per_client", self.flower_gpus_per_client, 0.0, 1.0)
        if self.flower_gpus_per_client > 0:
            import torch

            if not torch.cuda.is_available():  # Ray would wait for a GPU forever
                raise ConfigError(
                    f"run.flower_gpus_per_client = {self.flower_gpus_per_client:g}: torch sees no GPU "
                    "here; set it to 0"
                )


@register("engine")
class FlowerEngine(Engine):
    """Flower's simulation runtime (Ray): one virtual SuperNode per client. The command's
    Flower runs share one local Ray (:mod:`fedhet.engine.flower_ray`), each taking all its
    CPUs, so a study runs its Flower runs one at a time and never as tasks of another Ray
    cluster."""

    name = "flower"
    Options = FlowerOptions
    placement = Placement(parallel=False, ray_task=False)

    def check(self, config: Config) -> None:
        super().check(config)
        require_flower()

    def pool_refusal(self, pool: str, engine: str) -> str:
        return (
            f"run.pool = {pool!r}: the flower engine sends each task to the client's node (its own "
            "pool); leave run.pool unset"
        )

    def run(self, config: Config, out_dir: str | Path, launch: Launch):
        if launch.client_order is not None or launch.stop_after is not None:
            raise ConfigError("run.engine = 'flower': client_order and stop_after are embedded-engine hooks")
        return run_simulation(
            config,
            out_dir,
            self.options,
            resume=launch.resume,
            overwrite=launch.overwrite,
            on_round=launch.on_round,
            group=launch.group,
            callbacks=launch.callbacks,
            engine=self.name,
        )


def flower_options(config: Config) -> FlowerOptions:
    """The Flower engine's options of ``config``; their defaults where the configuration
    names another engine (a deployed Flower App runs it on Flower all the same)."""
    options = config.run.options("engine")
    return options if isinstance(options, FlowerOptions) else FlowerOptions()


@dataclass
class FlowerLink:
    """What the Flower engine hands its pool (:class:`~fedhet.engine.pool.PoolContext`'s
    ``link``): the ``Grid``, the node serving each client, the round's reply timeout."""

    grid: Any
    nodes: dict[int, int]
    timeout: float | None


def _split(data: dict) -> tuple[dict, dict]:
    """Scalars (ConfigRecord values) and NumPy arrays (ArrayRecord values) of a flat dict."""
    scalars = {
        k: (v.item() if isinstance(v, np.generic) else v)
        for k, v in data.items()
        if not isinstance(v, np.ndarray)
    }
    arrays = {k: np.ascontiguousarray(v) for k, v in data.items() if isinstance(v, np.ndarray)}
    return scalars, arrays


def _array_record(arrays: dict):
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


def _arrays(record) -> dict:
    return {k: v.numpy() for k, v in record.items()}


def encode_task(task: ClientTask, params: torch.Tensor, buffers: torch.Tensor, state: dict | None = None):
    """A task, the global model and the client's state as a Flower ``RecordDict``."""
    from flwr.app import ConfigRecord, RecordDict

    scalars, arrays = _split(task.to_dict())
    model = {"params": params.detach().cpu().numpy()}
    if buffers.numel():
        model["buffers"] = buffers.detach().cpu().numpy()
    records = {"task": ConfigRecord(scalars), "model": _array_record(model)}
    if arrays:
        records["payload"] = _array_record(arrays)
    if state:
        records["state"] = _state_to_record(state)
    return RecordDict(records)


def decode_task(content) -> tuple[ClientTask, torch.Tensor, torch.Tensor, dict]:
    payload = _arrays(content["payload"]) if "payload" in content else {}
    model = _arrays(content["model"])
    task = ClientTask.from_dict({**dict(content["task"]), **payload})
    params = torch.from_numpy(model["params"].copy())
    buffers = torch.from_numpy(model["buffers"].copy()) if "buffers" in model else torch.zeros(0)
    state = _state_from_record(content["state"]) if "state" in content else {}
    return task, params, buffers, state


def encode_update(update: ClientUpdate, state: dict | None = None):
    from flwr.app import ConfigRecord, RecordDict

    scalars, arrays = _split(update.to_dict())
    records = {"update": ConfigRecord(scalars), "arrays": _array_record(arrays)}
    if state:
        records["state"] = _state_to_record(state)
    return RecordDict(records)


def decode_update(content) -> tuple[ClientUpdate, dict]:
    update = ClientUpdate.from_dict({**dict(content["update"]), **_arrays(content["arrays"])})
    state = _state_from_record(content["state"]) if "state" in content else {}
    return update, state


def _state_to_record(state: dict):
    """A client's state (named tensors) as the ArrayRecord kept in ``context.state``."""
    tensors = {k: v.detach().cpu().numpy() for k, v in state.items() if isinstance(v, torch.Tensor)}
    if len(tensors) != len(state):
        other = sorted(set(state) - set(tensors))
        raise TypeError(f"client state {other} is not made of tensors")
    return _array_record(tensors)


def _state_from_record(record) -> dict:
    return {k: torch.from_numpy(v.copy()) for k, v in _arrays(record).items()}


def _reason(reply) -> str:
    """The gist of an error reply: the exception's own message, one line."""
    reason = str(reply.error.reason)
    if "Message:" in reason:
        reason = reason.rsplit("Message:", 1)[1]
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return (lines[0] if lines else "unknown error")[:200]


# --- the ClientApp -----------------------------------------------------------------------


def partition_of(context) -> int:
    """The client index this node serves: its node config's ``partition-id``."""
    node_config = context.node_config
    if "partition-id" not in node_config:
        raise FedhetError("this SuperNode has no partition-id in its node config (--node-config)")
    return int(node_config["partition-id"])


def make_client_app(
    config: Config | Callable[[object], Config],
    fail_clients: tuple[int, ...] = (),
    delay_clients: dict[int, float] | None = None,
):
    """A ClientApp answering fedhet tasks for the run ``config`` (the configuration, or a
    function of the Flower context returning it); a client trains with the engine's
    ``run.flower_cpus_per_client`` threads. For tests of failures: ``fail_clients`` raise
    instead of training, ``delay_clients`` (partition -> seconds) sleep before replying."""
    delay_clients = dict(delay_clients or {})
    setup_of = _setup_of(config)
    require_flower()
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    from fedhet.engine.pool import bootstrap_worker

    app = ClientApp()

    @app.query("fedhet_hello")
    def hello(msg: Message, context) -> Message:
        return Message(RecordDict({"node": ConfigRecord({"partition": partition_of(context)})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context) -> Message:
        partition = partition_of(context)
        if partition in fail_clients:
            raise RuntimeError(f"ClientApp.train raised RuntimeError: client {partition} fails on purpose")
        if partition in delay_clients:
            time.sleep(delay_clients[partition])
        config_toml, cpus = setup_of(context)
        side = bootstrap_worker(config_toml, cores=cpus)
        task, params, buffers, state = decode_task(msg.content)
        if task.client != partition:
            raise FedhetError(f"task for client {task.client} sent to the node of partition {partition}")
        world = side.world
        world.worker.slowdown = float(context.node_config.get("slowdown", 1.0))  # wall-clock tasks
        world.worker.layer_delay = float(context.node_config.get("layer-delay", 0.0))
        try:
            update = side.execute(task, params, buffers, state)
        except FedhetError:
            raise
        except Exception as exc:  # the server reads where it was raised from the error's text
            raise RuntimeError(client_error_detail(exc)) from None
        return Message(encode_update(update, state), reply_to=msg)

    return app


def _client_setup(config: Config) -> tuple[str, int]:
    """What a client's worker is started with: the resolved configuration and its threads."""
    return config.to_toml(), max(1, int(flower_options(config).flower_cpus_per_client))


def _setup_of(config: Config | Callable[[object], Config]) -> Callable[[object], tuple[str, int]]:
    """A client's :func:`_client_setup` from its Flower context: computed once for a fixed
    configuration, per message for a deployed app's (read from its run config)."""
    if callable(config):
        return lambda context: _client_setup(config(context))
    fixed = _client_setup(config)
    return lambda context: fixed


# --- the server side -----------------------------------------------------------------------


@register("pool")
class FlowerPool:
    """A client pool over a Flower ``Grid``: one message per task to the node serving that
    client, carrying the client's state out and back; replies that are errors or late are
    absent clients (they yield no update and keep their state)."""

    name = "flower"
    Options = NoOptions
    engine = "flower"  # the pool of the flower engine, which builds it over its Grid

    @classmethod
    def build(cls, options, ctx):
        """The pool over the engine's :class:`FlowerLink` (``ctx.link``); refused without one."""
        link = getattr(ctx, "link", None)
        if not isinstance(link, FlowerLink):
            raise ConfigError(
                "run.pool = 'flower': Flower's pool runs on the flower engine (run.engine = 'flower')"
            )
        return cls(link.grid, link.nodes, link.timeout, ctx.config.run.on_client_error)

    def attach(self, world) -> None:
        """Nothing to attach: the clients' worlds are on their nodes."""

    def __init__(self, grid, nodes: dict[int, int], timeout: float | None, on_client_error: str = "stop"):
        self.grid = grid
        self.nodes = nodes  # client index -> node id
        self.timeout = timeout
        self.states = ClientStates()
        self.failures: list[tuple[int, int, str]] = []  # (round, client, why)
        self.on_client_error = on_client_error
        self.faults = FaultLog()
        self.asked: set[int] = set()  # nodes asked for their partition after the start

    def run(self, tasks: list[ClientTask], params, buffers):
        from flwr.app import Message

        self._rejoin()
        messages, sent = [], {}
        for task in tasks:
            state = self.states.of(task.client)
            message = Message(encode_task(task, params, buffers, state), self.nodes[task.client], TRAIN)
            messages.append(message)
            sent[task.client] = task
        replies = exchange(self.grid, messages, self.timeout)
        # a reply names the message it answers (the SuperLink answers for a node that is gone)
        by_message = {
            m.metadata.message_id: task.client
            for m, task in zip(messages, tasks, strict=True)
            if m.metadata.message_id  # set by the grid when it sent the message
        }
        updates: dict[int, ClientUpdate] = {}
        for reply in replies:
            client = by_message.get(reply.metadata.reply_to_message_id)
            if client is None:
                client = self._client_of(reply.metadata.src_node_id)
            if client is None:
                continue  # an answer to nothing this pool sent
            if reply.has_error() and _node_unavailable(reply):
                self._fail(sent, client, "its SuperNode is unavailable (stopped, killed or disconnected)")
                continue
            if reply.has_error():
                reason = _reason(reply)
                self.failures.append((sent[client].round, client, f"client error: {reason}"))
                detail = reason if " raised " in reason else f"the ClientApp raised: {reason}"
                client_failed(self, None, client, sent[client].round, detail)
                continue
            update, state = decode_update(reply.content)
            update.to(params.device)  # the node's arrays, on the server's device
            self.states.of(update.client).update(state)
            updates[update.client] = update
        failed = {c for _, c, _ in self.failures if c in sent}
        for client in sent:
            if client not in updates and client not in failed:
                self._fail(sent, client, "no reply within the round's timeout")
        for task in tasks:  # in task order
            if task.client in updates:
                yield updates.pop(task.client)

    def submit_evaluation(self, params, buffers) -> None:
        return None  # the server evaluates the global model itself

    def state_dict(self) -> dict:
        return self.states.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.states.load_state_dict(saved)

    def close(self) -> None:
        pass  # Flower's runtime owns the nodes

    def _client_of(self, node_id: int) -> int | None:
        return next((c for c, n in self.nodes.items() if n == node_id), None)

    def _rejoin(self) -> None:
        """Nodes that connected since the last round (a restarted SuperNode): asked once for
        their partition; a known partition moves to its new node."""
        known = set(self.nodes.values()) | self.asked
        fresh = [n for n in self.grid.get_node_ids() if n not in known]
        if not fresh:
            return
        self.asked.update(fresh)
        for partition, node_id in ask_partitions(self.grid, fresh, timeout=30).items():
            if partition in self.nodes and self.nodes[partition] != node_id:
                log.warning("client %d: its SuperNode rejoined (node %d)", partition, node_id)
                self.nodes[partition] = node_id

    def _fail(self, sent: dict, client: int, why: str) -> None:
        """A fault (a lost node, a late reply): the client is absent this round."""
        task = sent[client]
        self.failures.append((task.round, client, why))
        self.faults.add(task.round, client, why)


def exchange(grid, messages: list, timeout: float | None) -> list:
    """Push ``messages`` and pull their replies until every one is in or ``timeout`` seconds
    have passed (None: no limit): Flower's ``Grid.send_and_receive``, but polling every tenth
    of the time waited so far (between 0.05 and 0.5 s) where a deployment's grid waits a
    fixed 3 s between polls, so a round ends at most about 10% (or 0.05 s) after its last
    reply."""
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    replies: list = []
    while pending:
        arrived = list(grid.pull_messages(pending))
        replies.extend(arrived)
        pending.difference_update(m.metadata.reply_to_message_id for m in arrived)
        waited = time.monotonic() - start
        if not pending or (timeout is not None and waited >= timeout):
            break
        pause = min(max(waited / 10, 0.05), 0.5)
        time.sleep(pause if timeout is None else min(pause, timeout - waited))
    return replies


def ask_partitions(grid, node_ids: list[int], timeout: float) -> dict[int, int]:
    """partition-id -> node id of the nodes among ``node_ids`` that answer in time."""
    from flwr.app import Message, RecordDict

    asks = [Message(RecordDict(), node_id, HELLO) for node_id in node_ids]
    found = {}
    for reply in exchange(grid, asks, timeout):
        if not reply.has_error():
            found[int(reply.content["node"]["partition"])] = reply.metadata.src_node_id
    return found


def _node_unavailable(reply) -> bool:
    """Whether an error reply is the SuperLink's word that the node is gone."""
    from flwr.common.constant import ErrorCode

    return reply.error.code == ErrorCode.NODE_UNAVAILABLE


def discover_nodes(grid, num_clients: int, wait: float = 120.0) -> dict[int, int]:
    """Map client index -> node id by asking every connected node for its partition-id;
    waits (up to ``wait`` seconds) until ``num_clients`` distinct partitions answered."""

    deadline = time.monotonic() + wait
    nodes: dict[int, int] = {}
    while True:
        node_ids = [n for n in grid.get_node_ids() if n not in nodes.values()]
        if node_ids:
            nodes.update(ask_partitions(grid, node_ids, timeout=30))
        if all(c in nodes for c in range(num_clients)):
            return {c: nodes[c] for c in range(num_clients)}
        if time.monotonic() > deadline:
            missing = [c for c in range(num_clients) if c not in nodes]
            raise FedhetError(
                f"flower: {len(missing)} of {num_clients} partitions never connected (e.g. {missing[:5]})"
            )
        time.sleep(1.0)


def make_server_app(
    config,
    out_dir: str | Path,
    resume: bool = False,
    overwrite: bool = False,
    on_round: Callable[[dict], None] | None = None,
    outcome: dict | None = None,
    **loop_kwargs,
):
    """A ServerApp that runs ``config`` (or, if callable, ``config(context)`` returning
    ``(config, out_dir)``) with fedhet's round driver and Flower clients; the RunResult (or
    the error) is left in ``outcome``. ``loop_kwargs`` (``group``, ``callbacks``,
    ``engine``) go to the run loop."""
    require_flower()
    from flwr.serverapp import ServerApp

    app = ServerApp()
    outcome = {} if outcome is None else outcome

    @app.main()
    def main(grid, context) -> None:
        try:
            run_config, run_out = config(context) if callable(config) else (config, out_dir)
            progress = on_round
            if callable(config) and progress is None:  # a deployment: `flwr run --stream` shows it
                from fedhet.console import progress_printer

                progress = progress_printer(run_config, run_config.run.name)
            outcome["result"] = result = serve(
                grid, run_config, run_out, resume, overwrite, progress, **loop_kwargs
            )
            if callable(config):
                from fedhet.console import summary_table

                summary_table([result.summary], f"fedhet on Flower -> {result.path}")
        except BaseException as exc:  # reported by the caller, outside Flower's runtime
            outcome["error"] = exc
            if callable(config):  # a deployment: nobody else will report it
                log.error("fedhet: error: %s", exc)
                raise

    return app


def serve(grid, config, out_dir, resume=False, overwrite=False, on_round=None, **loop_kwargs):
    """Run ``config`` over the nodes of ``grid`` with fedhet's run loop and the Flower pool
    (``loop_kwargs``: ``group``, ``callbacks``, ``engine``)."""
    from fedhet.engine.loop import RunLoop

    begin = time.monotonic()
    nodes = discover_nodes(grid, config.data.num_clients)
    waited = time.monotonic() - begin
    say.info("flower: %s: %d client nodes answered in %.1f s", config.run.name, len(nodes), waited)
    link = FlowerLink(grid, nodes, flower_options(config).round_timeout or None)
    loop_kwargs.setdefault("engine", "flower")
    return RunLoop(config, out_dir, on_round=on_round, pool_link=link, **loop_kwargs).run(
        resume=resume, overwrite=overwrite
    )


def _app_config(app_dir: Path, context):
    """A deployed app's fedhet configuration: the file named by the run config's ``config``
    (relative to the app folder), with ``set`` overrides (``"run.rounds=3 train.lr=0.05"``)."""
    from fedhet.config import load_config

    run_config = context.run_config
    path = Path(str(run_config.get("config", "fedhet.toml")))
    path = path if path.is_absolute() else app_dir / path
    overrides = [item for item in str(run_config.get("set", "")).split() if item]
    return load_config(path, overrides)


def deployment_server_app(app_dir: str | Path):
    """The ServerApp of a Flower App folder (see ``examples/flower-app``): reads the fedhet
    configuration named in the run config and writes the run to ``out`` (run config; the
    default is ``runs/<run.name>`` under the SuperLink's working folder)."""

    def configure(context):
        config = _app_config(Path(app_dir), context)
        out = str(context.run_config.get("out", "")) or str(Path("runs") / config.run.name)
        return config, out

    return make_server_app(configure, "", overwrite=True)


def deployment_client_app(app_dir: str | Path):
    """The ClientApp of a Flower App folder: serves the partition of its SuperNode's
    ``--node-config "partition-id=..."`` for the configuration named in the run config."""
    return make_client_app(lambda context: _app_config(Path(app_dir), context))


def run_simulation(
    config,
    out_dir: str | Path,
    options: FlowerOptions | None = None,
    resume: bool = False,
    overwrite: bool = False,
    on_round: Callable[[dict], None] | None = None,
    fail_clients: tuple[int, ...] = (),
    delay_clients: dict[int, float] | None = None,
    **loop_kwargs,
):
    """Run ``config`` on Flower's simulation runtime (Ray backend): one virtual SuperNode per
    client, ``options.flower_cpus_per_client`` CPUs each (``options``: the engine's, by
    default the configuration's). Returns the RunResult. ``loop_kwargs`` (``group``,
    ``callbacks``, ``engine``) go to the run loop."""
    require_flower()
    options = options or flower_options(config)
    from flwr.simulation import run_simulation as flower_run_simulation

    from fedhet.engine.flower_ray import command_ray_address
    from fedhet.results import RunDirectory

    folder = RunDirectory(out_dir)  # its problems are one line now, not after Ray has started
    folder.prepare(resume=resume, overwrite=overwrite)
    folder.release()
    outcome: dict = {}
    server = make_server_app(config, out_dir, resume, overwrite, on_round, outcome, **loop_kwargs)
    client = make_client_app(config, fail_clients, delay_clients)
    backend: dict[str, Any] = {
        "client_resources": {
            "num_cpus": options.flower_cpus_per_client,
            "num_gpus": options.flower_gpus_per_client,
        },
        "init_args": {"log_to_driver": False, "include_dashboard": False, "address": command_ray_address()},
    }
    levels = {name: logging.getLogger(name).level for name in ("flwr", "ray")}
    for name in levels:  # Flower's deprecation notice and start-up lines
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        flower_run_simulation(server, client, num_supernodes=config.data.num_clients, backend_config=backend)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise FedhetError("flower: the simulation ended without a result (see Flower's log above)")
    return outcome["result"]
