"""Stragglers that stay stragglers: each client's speed follows a two-state Markov chain
over rounds (fast <-> slow), as a phone on a weak network or a busy device tends to stay so
for a while. A fast client back-propagates every layer by the deadline; a slow one reaches
a depth uniform on 2..L+1.

The marginals the unbiased rules need are exact: given every client's state in the previous
round (the model's own draw), P[slow now] = ``stay_slow`` or ``become_slow``, so
P[u reaches l] = P[fast] + P[slow] (l - 1) / L and p_l = prod_u (1 - P[u reaches l]).

A fedhet system model is a class with a ``name``, an ``Options`` dataclass (its ``[system]``
keys besides ``model``), ``build(options, ctx)``, ``sample`` and ``marginals``; what it
learns across rounds goes in ``state_dict`` so that a resumed run continues the chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.errors import ConfigError
from fedhet.system import Marginals, Outcomes, SystemContext, SystemModel, Workload


@dataclass
class MarkovOptions:
    """``become_slow``: P[slow | fast before]; ``stay_slow``: P[slow | slow before]; the chain
    starts from its stationary share of slow clients."""

    become_slow: float = 0.1
    stay_slow: float = 0.8

    def validate(self) -> None:
        for key in ("become_slow", "stay_slow"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"system.{key} = {value}: must be in [0, 1]")


class MarkovStragglers(SystemModel):
    """Two-state (fast/slow) Markov chain per client; depth-only (the round lasts the
    deadline)."""

    name = "markov-stragglers"
    Options = MarkovOptions

    @classmethod
    def build(cls, options: MarkovOptions, ctx: SystemContext) -> MarkovStragglers:
        return cls(ctx.num_clients, ctx.num_layers, options, ctx.deadline, ctx.stream("markov-start"))

    def __init__(self, num_clients, num_layers, options: MarkovOptions, deadline: float, rng):
        super().__init__(num_clients, num_layers)
        self.options, self.deadline = options, deadline
        leave = options.become_slow + (1.0 - options.stay_slow)
        stationary = options.become_slow / leave if leave > 0 else 0.0
        self.slow = rng.random(num_clients) < stationary  # the state of the last round drawn
        self.previous = self.slow.copy()  # the state before it (what this round's marginals condition on)

    def slow_probability(self) -> np.ndarray:
        """P[slow this round | last round's state]."""
        return np.where(self.slow, self.options.stay_slow, self.options.become_slow)

    def sample(self, work: Workload, rng: np.random.Generator) -> Outcomes:
        L = self.num_layers
        chance = self.slow_probability()
        self.previous = self.slow
        self.slow = rng.random(self.num_clients) < chance
        depth = np.where(self.slow, rng.integers(2, L + 2, size=self.num_clients), 1)
        depth = np.maximum(depth, work.depth)
        clock = work.deadline if work.deadline is not None else self.deadline
        full = np.where(self.slow, 2.0 * clock, 0.5 * clock)
        if work.deadline is None:  # wait for everyone: all work is done, slow ones take longer
            return Outcomes(
                np.ones(self.num_clients, bool), work.depth.copy(), full, full, work.local_steps.copy()
            )
        done = np.where(depth == work.depth, work.local_steps, 0)
        return Outcomes(np.ones(self.num_clients, bool), depth, full, np.minimum(full, clock), done)

    def marginals(self, work: Workload) -> Marginals:
        L = self.num_layers
        was_slow = self.previous  # sample() already drew this round: condition on the round before
        slow = np.where(was_slow, self.options.stay_slow, self.options.become_slow)[:, None]
        layers = np.arange(1, L + 1)[None, :]
        reach = (1.0 - slow) + slow * (layers - 1) / L
        reach = reach * (layers >= work.depth[:, None])
        if work.deadline is None:
            reach = (layers >= work.depth[:, None]).astype(float)
        steps = (np.arange(1, work.max_steps + 1)[None, :] <= work.local_steps[:, None]) * reach[:, :1]
        return Marginals(reach, np.prod(1.0 - reach, axis=0), np.ones(self.num_clients), steps)

    def state_dict(self) -> dict:
        return {"slow": self.slow.tolist(), "previous": self.previous.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.slow = np.asarray(state["slow"], bool)
            self.previous = np.asarray(state["previous"], bool)
