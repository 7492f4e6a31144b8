"""Real deadlines on real clients: the ``wall-clock`` system model.

The deadline is in real seconds. Nothing is sampled: every asked client is sent its task
with ``time_limit`` = the round's deadline, runs the forward pass, back-propagates layer by
layer from the output while the time left covers the next layer, and delivers the layers it
finished (:func:`fedhet.client.timed_first_step`). The round lasts the deadline.

No model gives the probabilities SALF's correction needs, so they are estimated from the
depths observed so far (:meth:`WallClock.observe`): client u's chance of reaching layer l is
the Laplace-smoothed share of its delivered updates that covered l,
r_ul = (#{rounds with d_u <= l} + 1) / (n_u + 2), and p_l = prod_u (1 - r_ul) treats clients
as independent (ADEL-FL Lemma 1's product form). Before any observation r_ul = 1/2.
"""

from __future__ import annotations

import numpy as np

from fedhet.registry import register
from fedhet.system.base import SystemContext, SystemModel
from fedhet.system.types import Marginals, Outcomes, Workload


@register("system_model")
class WallClock(SystemModel):
    """Clients meet a real deadline themselves; p_l estimated from observed depths."""

    name = "wall-clock"
    wall_clock = True

    @classmethod
    def build(cls, options, ctx: SystemContext) -> SystemModel:
        return cls(ctx.num_clients, ctx.num_layers, deadline=ctx.deadline)

    def __init__(self, num_clients: int, num_layers: int, deadline: float = 1.0):
        super().__init__(num_clients, num_layers)
        self.nominal_deadline = deadline
        self.observed = np.zeros(num_clients, dtype=np.int64)  # n_u: updates seen
        self.reached = np.zeros((num_clients, num_layers), dtype=np.int64)  # rounds with d_u <= l

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        deadline = work.deadline if work.deadline is not None else self.nominal_deadline
        time = np.full(self.num_clients, float(deadline))
        return Outcomes(self._everyone(), work.depth.copy(), time, time, work.local_steps.copy())

    def reach_estimate(self) -> np.ndarray:
        """r_ul, the Laplace-smoothed observed share of rounds in which u reached layer l."""
        return (self.reached + 1.0) / (self.observed[:, None] + 2.0)

    def marginals(self, work: Workload) -> Marginals:
        planned = (np.arange(1, self.num_layers + 1)[None, :] >= work.depth[:, None]).astype(float)
        reach = self.reach_estimate() * planned
        step = (np.arange(1, work.max_steps + 1)[None, :] <= work.local_steps[:, None]).astype(float)
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients), step)

    def observe(self, updates) -> None:
        layers = np.arange(1, self.num_layers + 1)
        for update in updates:
            self.observed[update.client] += 1
            self.reached[update.client] += (layers >= update.coverage.depth).astype(np.int64)

    def state_dict(self) -> dict:
        return {"observed": self.observed.tolist(), "reached": self.reached.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.observed = np.asarray(state["observed"], dtype=np.int64)
            self.reached = np.asarray(state["reached"], dtype=np.int64)
