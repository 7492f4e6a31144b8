"""What the server and a client say to each other: a :class:`ClientTask` out, a
:class:`ClientUpdate` back.

These two messages are the whole protocol between an algorithm's server side and its client
side. A client computes from its task, the global parameters it was sent, its own data, its
own state and its own random stream, and nothing else, so the same messages serve the
embedded engine (one process) and an engine that runs each client in another process.

Both convert to and from plain dicts of NumPy arrays, strings and numbers
(:meth:`ClientTask.to_dict`, :meth:`ClientTask.from_dict`): what a Flower ``RecordDict``
(``ArrayRecord`` + ``ConfigRecord``) can carry.

Coverage says which parameter elements the client trains: the layers ``depth..L`` (SALF's
partial back-propagation; depth 1 = every layer) and a width rate (1 = the whole width;
smaller rates are HeteroFL's sub-models).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

Payload = dict[str, Any]  # named tensors (float32) or scalars (int, float, str, bool)


@dataclass(frozen=True)
class Coverage:
    """Which parameter elements a client trains or delivered: layers ``depth..L`` at width
    rate ``width``, the kept units of each hidden layer of K starting at unit ``offset`` mod K
    (0: the leading ones, HeteroFL's; FedRolex rolls it). ``depth = L + 1`` covers nothing.
    ``full_layers`` k: layers 1..k keep their whole width and only the layers above are at
    ``width`` (SLT's configuration: layers below ``depth`` frozen, layer ``depth = k`` trained
    whole, the head above it at the rate); 0: every hidden layer at ``width`` (HeteroFL's).
    ``layers``: a bit set of the layers the client runs (bit l - 1 for layer l; FedRA's
    random allocation): the others are skipped in its forward pass and not trained; 0: all."""

    depth: int = 1
    width: float = 1.0
    offset: int = 0
    full_layers: int = 0
    layers: int = 0

    def region(self, layout) -> slice:
        """The flat slice of the covered parameters in ``layout`` (a ModelLayout)."""
        return layout.param_slices.from_depth(self.depth)

    def buffer_region(self, layout) -> slice:
        """The flat slice of the covered float buffers (BatchNorm statistics)."""
        return layout.buffer_slices.from_depth(self.depth)

    def is_full(self) -> bool:
        return self.depth == 1 and self.width == 1.0 and not self.layers

    def width_key(self) -> tuple[float, int, int, int]:
        """(width, offset, full_layers, layers): what decides the sub-model's elements
        (:func:`fedhet.models.width.width_mask`)."""
        return (float(self.width), int(self.offset), int(self.full_layers), int(self.layers))

    @property
    def masked(self) -> bool:
        """Whether the client holds part of the covered layers only (a width or a layer set)."""
        return self.width < 1.0 or bool(self.layers)

    def as_scalars(self) -> dict:
        """The coverage's fields as a message's scalars (``coverage.<field>``)."""
        return {
            "coverage.depth": self.depth,
            "coverage.width": float(self.width),
            "coverage.offset": int(self.offset),
            "coverage.full_layers": int(self.full_layers),
            "coverage.layers": int(self.layers),
        }

    @classmethod
    def from_scalars(cls, data: dict) -> Coverage:
        """The coverage a message's scalars carry (fields a message lacks take their defaults)."""
        return cls(int(data["coverage.depth"]), float(data["coverage.width"]),
                   int(data.get("coverage.offset", 0)), int(data.get("coverage.full_layers", 0)),
                   int(data.get("coverage.layers", 0)))  # fmt: skip


def _payload_to_dict(payload: Payload, prefix: str, arrays: dict, scalars: dict) -> None:
    for key, value in payload.items():
        if isinstance(value, torch.Tensor):
            arrays[f"{prefix}{key}"] = value.detach().cpu().numpy()
        elif isinstance(value, np.ndarray):
            arrays[f"{prefix}{key}"] = value
        elif isinstance(value, bool | int | float | str):
            scalars[f"{prefix}{key}"] = value
        else:
            raise TypeError(f"payload {key!r}: {type(value).__name__} cannot travel in a message")


def _payload_on(payload: Payload, device: torch.device) -> Payload:
    """``payload`` with its tensors on ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in payload.items()}


def _payload_from_dict(data: dict, prefix: str) -> Payload:
    out: Payload = {}
    for key, value in data.items():
        if key.startswith(prefix):
            name = key[len(prefix) :]
            out[name] = torch.from_numpy(np.array(value)) if isinstance(value, np.ndarray) else value
    return out


@dataclass
class ClientTask:
    """The server's instructions to one client for one round.

    ``local_steps`` and ``coverage`` are the work to do (the plan's assignment, cut to what
    the client's simulated outcome allows by the deadline); ``deadline`` is the round's
    (``None`` = no deadline); ``model_round`` is the round the sent parameters come from;
    ``kind`` is ``"train"`` or ``"probe"`` (gradient statistics, nothing trained);
    ``payload`` carries algorithm data such as SCAFFOLD's server control variate c;
    ``time_limit`` (wall-clock seconds, the ``wall-clock`` system model) lets the client cut
    its own work: it back-propagates layer by layer and delivers the layers it finished;
    ``work_share`` is the share of the plan's whole work (its time, upload included) this
    task costs the client: a sub-model's share of the full model's work (HeteroFL's width,
    DepthFL's depth), 1 for the planned work itself (the energy account charges it).
    """

    round: int
    client: int
    lr: float
    batch_size: int
    local_steps: int
    coverage: Coverage = field(default_factory=Coverage)
    deadline: float | None = None
    model_round: int = 0
    kind: str = "train"
    payload: Payload = field(default_factory=dict)
    time_limit: float | None = None
    work_share: float = 1.0

    def to_dict(self) -> dict:
        """A flat dict of NumPy arrays and scalars (``None`` deadline or time limit as NaN)."""
        scalars = {
            "round": self.round,
            "client": self.client,
            "lr": float(self.lr),
            "batch_size": self.batch_size,
            "local_steps": self.local_steps,
            **self.coverage.as_scalars(),
            "deadline": float("nan") if self.deadline is None else float(self.deadline),
            "model_round": self.model_round,
            "kind": self.kind,
            "time_limit": float("nan") if self.time_limit is None else float(self.time_limit),
            "work_share": float(self.work_share),
        }
        arrays: dict = {}
        _payload_to_dict(self.payload, "payload.", arrays, scalars)
        return {**scalars, **arrays}

    def to(self, device: torch.device) -> ClientTask:
        """This task with its payload's tensors on ``device`` (itself when they are there)."""
        if all(not isinstance(v, torch.Tensor) or v.device == device for v in self.payload.values()):
            return self
        return dataclasses.replace(self, payload=_payload_on(self.payload, device))

    @classmethod
    def from_dict(cls, data: dict) -> ClientTask:
        deadline = float(data["deadline"])
        time_limit = float(data.get("time_limit", float("nan")))
        return cls(
            round=int(data["round"]),
            client=int(data["client"]),
            lr=float(data["lr"]),
            batch_size=int(data["batch_size"]),
            local_steps=int(data["local_steps"]),
            coverage=Coverage.from_scalars(data),
            deadline=None if np.isnan(deadline) else deadline,
            model_round=int(data["model_round"]),
            kind=str(data["kind"]),
            payload=_payload_from_dict(data, "payload."),
            time_limit=None if np.isnan(time_limit) else time_limit,
            work_share=float(data.get("work_share", 1.0)),
        )


@dataclass
class ClientUpdate:
    """What one client sends back.

    ``delta`` is Delta_u = w_u - w_t over the covered parameter elements only (the flat
    region ``coverage.region(layout)``), ``delta_buffers`` likewise for float buffers;
    ``steps`` local steps were done on ``num_samples`` examples with mean training loss
    ``loss``; ``model_round`` is the round of the model the work started from; ``payload``
    carries algorithm data (e.g. SCAFFOLD's change of c_i, a probe's gradient statistics);
    ``wire`` names the payload tensors that are part of the update itself (the algorithm's
    :meth:`~fedhet.algorithms.parts.ClientPart.upload_payload`): the postprocessors process
    them with the delta and the upload's byte count includes them.
    """

    client: int
    coverage: Coverage
    steps: int
    num_samples: int
    loss: float
    delta: torch.Tensor
    delta_buffers: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    model_round: int = 0
    payload: Payload = field(default_factory=dict)
    wire: tuple[str, ...] = ()

    @property
    def depth(self) -> int:
        return self.coverage.depth

    def to(self, device: torch.device) -> ClientUpdate:
        """This update with its tensors on ``device`` (a Flower node's reply, on the
        server's device); the same object, changed in place."""
        self.delta = self.delta.to(device)
        self.delta_buffers = self.delta_buffers.to(device)
        self.payload = _payload_on(self.payload, device)
        return self

    def vectors(self) -> dict[str, torch.Tensor]:
        """The update's vectors as they travel: ``"delta"``, then each ``wire`` payload tensor."""
        return {"delta": self.delta, **{key: self.payload[key] for key in self.wire if key in self.payload}}

    def set_vector(self, key: str, value: torch.Tensor) -> None:
        """Replace one of :meth:`vectors` (a postprocessor's output)."""
        if key == "delta":
            self.delta = value
        else:
            self.payload[key] = value

    def summary(self) -> UpdateSummary:
        """The update without its tensors (what round metrics need)."""
        return UpdateSummary(
            self.client, self.coverage, self.steps, self.num_samples, self.loss, self.model_round
        )

    def to_dict(self) -> dict:
        scalars = {
            "client": self.client,
            **self.coverage.as_scalars(),
            "steps": self.steps,
            "num_samples": self.num_samples,
            "loss": float(self.loss),
            "model_round": self.model_round,
            "wire": ",".join(self.wire),
        }
        arrays = {
            "delta": self.delta.detach().cpu().numpy(),
            "delta_buffers": self.delta_buffers.detach().cpu().numpy(),
        }
        _payload_to_dict(self.payload, "payload.", arrays, scalars)
        return {**scalars, **arrays}

    @classmethod
    def from_dict(cls, data: dict) -> ClientUpdate:
        return cls(
            client=int(data["client"]),
            coverage=Coverage.from_scalars(data),
            steps=int(data["steps"]),
            num_samples=int(data["num_samples"]),
            loss=float(data["loss"]),
            delta=torch.from_numpy(np.array(data["delta"])),
            delta_buffers=torch.from_numpy(np.array(data["delta_buffers"])),
            model_round=int(data["model_round"]),
            payload=_payload_from_dict(data, "payload."),
            wire=tuple(key for key in str(data.get("wire", "")).split(",") if key),
        )


@dataclass(frozen=True)
class UpdateSummary:
    """A delivered update's scalars: kept for a round's metrics once its tensors are summed."""

    client: int
    coverage: Coverage
    steps: int
    num_samples: int
    loss: float
    model_round: int = 0

    @property
    def depth(self) -> int:
        return self.coverage.depth
