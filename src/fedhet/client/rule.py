"""A rule's client part, as the local trainer sees it (the trainer's argument type)."""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch

from fedhet.client.state import ComponentState as OwnState  # the algorithm's part of the state
from fedhet.messages import ClientTask, ClientUpdate


class ClientRule(Protocol):
    """A rule's client part (:class:`fedhet.algorithms.parts.ClientPart` satisfies it).
    ``corrects_gradients`` is False when :meth:`gradient_correction` always returns None;
    ``tracks_gradient_differences`` asks for :meth:`observe_gradients` at every step."""

    corrects_gradients: bool
    tracks_gradient_differences: bool
    customises_loss: bool
    selects_samples: bool
    starts_elsewhere: bool
    local_loss_per_client: ClassVar[bool]
    scales_sub_models: ClassVar[bool]

    def gradient_correction(
        self, task: ClientTask, state: OwnState, region: slice, local: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor | None: ...

    def local_loss(
        self,
        task: ClientTask,
        state: OwnState,
        model,
        x: torch.Tensor,
        y: torch.Tensor,
        depth: int,
        loss,
        rng,
    ) -> torch.Tensor: ...

    def select_samples(self, task: ClientTask, state: OwnState, losses, rng): ...

    def finish_local_work(
        self,
        task: ClientTask,
        update: ClientUpdate,
        state: OwnState,
        region: slice,
        local: torch.Tensor,
        anchor: torch.Tensor,
    ) -> None: ...

    def observe_gradients(
        self,
        task: ClientTask,
        state: OwnState,
        local_grad: torch.Tensor,
        anchor_grad: torch.Tensor,
        distance: float,
    ) -> None: ...

    def upload_payload(self, covered: int) -> dict[str, int]: ...

    def start_point(self, task: ClientTask, state: OwnState) -> torch.Tensor | None: ...
