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

from fedhet.checks import in_range, one_of
from fedhet.client.state import ComponentState
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate
from fedhet.registry import register

FLOAT_BYTES = 4


class Postprocessor:
    """Base: ``process`` returns the update to send (its ``vectors()`` changed in place or
    replaced through ``set_vector``), ``state`` being this postprocessor's part of the
    client's state; ``payload_bytes`` one vector's size on the wire given its element count
    and its size after the previous postprocessors (``incoming``)."""

    name = "base"

    def process(
        self, update: ClientUpdate, state: ComponentState, generator: torch.Generator
    ) -> ClientUpdate:
        raise NotImplementedError

    def payload_bytes(self, elements: int, incoming: int) -> int:
        return incoming


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
    """``max_norm`` C: the L2 bound of the update; ``noise_multiplier`` z: noise std z C."""

    max_norm: float = 1.0
    noise_multiplier: float = 0.0

    def validate(self) -> None:
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

    def process(self, update, state, generator):
        vectors = update.vectors()
        if update.delta.numel() == 0 or update.steps <= 0:
            return update
        clip, std = self.options.max_norm, self.options.noise_multiplier * self.options.max_norm
        whole = torch.cat([v.reshape(-1) for v in vectors.values()]) if len(vectors) > 1 else update.delta
        norm = float(whole.norm())  # the whole update's
        for key, vector in vectors.items():
            out = vector * min(1.0, clip / norm) if norm > 0 else vector.clone()
            if std > 0:
                noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)  # drawn on the host
                out.add_(noise.to(out.device), alpha=std)
            update.set_vector(key, out)
        return update


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

    def process(self, update, state, generator):
        if update.delta.numel() == 0 or update.steps <= 0:
            return update
        for key, vector in update.vectors().items():
            residual_key = self.RESIDUAL if key == "delta" else f"{self.RESIDUAL}.{key}"
            update.set_vector(key, self._compress(vector, state, residual_key, generator))
        return update

    def _compress(self, delta, state, key: str, generator) -> torch.Tensor:
        """One vector compressed, with its own error-feedback residual under ``key``."""
        residual = state.get(key) if self.options.error_feedback else None
        if residual is not None:
            residual = residual.to(delta.device)  # kept on the host between tasks
        covered = delta.numel()
        target = delta.clone()
        if residual is not None:  # kept aligned to the model's end: the output layer is always covered
            shared = min(residual.numel(), covered)
            target[covered - shared :] += residual[residual.numel() - shared :]
        sent = self._int8(target, generator) if self.options.method == "int8" else self._topk(target)
        if self.options.error_feedback:
            size = max(covered, 0 if residual is None else residual.numel())
            kept = delta.new_zeros(size)
            if residual is not None:
                kept[size - residual.numel() :] = residual  # layers not covered now keep theirs
            kept[size - covered :] = target - sent
            state[key] = kept
        return sent

    @staticmethod
    def _int8(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Unbiased stochastic rounding to the 255 levels -127..127 of one scale."""
        scale = float(values.abs().max()) / 127.0
        if scale == 0.0:
            return values.clone()
        scaled = values / scale
        low = torch.floor(scaled)
        draws = torch.rand(values.shape, generator=generator, dtype=values.dtype)  # on the host
        up = draws.to(values.device) < (scaled - low)
        return (low + up.to(values.dtype)).clamp_(-127, 127) * scale

    def _topk(self, values: torch.Tensor) -> torch.Tensor:
        k = min(self.kept(values.numel()), values.numel())
        index = torch.topk(values.abs(), k, sorted=False).indices
        out = torch.zeros_like(values)
        out[index] = values[index]
        return out


def generator_for(rng: np.random.Generator) -> torch.Generator:
    """A torch generator seeded from the client's own stream (after its training draws)."""
    return torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
