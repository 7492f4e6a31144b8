"""Work budgets: how much local work a client may do, given by the system side.

- :class:`SimulatedBudget`: the task's local steps over the layers it covers, as the system
  model's sampled outcome cut them (the virtual clock: nothing is timed here).
- :class:`WallClockBudget`: real seconds (the ``wall-clock`` system model): the client times
  its own work, back-propagates layer by layer while the time left covers the next layer
  (:func:`timed_first_step`), and takes further steps while one more fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from fedhet.data.task import default_task


@dataclass
class SimulatedBudget:
    """``steps`` local steps over layers ``depth..L``, decided before the work starts."""

    steps: int
    depth: int
    timed = False

    def allows_another_step(self) -> bool:
        return True

    def step_done(self, layers: int) -> None:
        pass


class WallClockBudget:
    """A wall-clock task's time: started now, ``limit`` seconds to deliver; on a device
    ``slowdown`` times slower than this host (each measured piece of work is followed by a
    sleep of ``slowdown - 1`` times its duration) plus ``layer_delay`` seconds per layer
    back-propagated."""

    def __init__(self, limit: float, slowdown: float = 1.0, layer_delay: float = 0.0):
        self.limit, self.slowdown, self.layer_delay = float(limit), float(slowdown), float(layer_delay)
        self.start = time.perf_counter()
        self.mark = self.start
        self.last_step = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def spend(self, seconds: float, layers: int = 1) -> float:
        """Make ``seconds`` of measured work last as long as on the slow device; returns the
        device time it took."""
        extra = (self.slowdown - 1.0) * seconds + self.layer_delay * layers
        if extra > 0:
            time.sleep(extra)
        return seconds + max(extra, 0.0)

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.limit

    def step_done(self, layers: int) -> None:
        now = time.perf_counter()
        self.spend(now - self.mark, layers)
        end = time.perf_counter()
        self.last_step, self.mark = end - self.mark, end

    def fits_another_step(self) -> bool:
        self.mark = time.perf_counter()
        return self.fits(self.last_step)

    timed = True

    def allows_another_step(self) -> bool:
        return self.fits_another_step()


def _timed_forward(blocks, x: torch.Tensor, depth: int, clock: WallClockBudget):
    """The forward pass block by block from layer ``depth``, each block's input detached (so
    that each layer's backward is its own call), each block timed: (inputs, outputs, the
    forward times spent on the clock)."""
    with torch.no_grad():
        for block in blocks[: depth - 1]:
            x = block(x)
    inputs, outputs, forward_times = [], [], []
    h = x.detach()
    for index, block in enumerate(blocks[depth - 1 :]):
        start = time.perf_counter()
        inp = h.detach().requires_grad_(index > 0)
        out = block(inp)
        forward_times.append(clock.spend(time.perf_counter() - start, 0))
        inputs.append(inp)
        outputs.append(out)
        h = out
    return inputs, outputs, forward_times


def timed_first_step(
    model, x: torch.Tensor, y: torch.Tensor, depth: int, clock: WallClockBudget, loss_of=None
):
    """One local step back-propagated layer by layer from the output, timing each layer and
    stopping before the deadline would pass (SALF on real hardware): returns the layer
    reached (``L + 1`` if not even the output layer fits) and ``(loss, gradients of the
    reached layers' parameters)`` or None.

    The forward pass runs block by block with each block's input detached, so that each
    layer's backward is its own ``autograd.grad`` call whose time is measured; a layer is
    started only if the time left covers its predicted time (the previous layer's measured
    backward time scaled by the two layers' forward times; the first from its forward time)."""
    from fedhet.models.exits import require_sequential

    require_sequential(model, "the wall-clock system model")
    blocks = model.blocks
    num_layers = len(blocks)
    inputs, outputs, forward_times = _timed_forward(blocks, x, depth, clock)
    loss = (loss_of or default_task().loss)(outputs[-1], y)  # the task's loss (fedhet.data.task)
    grad_out = torch.autograd.grad(loss, outputs[-1])[0]
    per_layer: dict[int, tuple] = {}
    estimate = 2.0 * forward_times[-1] + clock.layer_delay
    reached = num_layers + 1
    for index in reversed(range(len(outputs))):
        layer = depth + index
        if not clock.fits(estimate):
            break
        params = list(blocks[layer - 1].parameters())
        wanted = params + ([inputs[index]] if index > 0 else [])
        start = time.perf_counter()
        results = torch.autograd.grad(outputs[index], wanted, grad_outputs=grad_out)
        took = clock.spend(time.perf_counter() - start)
        per_layer[layer] = results[: len(params)]
        reached = layer
        if index > 0:
            grad_out = results[-1]
            ratio = forward_times[index - 1] / max(forward_times[index], 1e-9)
            estimate = (took - clock.layer_delay) * ratio + clock.layer_delay
    clock.mark, clock.last_step = time.perf_counter(), clock.elapsed()
    if reached > num_layers:
        return reached, None
    grads = tuple(g for layer in range(reached, num_layers + 1) for g in per_layer[layer])
    return reached, (loss, grads)
