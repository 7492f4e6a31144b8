"""Build the simulated world of a run from its configuration: data, partition, model,
system model, algorithm, and the clients (their data, their state, the worker that runs their
tasks). Shared by every engine."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from fedhet import seeding
from fedhet.algorithms import Algorithm, AlgorithmContext, RunSetting
from fedhet.client import ClientData, LocalTrainer
from fedhet.config import Config
from fedhet.data import Dataset, open_dataset
from fedhet.data.partition import swap_labels
from fedhet.data.sources import split_validation, subsample
from fedhet.device import make_deterministic
from fedhet.errors import ConfigError
from fedhet.models import FlatModel, ModelContext
from fedhet.models.cost import multiply_adds, training_step_flops
from fedhet.registry import resolve
from fedhet.system import SystemContext, SystemModel
from fedhet.system.copula import population_latents
from fedhet.system.energy import PowerDraw
from fedhet.threads import choose_threads

log = logging.getLogger("fedhet")
_SAID: set[str] = set()  # notes said once per process


@dataclass
class World:
    """Everything a run needs besides its evolving state."""

    config: Config
    dataset: Dataset
    train_labels: torch.Tensor
    client_indices: list[np.ndarray]
    client_holdout: list[np.ndarray]  # each client's held-out examples (empty unless run.client_eval)
    flat: FlatModel
    initial_params: torch.Tensor
    initial_buffers: torch.Tensor
    system: SystemModel | None  # None in a worker process (client_side)
    algorithm: Algorithm
    worker: LocalTrainer
    layer_multiply_adds: tuple = ()  # per layer, multiply-adds per example
    server_optimizer: Any = None  # [server] optimizer: the step applied to every global update
    device: torch.device = torch.device("cpu")  # run.device, resolved: where the tensors live
    power: PowerDraw | None = None  # each client's power draw (the energy account); None client-side

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def server_system(self) -> SystemModel:
        """The system model, on the server side (a worker process's world has none)."""
        if self.system is None:
            raise RuntimeError("a client-side world has no system model")
        return self.system

    @property
    def server_power(self) -> PowerDraw:
        """The clients' power draws, on the server side (a worker process's world has none)."""
        if self.power is None:
            raise RuntimeError("a client-side world has no energy account")
        return self.power

    @cached_property
    def client_sizes(self) -> np.ndarray:
        """Every client's number of training examples."""
        return np.array([len(c) for c in self.client_indices])

    def client_data(self, client: int) -> ClientData:
        """Client ``client``'s own examples (an index array into the shared tensors)."""
        return ClientData(self.dataset.x_train, self.train_labels, self.client_indices[client])

    def setting(self, params: torch.Tensor | None = None, buffers: torch.Tensor | None = None) -> RunSetting:
        """What the algorithm may look at before round 1 (at the initial model by default);
        the engine adds the replies to its probe tasks."""
        config = self.config
        return RunSetting(
            num_clients=self.num_clients,
            num_params=int(self.initial_params.numel()),
            rounds=config.run.rounds,
            time_budget=config.run.time_budget,
            system=self.server_system,
            client_sizes=self.client_sizes,
            layout=self.flat.layout,
            params=self.initial_params if params is None else params,
            buffers=self.initial_buffers if buffers is None else buffers,
            layer_multiply_adds=self.layer_multiply_adds,
        )


def on_device(dataset: Dataset, device: torch.device) -> Dataset:
    """``dataset`` with its train and test tensors on ``device`` (its users' index stays)."""
    return dataclasses.replace(
        dataset,
        x_train=dataset.x_train.to(device),
        y_train=dataset.y_train.to(device),
        x_test=dataset.x_test.to(device),
        y_test=dataset.y_test.to(device),
    )


def as_feature_rows(dataset: Dataset, parts: list, holdout: list, labels: torch.Tensor):
    """The clients' training and held-out examples as rows of ``dataset.x_train`` (where a
    split chose the training examples as rows: :attr:`Dataset.train_rows`), and the
    training labels at those rows (rows no client has hold zeros), so that a client's data
    indexes the shared features and its labels alike."""
    rows = dataset.train_rows
    if rows is None:
        return parts, holdout, labels
    index = rows.numpy()
    at_rows = torch.zeros((int(dataset.x_train.shape[0]), *labels.shape[1:]), dtype=labels.dtype)
    at_rows[rows] = labels
    return [index[p] for p in parts], [index[h] for h in holdout], at_rows


def open_configured_dataset(config: Config) -> Dataset:
    """The dataset ``data.dataset`` names, as its plug-in loads it (kept in memory per
    process: a second call reads nothing)."""
    return open_dataset(config.data.entry("dataset").cls, config.data.options("dataset"))


def _check_whole_user_batches(config: Config, dataset: Dataset) -> None:
    """A dataset whose clients must each train on all their rows at once (the quadratic
    objectives' exact gradients) says, once, when the run breaks that."""
    rows = dataset.whole_user_batches
    natural = config.data.partition == "natural"
    if not rows or (natural and config.train.batch_size >= rows) or dataset.name in _SAID:
        return
    _SAID.add(dataset.name)
    log.warning(
        "dataset %r gives exact gradients only with data.partition = 'natural' and train.batch_size >= %d "
        "(a client's rows in one batch); data.partition = %r, train.batch_size = %d give sampled ones",
        dataset.name, rows, config.data.partition, config.train.batch_size,
    )  # fmt: skip


def _warn_if_swaps_alike(data: Any, clients: list[int]) -> None:
    """A label swap on every client with one and the same pair makes no client differ from
    another (it is label noise, not heterogeneity; with one client, trivially): said once."""
    pairs = {tuple(data.swap_pairs[c % len(data.swap_pairs)]) for c in clients}
    if data.swap_fraction == 0 or len(clients) < data.num_clients or len(pairs) > 1 or "swap-alike" in _SAID:
        return
    _SAID.add("swap-alike")
    log.warning(
        "data.swap_fraction = %g relabels the same pair %s on every one of the %d clients: no client differs "
        "from another (label noise, not heterogeneity); use data.swap_clients = 'second-half' or more "
        "data.swap_pairs",
        data.swap_fraction, next(iter(pairs)), data.num_clients,
    )  # fmt: skip


def build_partition(config: Config, dataset: Dataset) -> tuple[list[np.ndarray], torch.Tensor]:
    """Client index arrays and the (possibly label-swapped) training labels."""
    d = config.data
    rng = seeding.stream(config.run.seed, "data")
    labels = dataset.y_train.numpy()
    partitioner = d.entry("partition").cls.build(d.options("partition"), None)
    relabels = d.partition == "label-swap" or d.swap_fraction > 0
    if (partitioner.needs_labels or relabels) and not dataset.task.labels:
        what = f"data.partition = {d.partition!r}" if partitioner.needs_labels else "data.swap_fraction"
        raise ConfigError(
            f"{what} works on class labels; dataset {d.dataset!r} is a {dataset.task.name} task "
            "without them (use iid or natural)"
        )
    if d.num_clients > len(labels):
        raise ConfigError(f"data.num_clients = {d.num_clients}: more clients than {len(labels)} examples")
    parts = partitioner.split(dataset, d.num_clients, rng)
    _check_whole_user_batches(config, dataset)
    if relabels:
        for pair in d.swap_pairs:
            if max(pair) >= dataset.num_classes:
                raise ConfigError(
                    f"data.swap_pairs: {pair} has a label outside {d.dataset}'s 0..{dataset.num_classes - 1}"
                )
        clients = (
            range(d.num_clients) if d.swap_clients == "all" else range(d.num_clients // 2, d.num_clients)
        )
        if d.swap_fraction == 0 and "label-swap" not in _SAID:
            _SAID.add("label-swap")
            log.warning(
                "data.partition = 'label-swap' with data.swap_fraction = 0 swaps no label: the split "
                "is iid (FedStale's sigma_g^2 = 0); set data.swap_fraction to swap"
            )
        _warn_if_swaps_alike(d, list(clients))
        swapped = swap_labels(labels, parts, d.swap_fraction, d.swap_pairs, list(clients), rng)
        if d.swap_fraction > 0 and not np.any(swapped != labels):
            raise ConfigError(
                f"data.swap_fraction = {d.swap_fraction:g}: swaps no label on any of the {len(clients)} "
                f"swapping clients (data.swap_pairs = {d.swap_pairs}: round(swap_fraction x count) is 0 "
                "for every pair label on every such client); raise it or use fewer clients"
            )
        labels = swapped
    return parts, torch.from_numpy(np.ascontiguousarray(labels))


def hold_out(
    parts: list[np.ndarray], fraction: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices into the part it trains on and a held-out part of
    ``round(fraction x n)`` examples (at least one left to train on) for per-client
    evaluation; nothing is held out when ``fraction`` is 0."""
    if not fraction:
        return parts, [np.zeros(0, dtype=np.int64) for _ in parts]
    rng = seeding.stream(seed, "client-eval")
    train, held = [], []
    for indices in parts:
        shuffled = rng.permutation(indices)
        k = min(int(round(fraction * len(indices))), max(len(indices) - 1, 0))
        held.append(np.sort(shuffled[:k]))
        train.append(np.sort(shuffled[k:]))
    return train, held


def build_system(config: Config, num_clients: int, num_layers: int, measure=None,
                 client_sizes=None) -> SystemModel:  # fmt: skip
    """The configured system model (``system.model``, a plug-in) wrapped in its dropout,
    availability and participation plug-ins (``system.dropout``, ``system.availability``,
    ``system.participation``; "none" and "always" leave it as it is), then in the client
    selection (``[selection] rule``; "all" leaves it as it is)."""
    s = config.system
    latents = population_latents(s.device_correlation, config.run.seed, client_sizes)
    ctx = SystemContext(num_clients, num_layers, config.round_deadline, config.run.seed, measure,
                        client_sizes=client_sizes, latents=latents)  # fmt: skip
    model = s.entry("model").cls.build(s.options("model"), ctx)
    for section, slot in (("system", "dropout"), ("system", "availability"), ("system", "participation"),
                          ("selection", "rule")):  # fmt: skip
        ctx.base = model
        plugins = getattr(config, section)
        model = plugins.entry(slot).cls.build(plugins.options(slot), ctx)
    return model


def build_trainer(config: Config, flat: FlatModel, objective=None) -> LocalTrainer:
    """The local trainer of ``config``: its local optimizer and postprocessor chain, and the
    dataset's task (``objective``: its loss; classification by default)."""
    t = config.train
    optimizer = t.entry("optimizer").cls.build(t.options("optimizer"), None)
    chain = [entry.cls.build(options, None) for entry, options in t.postprocessors]
    return LocalTrainer(flat, optimizer, chain, objective)


def build_world(config: Config, client_side: bool = False, dataset: Dataset | None = None) -> World:
    """Load data, split it, build the model, system model, algorithm and the local worker.

    ``client_side``: only what answers client tasks (a worker process of a pool): no system
    model (nothing calibrated or timed) and torch's threads left as the caller set them.
    ``dataset``: the configured dataset already opened (:func:`open_dataset`), e.g. shared
    by the run with its worker processes."""
    if dataset is None:
        dataset = open_configured_dataset(config)
    dataset, pretraining = set_aside_for_pretraining(config, dataset)
    dataset = subsample(dataset, config.data.fraction, seeding.stream(config.run.seed, "data-fraction"))
    dataset = split_validation(
        dataset, config.data.validation_fraction, seeding.stream(config.run.seed, "validation")
    )
    check_targets(config, dataset.task)
    parts, train_labels = build_partition(config, dataset)
    parts, holdout = client_holdout(config, parts)
    parts, holdout, train_labels = as_feature_rows(dataset, parts, holdout, train_labels)
    device = config.run.torch_device
    make_deterministic(device)
    model = _build_model(config, dataset, pretraining)
    algorithm_entry = resolve("algorithm", config.algorithm_name, "algorithm.name")
    channels_last = check_memory_format(config, algorithm_entry.cls)
    layer_multiply_adds = tuple(multiply_adds(model, dataset.input_shape))  # on the CPU, before moving
    flat = FlatModel(model.to(device), channels_last=channels_last)
    if device.type != "cpu":  # the data's tensors beside the model (a CPU run keeps them as they are)
        dataset = on_device(dataset, device)
        train_labels = train_labels.to(device)
    step_flops = training_step_flops(layer_multiply_adds, config.train.batch_size)
    if not client_side:
        choose_threads(config.run.threads, step_flops)

    sizes = np.array([len(p) for p in parts])
    system = None if client_side else _system(config, flat, dataset, train_labels, len(parts), sizes)
    t = config.train
    algorithm = algorithm_entry.cls.build(config.algorithm.options, AlgorithmContext(t))
    worker = build_trainer(config, flat, dataset.task)
    return World(
        config=config, dataset=dataset, train_labels=train_labels, client_indices=parts,
        client_holdout=holdout, flat=flat, initial_params=flat.params.detach().clone(),
        initial_buffers=flat.buffers.detach().clone(), system=system, algorithm=algorithm,
        worker=worker, layer_multiply_adds=layer_multiply_adds, device=device,
        server_optimizer=server_optimizer(config, algorithm),
        power=None if client_side else power_draw(config, sizes),
    )  # fmt: skip


def set_aside_for_pretraining(config: Config, dataset: Dataset) -> tuple[Dataset, tuple | None]:
    """The training examples the model pre-trains a base on, centrally, set aside before the
    clients are formed (no client gets them; :meth:`fedhet.models.zoo.ZooModel.
    pretraining_share`): the dataset without them, and them as (x, y); None when the model
    pre-trains nothing."""
    share_of = getattr(config.model.entry("name").cls, "pretraining_share", None)
    share = share_of(config.model.options("name")) if share_of is not None else 0.0
    if not share:
        return dataset, None
    from fedhet.models.lora import held_out_share

    held = torch.from_numpy(held_out_share(dataset.num_train, share))
    keep = torch.ones(dataset.num_train, dtype=torch.bool)
    keep[held] = False
    return dataset.selected(keep.nonzero().squeeze(1)), (dataset.train_features(held), dataset.y_train[held])


def _build_model(config: Config, dataset: Dataset, pretraining: tuple | None):
    """The run's model: its pre-trained base first where it has one (a fixed stream:
    every seed the same base), then what the run's own initial stream draws."""
    entry, options = config.model.entry("name"), config.model.options("name")
    context = ModelContext(dataset.input_shape, dataset.num_classes)
    if pretraining is not None:
        context.pretrained = entry.cls.pretrain(options, context, *pretraining, dataset.task)
    torch.manual_seed(seeding.torch_seed(config.run.seed, "init"))
    return entry.cls.build(options, context)


def power_draw(config: Config, client_sizes: np.ndarray) -> PowerDraw:
    """Each client's power draw: its device's power columns where the system model's device
    profiles give them (the same assignment the model draws), else ``[system]``'s watts."""
    assign = getattr(config.system.options("model"), "devices", None)
    latents = population_latents(config.system.device_correlation, config.run.seed, client_sizes)
    speed = None if latents is None else latents.speed
    stream = seeding.stream(config.run.seed, "system-setup")
    devices = assign(len(client_sizes), stream, speed) if callable(assign) else None
    return PowerDraw.of(len(client_sizes), config.system.watts, devices)


def _system(config: Config, flat: FlatModel, dataset: Dataset, train_labels, num_clients: int,
            client_sizes=None):  # fmt: skip
    """The run's system model; ``measured`` calibrates itself on this host's model and data."""

    def measure():
        from fedhet.system.measured import calibrate

        return calibrate(config, flat, dataset.x_train, train_labels, loss_of=dataset.task.loss)

    return build_system(config, num_clients, flat.num_layers, measure, client_sizes)


def client_holdout(config: Config, parts: list) -> tuple[list, list]:
    """Each client's training indices and held-out indices (``run.client_eval``); refused in
    one line when the fraction holds out nothing anywhere."""
    parts, holdout = hold_out(
        parts, config.run.client_eval_fraction if config.run.client_eval else 0.0, config.run.seed
    )
    if config.run.client_eval and not any(len(held) for held in holdout):
        sizes = [len(p) + len(h) for p, h in zip(parts, holdout, strict=True)]
        raise ConfigError(
            f"run.client_eval_fraction = {config.run.client_eval_fraction:g}: holds out no example of any "
            f"client (clients hold {min(sizes)}-{max(sizes)} examples; a client keeps at least one to "
            "train on); raise it or set run.client_eval = false"
        )
    return parts, holdout


def check_memory_format(config: Config, algorithm_cls: type[Algorithm]) -> bool:
    """Whether conv weights are channels-last; refused for rules whose masks assume the
    contiguous order."""
    channels_last = config.run.memory_format == "channels_last"
    if channels_last and not algorithm_cls.supports_channels_last:
        raise ConfigError(
            f"run.memory_format = 'channels_last' with {config.algorithm_name}: its sub-model masks "
            "assume the contiguous weight order; use run.memory_format = 'contiguous'"
        )
    return channels_last


def check_targets(config: Config, task) -> None:
    """``run.targets`` are values of the task's score: an accuracy in (0, 1] for a
    classification; refused in one line naming the task otherwise."""
    if task.score != "accuracy":
        return
    for target in config.run.targets:
        if not 0 < target <= 1:
            raise ConfigError(
                f"run.targets: {target!r} is not an accuracy in (0, 1] (the dataset's task is {task.name}; "
                "a target is a value of its score)"
            )


def server_optimizer(config: Config, algorithm):
    """The server step of the run: ``[server]``'s optimizer, or the one the rule is a preset
    for (FedAdam: FedAvg with the adam step); both at once is refused in one line, and so is
    a rule's own ``server_lr`` beside a ``[server]`` optimizer (one server learning rate)."""
    chosen = config.server.entry("optimizer").cls.build(config.server.options("optimizer"), None)
    preset = algorithm.aggregation.preset_server_optimizer()
    if preset is None:
        own = getattr(config.algorithm.options, "server_lr", 1.0)
        if own != 1.0 and not chosen.is_identity:  # one server learning rate, set in one place
            raise ConfigError(
                f"algorithm.server_lr = {own:g} with [server] optimizer = {config.server.optimizer!r}: two "
                "server learning rates would multiply; set server.lr (and leave algorithm.server_lr at 1) "
                "or drop the [server] optimizer"
            )
        return chosen
    if not chosen.is_identity:
        raise ConfigError(
            f"algorithm.name = {config.algorithm.name!r} is FedAvg with the {preset.name!r} server "
            f"optimizer; [server] optimizer = {config.server.optimizer!r} would step twice: set one of them"
        )
    return preset
