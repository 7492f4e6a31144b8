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
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.errors import ConfigError
from fedhet.system.outcomes import Marginals, Outcomes, SystemModel, Workload

_CACHE: dict[tuple, dict] = {}


def measure_layer_times(model, x: torch.Tensor, y: torch.Tensor, repeats: int = 7) -> dict:
    """Median forward and backward seconds of each layer (input to output) for the batch
    ``(x, y)``: two warm-up passes, then ``repeats`` timed ones."""
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
        grad = torch.autograd.grad(F.cross_entropy(h, y), outputs[-1])[0]
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


def calibrate(config, flat, x_train: torch.Tensor, y_train: torch.Tensor) -> dict:
    """The layer times for ``config``'s model and batch (cached per model, batch and threads
    in this process; read from ``system.measured_times`` when it names a file)."""
    if config.system.measured_times:
        return read_times(Path(config.system.measured_times), flat.num_layers)
    batch = config.train.batch_size
    key = (
        config.model.name,
        tuple(config.model.hidden),
        tuple(x_train.shape[1:]),
        batch,
        torch.get_num_threads(),
    )
    if key not in _CACHE:
        generator = torch.Generator().manual_seed(0)
        chosen = torch.randint(0, len(x_train), (batch,), generator=generator)
        saved = flat.params.clone(), flat.buffers.clone()
        _CACHE[key] = measure_layer_times(flat.model, x_train[chosen], y_train[chosen])
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
    ok = (
        isinstance(times, dict)
        and all(len(times.get(k, [])) == num_layers for k in ("forward", "backward"))
        and all(isinstance(v, int | float) and v >= 0 for k in ("forward", "backward") for v in times[k])
        and isinstance(times.get("batch_size"), int)
        and times["batch_size"] >= 1
    )
    if not ok:
        raise ConfigError(
            f"system.measured_times = {str(path)!r}: needs batch_size and {num_layers} forward and backward "
            "times (seconds >= 0), as `fedhet calibrate` writes"
        )
    return times


class MeasuredTimes(SystemModel):
    """Per-layer times measured on this host, scaled by each client's capability."""

    name = "measured"

    def __init__(
        self, num_clients: int, num_layers: int, capabilities: np.ndarray, times: dict, jitter: float = 0.0
    ):
        super().__init__(num_clients, num_layers)
        self.capabilities = np.asarray(capabilities, dtype=float)
        self.times = times
        self.forward = float(np.sum(times["forward"]))
        backward = np.asarray(times["backward"], dtype=float)
        self.backward_from = np.array(
            [backward[l - 1 :].sum() for l in range(1, num_layers + 2)]
        )  # d = 1..L+1
        self.jitter = float(jitter)

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
        times = self._base_times(work) * factor[:, None]
        full = times[:, 0]
        if work.deadline is None:
            return Outcomes(self._everyone(), work.depth.copy(), full, full, work.local_steps.copy())
        fits = times <= work.deadline  # U x (L+1), column d-1
        allowed = np.arange(1, self.num_layers + 2)[None, :] >= work.depth[:, None]
        depth = np.where(fits & allowed, np.arange(1, self.num_layers + 2)[None, :], self.num_layers + 1).min(
            axis=1
        )
        step_time = full / work.local_steps
        done = np.minimum(np.floor(work.deadline / step_time), work.local_steps).astype(int)
        return Outcomes(self._everyone(), depth, full, np.minimum(full, work.deadline), done)

    def marginals(self, work: Workload) -> Marginals:
        L = self.num_layers
        base = self._base_times(work)[:, :L]  # layers 1..L
        if work.deadline is None:
            reach = (np.arange(1, L + 1)[None, :] >= work.depth[:, None]).astype(float)
            return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients))
        reach = self._probability(work.deadline / base)
        reach = reach * (np.arange(1, L + 1)[None, :] >= work.depth[:, None])
        k = np.arange(1, work.max_steps + 1)[None, :]
        full_step = self._base_times(work)[:, 0] / work.local_steps
        step = self._probability(work.deadline / (k * full_step[:, None])) * (k <= work.local_steps[:, None])
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients), step)

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
            self.__init__(self.num_clients, self.num_layers, self.capabilities, state["times"], self.jitter)

    def reports(self) -> dict[str, dict]:
        return {"measured_times": self.times}
