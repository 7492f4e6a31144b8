"""Update postprocessors: a chain applied, in order, to each client's update before it is
sent (the shape of Flower's client mods and pfl-research's postprocessors).

A postprocessor is a ``postprocessor`` plug-in (:mod:`fedhet.registry`) listed in
``[train] postprocess = [{ name = "...", ...options }, ...]``. It changes the update's
vectors (``update.vectors()``: the ``delta`` and the payload tensors the algorithm sends as
part of the update, such as SCAFFOLD's control change; never the coverage), may keep state
in its own part of the client's state (its namespace, :mod:`fedhet.client.state`), and
declares the size each vector has on the wire (:meth:`Postprocessor.payload_bytes`): system
models with an ``upload_bandwidth`` charge the whole update's bytes as communication time, so
a compressed client really finishes sooner on the virtual clock.

- ``clip-noise``: scale the whole update (all its vectors together) to L2 norm at most
  ``max_norm``, then add Gaussian noise of standard deviation ``noise_multiplier * max_norm``
  to every element (the per-update clipping and noise of DP-FedAvg, McMahan et al.,
  arXiv:1710.06963; no privacy accounting is done here).
- ``compress``: each vector on its own: ``method = "int8"`` (one scale per vector, unbiased
  stochastic rounding to 255 levels: 1 byte per element + 4) or ``"topk"`` (the ``fraction``
  of elements largest in magnitude, as (index, value) pairs: 8 bytes each + 4), with optional
  error feedback (the part not sent is added to the next round's vector; Stich et al.,
  arXiv:1809.07599). The server receives the decompressed float32 values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fedhet.checks import in_range, one_of, resumable
from fedhet.client.state import ComponentState
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate
from fedhet.registry import register

FLOAT_BYTES = 4


class Postprocessor:
    """Base: :meth:`process_group` returns the updates of a group of clients to send, in
    their order (their ``vectors()`` changed in place or replaced through ``set_vector``),
    ``states`` being each client's part of its state for this postprocessor and
    ``generators`` each client's own torch generator; :meth:`process` is the same for one
    update. A postprocessor writes one of the two: the built-ins write the group's step (one
    vectorised computation over the group's rows, a group of one included); a plug-in that
    writes only :meth:`process` is applied to each update in turn. ``payload_bytes``: one
    vector's size on the wire given its element count and its size after the previous
    postprocessors (``incoming``)."""

    name = "base"

    def process_group(
        self, updates: list[ClientUpdate], states: list[ComponentState], generators: list[torch.Generator]
    ) -> list[ClientUpdate]:
        if type(self).process is Postprocessor.process:
            raise NotImplementedError(f"postprocessor {self.name}: write process or process_group")
        return [self.process(u, s, g) for u, s, g in zip(updates, states, generators, strict=True)]

    def process(
        self, update: ClientUpdate, state: ComponentState, generator: torch.Generator
    ) -> ClientUpdate:
        if type(self).process_group is Postprocessor.process_group:
            raise NotImplementedError(f"postprocessor {self.name}: write process or process_group")
        return self.process_group([update], [state], [generator])[0]

    def payload_bytes(self, elements: int, incoming: int) -> int:
        return incoming


def same_shapes(updates: list[ClientUpdate]) -> list[list[int]]:
    """The positions of the updates with local work, in groups whose vectors have the same
    keys and sizes (one group for a trainer's group of clients), each stacked as rows."""
    groups: dict[tuple, list[int]] = {}
    for i, update in enumerate(updates):
        if update.delta.numel() == 0 or update.steps <= 0:
            continue  # nothing computed: sent as it is
        shape = tuple((key, tuple(v.shape)) for key, v in update.vectors().items())
        groups.setdefault(shape, []).append(i)
    return list(groups.values())


def _rows(updates: list[ClientUpdate], rows: list[int], key: str) -> torch.Tensor:
    """Vector ``key`` of the updates at ``rows``, stacked (a new tensor)."""
    return torch.stack([updates[i].vectors()[key] for i in rows])


def _host_draws(draw, shape, dtype, generators: list[torch.Generator], device) -> torch.Tensor:
    """One ``draw`` (torch.rand or torch.randn) of ``shape`` per row from that row's own
    generator, on the host (a client's draws do not depend on its group), stacked."""
    return torch.stack([draw(shape, generator=g, dtype=dtype) for g in generators]).to(device)


def payload_bytes(chain: list[Postprocessor], elements: int, payload: Iterable[int] = ()) -> int:
    """Bytes of an update on the wire after the whole chain: its delta of ``elements``
    float32 values and each payload vector sent with it (``payload``: their element counts)."""
    total = 0
    for count in (int(elements), *(int(n) for n in payload)):
        size = FLOAT_BYTES * count
        for step in chain:
            size = step.payload_bytes(count, size)
        total += size
    return total


@dataclass
class ClipNoiseOptions:
    """``max_norm`` C: the L2 bound of the update; ``noise_multiplier`` z: noise std z C.
    With z > 0 the run accounts its privacy (:mod:`fedhet.engine.privacy`): epsilon at
    ``delta``, under the sampling reading ``accounting`` (no-amplification, poisson or
    without-replacement) in metrics.csv and against ``run.epsilon_budget``."""

    max_norm: float = 1.0
    noise_multiplier: float = 0.0
    delta: float = resumable(1e-5)
    accounting: str = resumable("no-amplification")

    def validate(self) -> None:
        in_range("train.postprocess: clip-noise delta", self.delta, 0.0, 1.0, low_open=True, high_open=True)
        one_of("train.postprocess: clip-noise accounting", self.accounting,
               ("no-amplification", "poisson", "without-replacement"))  # fmt: skip
        if not self.max_norm > 0:
            raise ConfigError(f"train.postprocess: clip-noise max_norm = {self.max_norm}: must be > 0")
        if self.noise_multiplier < 0:
            raise ConfigError(
                f"train.postprocess: clip-noise noise_multiplier = {self.noise_multiplier}: must be >= 0"
            )


@register("postprocessor")
class ClipNoise(Postprocessor):
    """Delta <- Delta min(1, C / ||Delta||) + N(0, (z C)^2 I), per update."""

    name = "clip-noise"
    Options = ClipNoiseOptions

    def __init__(self, options: ClipNoiseOptions):
        self.options = options

    @classmethod
    def build(cls, options: ClipNoiseOptions, ctx=None) -> ClipNoise:
        return cls(options)

    def process_group(self, updates, states, generators):
        """Each update (all its vectors together) scaled to L2 norm at most C, then noise
        N(0, (z C)^2) on every element: one stacked computation per group of equal shapes."""
        clip, std = self.options.max_norm, self.options.noise_multiplier * self.options.max_norm
        for rows in same_shapes(updates):
            keys = list(updates[rows[0]].vectors())
            stacked = {key: _rows(updates, rows, key) for key in keys}
            whole = torch.cat([v.reshape(len(rows), -1) for v in stacked.values()], dim=1)
            norms = torch.linalg.vector_norm(whole, dim=1).tolist()  # each update's whole norm
            factors = [min(1.0, clip / norm) if norm > 0 else 1.0 for norm in norms]
            scale = torch.tensor(factors, dtype=whole.dtype, device=whole.device)
            for key, out in stacked.items():
                out.mul_(scale.view(-1, *([1] * (out.dim() - 1))))
                if std > 0:
                    mine = [generators[i] for i in rows]
                    out.add_(_host_draws(torch.randn, out.shape[1:], out.dtype, mine, out.device), alpha=std)
                for j, i in enumerate(rows):
                    updates[i].set_vector(key, out[j])
        return updates


@dataclass
class CompressOptions:
    """``method``: "int8" or "topk"; ``fraction``: the share of elements top-k sends;
    ``error_feedback``: carry what was not sent into the client's next update."""

    method: str = "int8"
    fraction: float = 0.01
    error_feedback: bool = False

    def validate(self) -> None:
        one_of("train.postprocess: compress method", self.method, ("int8", "topk"))
        in_range("train.postprocess: compress fraction", self.fraction, 0.0, 1.0, low_open=True)


@register("postprocessor")
class Compress(Postprocessor):
    """8-bit or top-k compression of the update; the wire size follows the method."""

    name = "compress"
    Options = CompressOptions
    RESIDUAL = "compress.residual"

    def __init__(self, options: CompressOptions):
        self.options = options

    @classmethod
    def build(cls, options: CompressOptions, ctx=None) -> Compress:
        return cls(options)

    def kept(self, elements: int) -> int:
        """Top-k: the number of elements sent, ceil(fraction x elements), at least 1."""
        return max(1, math.ceil(self.options.fraction * elements))

    def payload_bytes(self, elements: int, incoming: int) -> int:
        if self.options.method == "int8":
            return elements + FLOAT_BYTES  # one byte per element and the scale
        return 2 * FLOAT_BYTES * min(self.kept(elements), elements) + FLOAT_BYTES  # (index, value) + count

    def process_group(self, updates, states, generators):
        """Each vector of each update compressed (``int8`` or ``topk``), after adding its
        error-feedback residual: one stacked computation per vector of a group of equal
        shapes; the residuals (which may cover other layers) are merged row by row."""
        for rows in same_shapes(updates):
            for key in updates[rows[0]].vectors():
                residual_key = self.RESIDUAL if key == "delta" else f"{self.RESIDUAL}.{key}"
                deltas = _rows(updates, rows, key)
                residuals = [self._residual(states[i], residual_key, deltas.device) for i in rows]
                targets = torch.stack([_plus_residual(d, r) for d, r in zip(deltas, residuals, strict=True)])
                mine = [generators[i] for i in rows]
                sent = self._int8(targets, mine) if self.options.method == "int8" else self._topk(targets)
                for j, i in enumerate(rows):
                    if self.options.error_feedback:
                        states[i][residual_key] = _kept(deltas[j], residuals[j], targets[j] - sent[j])
                    updates[i].set_vector(key, sent[j])
        return updates

    def _residual(self, state, key: str, device) -> torch.Tensor | None:
        """The client's error-feedback residual of one vector (kept on the host between tasks)."""
        residual = state.get(key) if self.options.error_feedback else None
        return None if residual is None else residual.to(device)

    @staticmethod
    def _int8(values: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """Unbiased stochastic rounding of each row to the 255 levels -127..127 of its own
        scale (max |value| / 127); a row of zeros is sent as it is."""
        peaks = values.reshape(len(values), -1).abs().amax(dim=1).tolist()
        scales = torch.tensor([peak / 127.0 for peak in peaks], dtype=values.dtype, device=values.device)
        scales = scales.view(-1, *([1] * (values.dim() - 1)))
        zero = scales == 0
        scaled = values / torch.where(zero, torch.ones_like(scales), scales)
        low = torch.floor(scaled)
        draws = _host_draws(torch.rand, values.shape[1:], values.dtype, generators, values.device)
        up = draws < (scaled - low)
        rounded = (low + up.to(values.dtype)).clamp_(-127, 127) * scales
        return torch.where(zero, values, rounded)

    def _topk(self, values: torch.Tensor) -> torch.Tensor:
        """Each row's ``fraction`` of elements largest in magnitude; the rest zero."""
        flat = values.reshape(len(values), -1)
        k = min(self.kept(flat.shape[1]), flat.shape[1])
        index = torch.topk(flat.abs(), k, dim=1, sorted=False).indices
        return torch.zeros_like(flat).scatter_(1, index, flat.gather(1, index)).reshape(values.shape)


def _plus_residual(delta: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """What a vector compresses: the delta plus its residual, aligned to the model's end
    (the output layer is always covered)."""
    target = delta.clone()
    if residual is not None:
        shared = min(residual.numel(), delta.numel())
        target[delta.numel() - shared :] += residual[residual.numel() - shared :]
    return target


def _kept(delta: torch.Tensor, residual: torch.Tensor | None, unsent: torch.Tensor) -> torch.Tensor:
    """The next residual: what was not sent now, and the old residual of layers not covered now."""
    covered = delta.numel()
    size = max(covered, 0 if residual is None else residual.numel())
    kept = delta.new_zeros(size)
    if residual is not None:
        kept[size - residual.numel() :] = residual
    kept[size - covered :] = unsent
    return kept


def generator_for(rng: np.random.Generator) -> torch.Generator:
    """A torch generator seeded from the client's own stream (after its training draws)."""
    return torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
