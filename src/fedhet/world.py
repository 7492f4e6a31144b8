"""Build the simulated world of a run from its configuration: data, partition, model,
system model, algorithm, and the clients (their data, their state, the worker that runs their
tasks). Shared by every engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet import seeding
from fedhet.algorithms import ALGORITHMS, Algorithm, RunSetting
from fedhet.client import ClientData, LocalWorker, SGDSettings
from fedhet.config import Config
from fedhet.data import Dataset, load_dataset, partition_indices
from fedhet.data.partition import swap_labels
from fedhet.data.sources import subsample
from fedhet.errors import ConfigError
from fedhet.models import FlatModel, build_model
from fedhet.models.cost import multiply_adds, training_step_flops
from fedhet.system import (
    BernoulliParticipation,
    CohortSampling,
    ExponentialLayers,
    NoStragglers,
    PerStepCost,
    StragglerRatio,
    SystemModel,
    UniformDepth,
    capabilities,
    participation_probabilities,
)
from fedhet.threads import choose_threads


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
    system: SystemModel
    algorithm: Algorithm
    worker: LocalWorker

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

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
            system=self.system,
            client_sizes=np.array([len(c) for c in self.client_indices]),
            layout=self.flat.layout,
            params=self.initial_params if params is None else params,
            buffers=self.initial_buffers if buffers is None else buffers,
        )


def build_partition(config: Config, dataset: Dataset) -> tuple[list[np.ndarray], torch.Tensor]:
    """Client index arrays and the (possibly label-swapped) training labels."""
    d = config.data
    rng = seeding.stream(config.run.seed, "data")
    labels = dataset.y_train.numpy()
    parts = partition_indices(labels, d.num_clients, d.partition, rng, d.alpha, d.shards_per_client)
    if d.partition == "label-swap" or d.swap_fraction > 0:
        for pair in d.swap_pairs:
            if max(pair) >= dataset.num_classes:
                raise ConfigError(
                    f"data.swap_pairs: {pair} has a label outside {d.dataset}'s 0..{dataset.num_classes - 1}"
                )
        clients = (
            range(d.num_clients) if d.swap_clients == "all" else range(d.num_clients // 2, d.num_clients)
        )
        labels = swap_labels(labels, parts, d.swap_fraction, d.swap_pairs, list(clients), rng)
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


def build_system(config: Config, num_clients: int, num_layers: int, measure=None) -> SystemModel:
    """The configured system model (see :mod:`fedhet.system`), wrapped in Bernoulli participation
    unless ``system.participation = "always"``."""
    s = config.system
    base = _build_straggler_model(config, num_clients, num_layers, measure)
    if s.availability == "trace":
        from fedhet.system.traces import TraceAvailability, read_trace

        base = TraceAvailability(base, read_trace(s.availability_trace, num_clients))
    if s.participation == "always":
        return base
    if s.participation == "cohort":
        return CohortSampling(base, s.cohort_size)
    probs = participation_probabilities(
        s.participation,
        num_clients,
        seeding.stream(config.run.seed, "participation-setup"),
        p_min=s.participation_min,
        low=s.participation_low,
        high=s.participation_high,
        values=s.participation_probs,
        group=s.participation_group,
    )
    return BernoulliParticipation(base, probs)


def _build_straggler_model(config: Config, num_clients: int, num_layers: int, measure=None) -> SystemModel:
    s = config.system
    setup_rng = seeding.stream(config.run.seed, "system-setup")
    if s.model == "full":
        return NoStragglers(num_clients, num_layers, deadline=config.round_deadline)
    if s.model == "wall-clock":
        from fedhet.system.wallclock import WallClock

        return WallClock(num_clients, num_layers, deadline=config.round_deadline)
    if s.model == "uniform-depth":
        return UniformDepth(num_clients, num_layers, deadline=config.round_deadline)
    if s.model == "straggler-ratio":
        return StragglerRatio(
            num_clients,
            num_layers,
            s.straggler_ratio,
            fixed_stragglers=s.fixed_stragglers,
            min_depth=s.straggler_min_depth,
            deadline=config.round_deadline,
            rng=setup_rng,
        )
    caps = capabilities(
        s.capability_profile,
        num_clients,
        setup_rng,
        low=s.capability_low,
        high=s.capability_high,
        mu=s.capability_mu,
        sigma=s.capability_sigma,
        values=s.capabilities,
    )
    if s.model == "per-step":
        return PerStepCost(
            num_clients, num_layers, caps, s.time_per_sample_step, comm_time=s.comm_time, jitter=s.step_jitter
        )
    if s.model == "measured":
        from fedhet.system.measured import MeasuredTimes

        if measure is None:
            raise ConfigError("system.model = 'measured' needs the model to time (build it with build_world)")
        return MeasuredTimes(num_clients, num_layers, caps, measure(), jitter=s.step_jitter)
    return ExponentialLayers(num_clients, num_layers, caps, s.time_per_sample_layer)


def build_world(config: Config) -> World:
    """Load data, split it, build the model, system model, algorithm and the local worker."""
    dataset = load_dataset(
        config.data.dataset, config.data.data_dir or None, config.data.label_mode, config.data.normalize
    )
    dataset = subsample(dataset, config.data.fraction, seeding.stream(config.run.seed, "data-fraction"))
    parts, train_labels = build_partition(config, dataset)
    parts, holdout = hold_out(
        parts, config.run.client_eval_fraction if config.run.client_eval else 0.0, config.run.seed
    )
    torch.manual_seed(seeding.torch_seed(config.run.seed, "init"))
    model = build_model(config.model.name, dataset.input_shape, dataset.num_classes, config.model.hidden)
    channels_last = config.run.memory_format == "channels_last"
    if channels_last and config.algorithm_name == "heterofl":
        raise ConfigError(
            "run.memory_format = 'channels_last' with heterofl: its sub-model masks assume the "
            "contiguous weight order; use run.memory_format = 'contiguous'"
        )
    flat = FlatModel(model, channels_last=channels_last)
    step_flops = training_step_flops(multiply_adds(model, dataset.input_shape), config.train.batch_size)
    choose_threads(config.run.threads, step_flops)

    def measure():
        from fedhet.system.measured import calibrate

        return calibrate(config, flat, dataset.x_train, train_labels)

    system = build_system(config, len(parts), flat.num_layers, measure)
    t = config.train
    algorithm = ALGORITHMS[config.algorithm_name](config.algorithm.options, t)
    worker = LocalWorker(flat, SGDSettings(t.momentum, t.weight_decay, t.keep_momentum))
    return World(
        config=config,
        dataset=dataset,
        train_labels=train_labels,
        client_indices=parts,
        client_holdout=holdout,
        flat=flat,
        initial_params=flat.params.detach().clone(),
        initial_buffers=flat.buffers.detach().clone(),
        system=system,
        algorithm=algorithm,
        worker=worker,
    )
