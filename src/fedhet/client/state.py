"""A client's own things: its data (an index array into the shared tensors) and its state
(named tensors kept between rounds: optimizer state, SCAFFOLD's c_i, FedDyn's g_i, ...).

A client's state is one flat mapping of tensors (it travels as such between processes and
in Flower's records), namespaced per component: the algorithm writes ``algorithm/<key>``,
the local optimizer ``optimizer/<key>``, each postprocessor ``<its name>/<key>``. Each
component sees only its own part, through a :class:`Namespace` view, so two components can
never overwrite each other's keys.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedhet.data.compact import Features
from fedhet.errors import FedhetError

ClientState = dict[str, torch.Tensor]  # a client's whole store: "<component>/<key>" -> tensor
ComponentState = MutableMapping[str, Any]  # one component's part of it (a Namespace)
SEPARATOR = "/"
ALGORITHM, OPTIMIZER = "algorithm", "optimizer"


class Namespace(MutableMapping[str, Any]):
    """One component's part of a client's state: key ``k`` is stored as ``"<name>/k"`` in
    the client's flat store; iteration, ``in``, ``get``, ``pop`` and ``update`` see this
    part only."""

    __slots__ = ("store", "prefix")

    def __init__(self, store: dict, name: str):
        self.store, self.prefix = store, name + SEPARATOR

    def __getitem__(self, key: str) -> Any:
        return self.store[self.prefix + key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.store[self.prefix + key] = value

    def __delitem__(self, key: str) -> None:
        del self.store[self.prefix + key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.prefix + key in self.store

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return iter([key[n:] for key in self.store if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for key in self.store if key.startswith(self.prefix))

    def __repr__(self) -> str:
        return f"Namespace({self.prefix[:-1]!r}, {dict(self)!r})"


def component_names(names: list[str]) -> list[str]:
    """The namespaces of a postprocessor chain: each one's name, numbered from its second
    occurrence (``compress``, ``compress.2``) so that two of a kind keep apart."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}.{seen[name]}")
    return out


def _namespaced(key: str) -> str:
    """A key of a store written before client state was namespaced, under its owner's
    namespace (optimizers wrote ``momentum`` and ``adam.*``, compression ``compress.*``)."""
    if SEPARATOR in key:
        return key
    if key == "momentum" or key.startswith("adam."):
        return OPTIMIZER + SEPARATOR + key
    if key.startswith("compress."):
        return "compress" + SEPARATOR + key
    return ALGORITHM + SEPARATOR + key


def check_serialisable(store: dict, client: int) -> None:
    """Every value of a client's state is a tensor (it is checkpointed and travels between
    processes and as Flower records): one line naming the component and key otherwise."""
    for key, value in store.items():
        if not isinstance(value, torch.Tensor):
            owner, _, name = key.rpartition(SEPARATOR)
            owners = {ALGORITHM: "the algorithm", OPTIMIZER: "the local optimizer"}
            by = owners.get(owner, f"postprocessor {owner}")
            raise FedhetError(
                f"client {client}: its state {name!r} (kept by {by}) is a {type(value).__name__}; client "
                "state must be tensors: it is checkpointed and travels between processes and in Flower "
                "messages"
            )


@dataclass
class ClientData:
    """One client's examples: its index array into the shared training tensors (no copy)."""

    x: Features  # the shared features (a float tensor, or images kept as bytes)
    y: torch.Tensor
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """The dataset indices of ``size`` examples drawn without replacement (all of them
        when fewer): what :meth:`batch` takes, for a caller that gathers many clients' batches
        at once."""
        return self.indices[rng.choice(len(self.indices), size=min(size, len(self.indices)), replace=False)]

    def batch(self, rng: np.random.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` examples drawn without replacement (all of them when fewer)."""
        chosen = torch.from_numpy(self.draw(rng, size))  # a tensor index: no per-element conversion
        if chosen.device != self.x.device:
            chosen = chosen.to(self.x.device)
        return self.x.index_select(0, chosen), self.y.index_select(0, chosen)  # faster than x[chosen]


class ClientStates:
    """Every client's own state (momentum buffers, SCAFFOLD's c_i, FedDyn's g_i, ...), kept
    between rounds and checkpointed with the run. A client sees only its own entry."""

    def __init__(self) -> None:
        self._states: dict[int, ClientState] = {}

    def of(self, client: int) -> ClientState:
        """Client ``client``'s state (created empty on first use)."""
        return self._states.setdefault(int(client), {})

    def park(self, client: int) -> None:
        """Client ``client``'s tensors on the host (RAM) between its tasks: a population's
        states (momentum buffers, SCAFFOLD's c_i: N x P numbers) need not fit the GPU; each
        component moves its own to the model's device when it uses them."""
        state = self._states.get(int(client))
        if state:
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    state[key] = value.cpu()

    def part(self, client: int, name: str) -> Namespace:
        """One component's part (``"algorithm"``, ``"optimizer"``, a postprocessor's name) of
        client ``client``'s state."""
        return Namespace(self.of(client), name)

    def state_dict(self) -> dict[int, ClientState]:
        return self._states

    def load_state_dict(self, states: dict[int, ClientState]) -> None:
        """Restore saved states (a store written before namespacing is moved under its
        components' namespaces)."""
        self._states = {int(k): {_namespaced(key): v for key, v in s.items()} for k, s in states.items()}
