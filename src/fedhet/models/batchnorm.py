"""Static BatchNorm (HeteroFL Sec. 3.1, "static batch normalization"): clients normalise
with the statistics of their own batches and never share running statistics; before the
global model is evaluated, the server recomputes every BatchNorm layer's running mean and
variance on the full model from training data, as a cumulative average over batches in
training mode (PyTorch's ``momentum=None``), so each layer's statistics are those of the
inputs it sees when the layers before it normalise their batches, as in training.
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.models.layers import FlatModel

BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def has_batchnorm(flat: FlatModel) -> bool:
    """Whether the model has a BatchNorm layer with running statistics."""
    return any(isinstance(m, BATCHNORMS) and m.track_running_stats for m in flat.model.modules())


@torch.no_grad()
def static_batchnorm_buffers(
    flat: FlatModel, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, batch_size: int = 256
) -> torch.Tensor:
    """The flat buffers of ``(params, buffers)`` with every BatchNorm's running mean and
    variance recomputed on the examples ``x`` (all other buffers unchanged): the cumulative
    average over batches of ``batch_size`` of the batch mean and unbiased batch variance."""
    if len(x) == 0:
        raise ValueError("static BatchNorm needs at least one example")
    flat.load(params, buffers)
    model = flat.model
    norms = [m for m in model.modules() if isinstance(m, BATCHNORMS) and m.track_running_stats]
    momenta = [m.momentum for m in norms]
    was_training = model.training
    try:
        for m in norms:
            m.reset_running_stats()  # in place: the flat buffer views stay
            m.momentum = None
        model.train()
        for start in range(0, len(x), batch_size):
            batch = x[start : start + batch_size]
            if len(batch) < 2 and start > 0:  # a last batch of one has no variance
                break
            model(batch)
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        model.train(was_training)
    return flat.buffers.clone()
