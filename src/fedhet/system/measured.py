"""Measured device times: the ``measured`` system model.

fedhet times each layer's forward and backward pass of the actual model at the configured
batch size on this host (:func:`measure_layer_times`: the median of repeated timed passes,
block by block, each block's backward its own ``autograd.grad`` call), then scales them per
client by its capability P_u (the capability profiles of the exponential model) and, with
``system.step_jitter`` = sigma > 0, by a per-round lognormal factor J ~ LogNormal(0, sigma).

A client's K local steps over layers d..L take
    time_u(d) = J K (sum_l F_l + sum_{l >= d} B_l) (S_u / S) / P_u
(F, B: the measured forward and backward times at batch S, S_u the client's batch): it
reaches the smallest d with time_u(d) <= deadline (L + 1 if none), finishes
floor(deadline / time of one full step) whole steps, and its full work ends at
time_u(1). Marginals: P[time_u(l) <= T] = Phi(log(T / time_u(l)|J=1) / sigma) (0 or 1
without jitter), clients independent (ADEL-FL Lemma 1's product form).

The times measured when a run starts are written to ``measured_times.json`` in its folder
and reused on resume; ``system.measured_times`` names such a file to reuse a calibration
(``fedhet calibrate CONFIG --out times.json``), which makes runs repeatable across hosts.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.checks import in_range, path_option
from fedhet.data.task import default_task
from fedhet.errors import ConfigError
from fedhet.registry import register
from fedhet.system.base import SystemContext, SystemModel
from fedhet.system.profiles import CapabilityOptions
from fedhet.system.types import Marginals, Outcomes, Workload

_CACHE: dict[tuple, dict] = {}


def measure_layer_times(model, x: torch.Tensor, y: torch.Tensor, repeats: int = 7, loss_of=None) -> dict:
    """Median forward and backward seconds of each layer (input to output) for the batch
    ``(x, y)``: two warm-up passes, then ``repeats`` timed ones. ``loss_of``: the task's
    loss (default cross-entropy), whose gradient back-propagation starts from."""
    from fedhet.models.exits import require_sequential

    require_sequential(model, "system.model = 'measured'")
    loss_of = loss_of or default_task().loss
    blocks = model.blocks
    forward = np.zeros((repeats, len(blocks)))
    backward = np.zeros((repeats, len(blocks)))
    model.train()
    for rep in range(repeats + 2):
        inputs, outputs, h = [], [], x
        for index, block in enumerate(blocks):
            inp = h.detach().requires_grad_(index > 0)
            start = time.perf_counter()
            out = block(inp)
            if rep >= 2:
                forward[rep - 2, index] = time.perf_counter() - start
            inputs.append(inp)
            outputs.append(out)
            h = out
        grad = torch.autograd.grad(loss_of(h, y), outputs[-1])[0]
        for index in reversed(range(len(blocks))):
            wanted = list(blocks[index].parameters()) + ([inputs[index]] if index > 0 else [])
            start = time.perf_counter()
            results = torch.autograd.grad(outputs[index], wanted, grad_outputs=grad)
            if rep >= 2:
                backward[rep - 2, index] = time.perf_counter() - start
            if index > 0:
                grad = results[-1]
    return {
        "batch_size": int(x.shape[0]),
        "threads": torch.get_num_threads(),
        "forward": np.median(forward, axis=0).tolist(),
        "backward": np.median(backward, axis=0).tolist(),
    }


def calibrate(config, flat, x_train: torch.Tensor, y_train: torch.Tensor, loss_of=None) -> dict:
    """The layer times for ``config``'s model and batch (cached per model, batch and threads
    in this process; read from ``system.measured_times`` when it names a file)."""
    if config.system.measured_times:
        return read_times(Path(config.system.measured_times), flat.num_layers)
    batch = config.train.batch_size
    key = (
        json.dumps(config.model.to_dict(), sort_keys=True, default=str),  # any model and its options
        tuple(x_train.shape[1:]),
        batch,
        torch.get_num_threads(),
    )
    if key not in _CACHE:
        generator = torch.Generator().manual_seed(0)
        chosen = torch.randint(0, len(x_train), (batch,), generator=generator)
        saved = flat.params.clone(), flat.buffers.clone()
        _CACHE[key] = measure_layer_times(flat.model, x_train[chosen], y_train[chosen], loss_of=loss_of)
        flat.load(*saved)
    return dict(_CACHE[key])


def read_times(path: Path, num_layers: int) -> dict:
    """A calibration file; one-line errors name it."""
    try:
        times = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"system.measured_times = {str(path)!r}: file not found") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"system.measured_times = {str(path)!r}: unreadable ({exc})") from None
    where = f"system.measured_times = {str(path)!r}"
    if not isinstance(times, dict):
        raise ConfigError(
            f"{where}: not a calibration (a JSON {type(times).__name__}; `fedhet calibrate` writes one)"
        )
    batch = times.get("batch_size")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"{where}: batch_size = {batch!r}: must be a whole number >= 1")
    for key in ("forward", "backward"):
        values = times.get(key)
        if not isinstance(values, list) or len(values) != num_layers:
            raise ConfigError(
                f"{where}: {key} must list {num_layers} times (one per layer), as `fedhet calibrate` writes"
            )
        for layer, value in enumerate(values, start=1):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(
                    f"{where}: {key} time of layer {layer} = {value!r}: must be finite seconds >= 0"
                )
    if not sum(times["forward"]) + sum(times["backward"]) > 0:
        raise ConfigError(f"{where}: every time is 0: rounds would take no simulated time")
    return times


@dataclass
class MeasuredOptions(CapabilityOptions):
    """``measured_times``: a calibration file to reuse (``fedhet calibrate --out``; empty =
    time the model when the run starts); ``step_jitter``: sigma of the per-round lognormal
    factor; ``comm_time`` and ``upload_bandwidth``: communication as in ``per-step`` (seconds
    per round, plus the update's bytes at that many bytes per second; 0 = free)."""

    measured_times: str = path_option()
    step_jitter: float = 0.0
    comm_time: float = 0.0
    upload_bandwidth: float = 0.0

    def validate(self) -> None:
        super().validate()
        in_range("system.step_jitter", self.step_jitter, 0.0, 10.0)
        if self.comm_time < 0:
            raise ConfigError(f"system.comm_time = {self.comm_time}: must be >= 0")
        if self.upload_bandwidth < 0:
            raise ConfigError(f"system.upload_bandwidth = {self.upload_bandwidth}: must be >= 0 (0 = free)")
        if self.capability_profile == "devices":
            raise ConfigError(
                "system.capability_profile = 'devices' with model = 'measured': measured times are "
                "this host's; device profiles give their own (use model = 'per-step' or 'exponential')"
            )


@register("system_model")
class MeasuredTimes(SystemModel):
    """Per-layer times measured on this host, scaled by each client's capability."""

    name = "measured"
    Options = MeasuredOptions

    @classmethod
    def build(cls, options: MeasuredOptions, ctx: SystemContext) -> SystemModel:
        if ctx.measure is None:
            raise ConfigError("system.model = 'measured' needs the model to time (build it with build_world)")
        caps = options.draw(ctx.num_clients, ctx.stream("system-setup"), ctx.speed)
        return cls(
            ctx.num_clients,
            ctx.num_layers,
            caps,
            ctx.measure(),
            jitter=options.step_jitter,
            comm_time=options.comm_time,
            upload_bandwidth=options.upload_bandwidth,
        )

    def __init__(
        self,
        num_clients: int,
        num_layers: int,
        capabilities: np.ndarray,
        times: dict,
        jitter: float = 0.0,
        comm_time: float = 0.0,
        upload_bandwidth: float = 0.0,
    ):
        super().__init__(num_clients, num_layers)
        self.comm_time = float(comm_time)
        self.upload_bandwidth = float(upload_bandwidth)
        self.capabilities = np.asarray(capabilities, dtype=float)
        self.times = times
        self.forward = float(np.sum(times["forward"]))
        backward = np.asarray(times["backward"], dtype=float)
        self.backward_from = np.array(
            [backward[l - 1 :].sum() for l in range(1, num_layers + 2)]
        )  # d = 1..L+1
        self.jitter = float(jitter)

    @property
    def deterministic(self) -> bool:
        return not self.jitter

    @property
    def times_pieces(self) -> bool:
        return True

    def _base_times(self, work: Workload) -> np.ndarray:
        """time_u(d) for d = 1..L+1 without jitter (U x (L+1))."""
        scale = (work.batch_sizes / self.times["batch_size"]) / self.capabilities
        per_step = (self.forward + self.backward_from)[None, :] * scale[:, None]
        return per_step * work.local_steps[:, None]

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        factor = (
            np.exp(self.jitter * rng.standard_normal(self.num_clients))
            if self.jitter
            else np.ones(self.num_clients)
        )
        comm = self.comm_times(work)
        times = self._base_times(work) * factor[:, None]
        full = times[:, 0] + comm
        step_time = times[:, 0] / work.local_steps
        pieces = self._piece_times(times, step_time, comm, work)
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, work.local_steps.copy(), *pieces,
                            comm_time=comm)  # fmt: skip
        spare = work.deadline - comm
        fits = times <= spare[:, None]  # U x (L+1), column d-1
        allowed = np.arange(1, self.num_layers + 2)[None, :] >= work.depth[:, None]
        depth = np.where(fits & allowed, np.arange(1, self.num_layers + 2)[None, :], self.num_layers + 1).min(
            axis=1
        )
        done = np.minimum(np.floor(np.maximum(spare, 0.0) / step_time), work.local_steps).astype(int)
        return Outcomes(self._everyone(), depth, full, np.minimum(full, work.deadline), done, *pieces,
                        comm_time=comm)  # fmt: skip

    def _piece_times(self, times, step_time, comm, work: Workload) -> tuple[np.ndarray, np.ndarray]:
        """Layer l is reached when K steps over l..L are done (``times[:, l-1]``), k whole
        steps after k full steps; the upload follows each."""
        L = self.num_layers
        layers = np.arange(1, L + 1)[None, :]
        layer_times = np.where(layers >= work.depth[:, None], times[:, :L] + comm[:, None], np.inf)
        k = np.arange(1, work.max_steps + 1)[None, :]
        step_times = np.where(k <= work.local_steps[:, None], k * step_time[:, None] + comm[:, None], np.inf)
        return layer_times, step_times

    def marginals(self, work: Workload) -> Marginals:
        L = self.num_layers
        base = self._base_times(work)[:, :L]  # layers 1..L
        if work.deadline is None:
            reach = (np.arange(1, L + 1)[None, :] >= work.depth[:, None]).astype(float)
            return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients))
        spare = np.maximum(work.deadline - self.comm_times(work), 0.0)
        reach = self._probability(spare[:, None] / base)
        reach = reach * (np.arange(1, L + 1)[None, :] >= work.depth[:, None])
        k = np.arange(1, work.max_steps + 1)[None, :]
        full_step = self._base_times(work)[:, 0] / work.local_steps
        step = self._probability(spare[:, None] / (k * full_step[:, None])) * (k <= work.local_steps[:, None])
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients), step)

    def comm_times(self, work: Workload) -> np.ndarray:
        """Seconds of communication per client this round: ``comm_time`` plus the upload of
        ``work.upload_bytes`` at ``upload_bandwidth`` (when both are set)."""
        comm = np.full(self.num_clients, self.comm_time)
        if self.upload_bandwidth and work.upload_bytes is not None:
            comm = comm + np.asarray(work.upload_bytes, float) / self.upload_bandwidth
        return comm

    def _probability(self, ratio: np.ndarray) -> np.ndarray:
        """P[J <= ratio] for J ~ LogNormal(0, sigma) (a step function without jitter)."""
        if not self.jitter:
            return (ratio >= 1.0).astype(float)
        from scipy.stats import norm

        return norm.cdf(np.log(np.maximum(ratio, 1e-300)) / self.jitter)

    def state_dict(self) -> dict:
        return {"times": self.times}

    def load_state_dict(self, state: dict) -> None:
        if state.get("times"):  # a resumed run keeps the times it started with
            MeasuredTimes.__init__(
                self,
                self.num_clients,
                self.num_layers,
                self.capabilities,
                state["times"],
                self.jitter,
                self.comm_time,
                self.upload_bandwidth,
            )

    def reports(self) -> dict[str, dict]:
        return {"measured_times": self.times}
