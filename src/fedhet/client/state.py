"""A client's own things: its data (an index array into the shared tensors) and its state
(named tensors kept between rounds: optimizer state, SCAFFOLD's c_i, FedDyn's g_i, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.errors import FedhetError

ClientState = dict[str, torch.Tensor]


def check_serialisable(store: dict, client: int) -> None:
    """Every value of a client's state is a tensor (it is checkpointed and travels between
    processes and as Flower records): one line naming the component and key otherwise."""
    for key, value in store.items():
        if not isinstance(value, torch.Tensor):
            raise FedhetError(
                f"client {client}: its state {key!r} (kept by the algorithm, the local optimizer or a "
                f"postprocessor) is a "
                f"{type(value).__name__}; client state must be tensors: it is checkpointed and travels "
                "between processes and in Flower messages"
            )


@dataclass
class ClientData:
    """One client's examples: its index array into the shared training tensors (no copy)."""

    x: torch.Tensor
    y: torch.Tensor
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def batch(self, rng: np.random.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` examples drawn without replacement (all of them when fewer)."""
        chosen = self.indices[rng.choice(len(self.indices), size=min(size, len(self.indices)), replace=False)]
        return self.x[chosen], self.y[chosen]


class ClientStates:
    """Every client's own state (momentum buffers, SCAFFOLD's c_i, FedDyn's g_i, ...), kept
    between rounds and checkpointed with the run. A client sees only its own entry."""

    def __init__(self) -> None:
        self._states: dict[int, ClientState] = {}

    def of(self, client: int) -> ClientState:
        """Client ``client``'s state (created empty on first use)."""
        return self._states.setdefault(int(client), {})

    def state_dict(self) -> dict[int, ClientState]:
        return self._states

    def load_state_dict(self, states: dict[int, ClientState]) -> None:
        self._states = {int(k): dict(v) for k, v in states.items()}
