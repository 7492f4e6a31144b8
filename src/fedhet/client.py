"""Client work: K local SGD steps with truly truncated back-propagation.

One working model (a :class:`~fedhet.models.FlatModel`) serves every client: it is reloaded
from the global vectors in place before each client's work (DESIGN idea 5). A client with
depth d trains layers d..L only: the forward pass runs layers below d without a graph
(:meth:`LayeredModel.forward`), ``torch.autograd.grad`` is asked for the reached layers'
parameters only, and the SGD step touches only their flat region, so unreached layers get no
gradient, cost no backward compute and do not move (ALGORITHMS.md Sec. 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.models.layers import FlatModel


@dataclass
class LocalResult:
    """What one client's local work produced.

    ``delta_params`` covers the flat region of layers ``depth..L``
    (``param_slices.from_depth(depth)``), Delta_u = w_u - w_t there; likewise
    ``delta_buffers`` for float buffers. Both are empty when depth = L + 1.
    """

    client: int
    depth: int
    steps: int
    num_samples: int
    loss: float
    delta_params: torch.Tensor
    delta_buffers: torch.Tensor


@dataclass
class SGDSettings:
    """Plain minibatch SGD (PyTorch's conventions for momentum and weight decay)."""

    momentum: float = 0.0
    weight_decay: float = 0.0
    keep_momentum: bool = False  # per-client momentum buffers kept across rounds


class LocalTrainer:
    """Runs local SGD for any client over one reused working model.

    ``x``/``y`` are the whole training set (labels possibly relabelled per client by the
    partition); ``client_indices[u]`` is client u's index array into them.
    """

    def __init__(
        self,
        flat: FlatModel,
        x: torch.Tensor,
        y: torch.Tensor,
        client_indices: list[np.ndarray],
        sgd: SGDSettings | None = None,
    ):
        self.flat = flat
        self.x = x
        self.y = y
        self.client_indices = client_indices
        self.sgd = sgd or SGDSettings()
        self.momentum_buffers: dict[int, torch.Tensor] = {}

    @property
    def num_layers(self) -> int:
        return self.flat.num_layers

    def num_samples(self, client: int) -> int:
        return len(self.client_indices[client])

    def train(
        self,
        global_params: torch.Tensor,
        global_buffers: torch.Tensor,
        client: int,
        depth: int,
        steps: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
    ) -> LocalResult:
        """Run ``steps`` SGD steps of client ``client`` on layers ``depth..L``.

        Each step draws a batch of ``batch_size`` examples without replacement from the
        client's shard (all of it when the shard is smaller).
        """
        L = self.num_layers
        n = self.num_samples(client)
        pslice = self.flat.param_slices.from_depth(depth)
        bslice = self.flat.buffer_slices.from_depth(depth)
        if depth > L or steps <= 0:
            return LocalResult(client, depth, 0, n, float("nan"), torch.zeros(0), torch.zeros(0))
        self.flat.load(global_params, global_buffers)
        model = self.flat.model
        model.train()
        reached = self.flat.parameters_from_depth(depth)
        region = self.flat.params[pslice]
        buf = None
        if self.sgd.momentum:
            buf = self.momentum_buffers.get(client) if self.sgd.keep_momentum else None
        indices = self.client_indices[client]
        losses = []
        for _ in range(steps):
            batch = indices[rng.choice(n, size=min(batch_size, n), replace=False)]
            output = model(self.x[batch], depth)
            loss = F.cross_entropy(output, self.y[batch])
            grads = torch.autograd.grad(loss, reached)
            losses.append(float(loss.detach()))
            with torch.no_grad():
                grad = torch.cat([g.reshape(-1) for g in grads])
                if self.sgd.weight_decay:
                    grad.add_(region, alpha=self.sgd.weight_decay)
                if self.sgd.momentum:
                    if buf is None:
                        buf = torch.zeros_like(self.flat.params)
                        buf[pslice] = grad
                    else:
                        buf[pslice].mul_(self.sgd.momentum).add_(grad)
                    grad = buf[pslice]
                region.sub_(grad, alpha=lr)
        if buf is not None and self.sgd.keep_momentum:
            self.momentum_buffers[client] = buf
        with torch.no_grad():
            delta_params = region - global_params[pslice]
            delta_buffers = self.flat.buffers[bslice] - global_buffers[bslice]
        return LocalResult(client, depth, steps, n, float(np.mean(losses)), delta_params, delta_buffers)

    def gradient_statistics(
        self,
        global_params: torch.Tensor,
        global_buffers: torch.Tensor,
        client: int,
        batch_size: int,
        num_batches: int,
        rng: np.random.Generator,
    ) -> tuple[float, float]:
        """Full-depth minibatch gradients of ``client`` at the global model, for estimating
        ADEL-FL's A2/A3 constants.

        Draws ``num_batches`` batches of ``batch_size`` (with replacement across batches) and
        returns (mean ||g_b||^2, sigma^2), where sigma^2 = batch_size * (unbiased sample
        variance of the batch gradients): under A2 a batch of S has variance sigma^2 / S.
        The model is restored afterwards; nothing is trained.
        """
        if num_batches < 2:
            raise ValueError("gradient_statistics needs at least 2 batches for a variance")
        n = self.num_samples(client)
        size = min(batch_size, n)
        model = self.flat.model
        params = list(self.flat.parameters_from_depth(1))
        grads = []
        for _ in range(num_batches):
            self.flat.load(global_params, global_buffers)
            model.train()
            batch = self.client_indices[client][rng.choice(n, size=size, replace=False)]
            loss = F.cross_entropy(model(self.x[batch]), self.y[batch])
            grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        self.flat.load(global_params, global_buffers)
        stacked = torch.stack(grads).double()
        mean_sq_norm = float((stacked**2).sum(dim=1).mean())
        variance = float(((stacked - stacked.mean(0)) ** 2).sum(dim=1).sum() / (num_batches - 1))
        return mean_sq_norm, size * variance


@torch.no_grad()
def evaluate(
    flat: FlatModel,
    params: torch.Tensor,
    buffers: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 2048,
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of the model ``(params, buffers)`` on ``(x, y)``."""
    flat.load(params, buffers)
    model = flat.model
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        out = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        total_loss += float(F.cross_entropy(out, target, reduction="sum"))
        correct += int((out.argmax(1) == target).sum())
    return total_loss / len(y), correct / len(y)
