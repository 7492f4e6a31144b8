"""The part of the model a task covers: layers ``depth..L`` (SALF's partial
back-propagation) at width rate ``width`` (HeteroFL's sub-models).

A :class:`CoverageView` gives the trainer everything about that part in one place: the
reached parameters to ask autograd for, their flat region, the width mask and the scaler
hooks of a sub-model, and the update over the covered elements at the end."""

from __future__ import annotations

import torch

from fedhet.models.layers import FlatModel
from fedhet.models.width import scaler_hooks, width_mask


class WidthMasks:
    """The flat parameter masks of sub-model rates, computed once per rate."""

    def __init__(self, flat: FlatModel):
        self.flat = flat
        self._masks: dict[tuple[float, int, int, int], torch.Tensor] = {}

    def __call__(self, rate: float, offset: int = 0, full_layers: int = 0, layers: int = 0) -> torch.Tensor:
        key = (rate, offset, full_layers, layers)
        if key not in self._masks:
            self._masks[key] = width_mask(self.flat.layout, *key).to(self.flat.device)
        return self._masks[key]


class CoverageView:
    """Layers ``depth..L`` of the working model at width ``rate`` (its units from ``offset``;
    layers 1..``full_layers`` whole).

    ``reached``: their parameters (autograd is asked for these only); ``region``: their
    flat values (a view into the working model); ``param_slice``/``buffer_slice``: where they
    sit in the flat vectors; ``mask``: the sub-model's elements (None at full width)."""

    def __init__(
        self,
        flat: FlatModel,
        depth: int,
        rate: float = 1.0,
        masks: WidthMasks | None = None,
        scale: bool = True,
        offset: int = 0,
        full_layers: int = 0,
        layers: int = 0,
    ):
        self.flat = flat
        self.scale = scale
        self.depth = depth
        self.rate = rate
        self.param_slice = flat.param_slices.from_depth(depth)
        self.buffer_slice = flat.buffer_slices.from_depth(depth)
        self.full_layers, self.layers = full_layers, layers
        masked = rate != 1.0 or layers
        self.mask = (masks or WidthMasks(flat))(rate, offset, full_layers, layers) if masked else None
        self.reached = flat.parameters_from_depth(depth)
        self.region = flat.params[self.param_slice]
        self._hooks: list = []

    def enter(self) -> None:
        """Before the steps: a sub-model zeroes the elements it does not hold and, with
        ``scale``, divides its hidden outputs by r (HeteroFL's scaler)."""
        if self.mask is not None:
            with torch.no_grad():
                self.flat.params.mul_(self.mask)
            ranked = bool(self.flat.layout.rank_axes)  # rank sub-models (LoRA) scale no output
            self._hooks = (
                scaler_hooks(self.flat.model, self.rate, self.full_layers)
                if self.scale and not ranked and self.rate != 1.0
                else []
            )
        if self.layers:  # FedRA: the layers outside the set are skipped in the forward pass
            count = self.flat.num_layers
            self.flat.model.skipped = frozenset(
                l for l in range(1, count + 1) if not self.layers >> (l - 1) & 1
            )

    def exit(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.flat.model.skipped = frozenset()

    def restrict(self, grad: torch.Tensor) -> torch.Tensor:
        """The gradient over the covered elements only (in place)."""
        if self.mask is not None:
            grad.mul_(self.mask)
        return grad

    def restrict_rows(self, grads: torch.Tensor) -> torch.Tensor:
        """A group's gradients (one row per client) over the covered elements only (in place)."""
        if self.mask is not None:
            grads.mul_(self.mask[self.param_slice])
        return grads

    @torch.no_grad()
    def deltas(self, params: torch.Tensor, buffers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_u - w_t over the covered elements, the covered buffers' change)."""
        delta = self.region - params[self.param_slice]
        if self.mask is not None:
            delta.mul_(self.mask[self.param_slice])  # elements outside the sub-model are not the client's
        return delta, self.flat.buffers[self.buffer_slice] - buffers[self.buffer_slice]
