"""Server rules with a memory of each client's last update: U-FedAvg, FedVARP, FedStale, MIFA
(FedStale eqs. (5), (7), (9)).

Sign: inside fedhet a client update is Delta_i = w_i - w_t (the paper writes w_t - w_i and
steps w - eta_s D); every rule below is the paper's with both signs flipped, so
w_{t+1} = w_t + eta_s D. The memory h_i holds client i's last delivered update (zeros at the
start) and costs N x P numbers on the server, reported in ``server_memory.json``; it is a
:class:`~fedhet.algorithms.memory.ClientMemory` (float32 or float16, in RAM or memory-mapped
on disk, checkpointed by journal: ``memory_dtype``, ``memory_storage``).

Client weights q_i are 1/N (``weights = "uniform"``) or n_i/n (``"samples"``). The
participation probability p_i is the probability that client i delivers a full update this
round, taken from the system model's marginals (``participation = "known"``: p_i times the
chance that a present client finishes) or estimated online by FedAU (``"fedau"``). A client
that is present but does not finish by the deadline counts as absent: these rules have no use
for partial updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedhet.algorithms.aggregation import layerwise_mean_buffers
from fedhet.algorithms.base import SERVER_LR_RANGE, Algorithm, RoundContext, RunSetting, register
from fedhet.algorithms.fedau import FedAUEstimator
from fedhet.algorithms.fedavg import FedAvgOptions
from fedhet.algorithms.memory import DTYPES, STORAGES, ClientMemory, persisted, restored
from fedhet.algorithms.memory import FOLDER as MEMORY_FOLDER
from fedhet.algorithms.parts import Aggregation, Reporting
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate

PARTICIPATION_KNOWLEDGE = ("known", "fedau")


@dataclass
class MemoryOptions(FedAvgOptions):
    """FedAvg's ``weights`` and ``server_lr``, plus how the memory h is kept:
    ``memory_dtype`` ("float32" or "float16", half the bytes) and ``memory_storage`` ("ram",
    or "disk": a memory-mapped file in the run folder, for N x P beyond RAM)."""

    memory_dtype: str = "float32"
    memory_storage: str = "ram"

    def validate(self) -> None:
        super().validate()
        if self.memory_dtype not in DTYPES:
            raise ConfigError(
                f"algorithm.memory_dtype = {self.memory_dtype!r}: must be 'float32' or 'float16'"
            )
        if self.memory_storage not in STORAGES:
            raise ConfigError(f"algorithm.memory_storage = {self.memory_storage!r}: must be 'ram' or 'disk'")

    @property
    def estimates_participation(self) -> bool:
        """Whether p_i is estimated online (FedAU) rather than known."""
        return False


@dataclass
class UnbiasedOptions(MemoryOptions):
    """Plus ``participation``: ``known`` (p_i from the system model) or ``fedau`` (estimated
    online with cutoff ``fedau_cutoff``, FedAU's K)."""

    participation: str = "known"
    fedau_cutoff: int = 50

    def validate(self) -> None:
        super().validate()
        if self.participation not in PARTICIPATION_KNOWLEDGE:
            raise ConfigError(f"algorithm.participation = {self.participation!r}: must be 'known' or 'fedau'")
        if self.fedau_cutoff < 1:
            raise ConfigError(f"algorithm.fedau_cutoff = {self.fedau_cutoff}: must be >= 1")

    @property
    def estimates_participation(self) -> bool:
        return self.participation == "fedau"


@dataclass
class FedStaleOptions(UnbiasedOptions):
    """Plus ``beta`` in [0, 1], the weight of stale updates (0 = U-FedAvg, 1 = FedVARP)."""

    beta: float = 0.5

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.beta <= 1.0:
            raise ConfigError(f"algorithm.beta = {self.beta}: must be in [0, 1]")


class MemoryAggregation(Aggregation):
    """The memory rules' aggregation: the memory h, client weights q, p_i (known or
    FedAU), and the round's direction D, which each rule's part defines (:meth:`direction`)."""

    refresh_before_direction = False  # MIFA refreshes h with this round's updates first

    def init_state(self, setting: RunSetting) -> dict:
        sizes = np.asarray(setting.client_sizes, dtype=np.float64)
        if self.options.weights == "samples":
            q = sizes / sizes.sum()
        else:
            q = np.full(setting.num_clients, 1.0 / setting.num_clients)
        folder = None if setting.work_dir is None else setting.work_dir / MEMORY_FOLDER
        memory = ClientMemory(
            setting.num_clients,
            setting.num_params,
            q,
            self.options.memory_dtype,
            self.options.memory_storage,
            folder,
        )
        state = {
            "memory": memory,
            "client_weight": q,
            "has_memory": np.zeros(setting.num_clients, dtype=bool),
            "participations": np.zeros(setting.num_clients, dtype=np.int64),
            "rounds": 0,
            "known_prob": None,
        }
        if self.options.estimates_participation:
            state["fedau"] = FedAUEstimator(setting.num_clients, self.options.fedau_cutoff).state_dict()
            state["estimate_history"] = []
        return state

    def state_dict(self, state: dict, work_dir: Path | None = None) -> dict:
        """The memory writes what changed since the last checkpoint into its files (the run
        folder's ``client-memory``) and is kept as the reference it returns (named with the
        class that reads it back)."""
        return {**state, "memory": persisted(state["memory"])}

    def load_state_dict(self, saved: dict, work_dir: Path | None = None) -> dict:
        """The memory rebuilt from its files as they were at the checkpoint."""
        return {**saved, "memory": restored(saved["memory"], work_dir, self.name)}

    def direction(
        self,
        memory: ClientMemory,
        updates: list[ClientUpdate],
        client_weight: np.ndarray,
        inverse_prob: np.ndarray,
    ) -> torch.Tensor:
        raise NotImplementedError

    def inverse_probabilities(
        self, state: dict, context: RoundContext, updates: list[ClientUpdate]
    ) -> np.ndarray:
        """1/p_i for this round: known (P[present and finished] from the marginals) or FedAU's
        omega_i. Also advances the FedAU estimator and the participation statistics."""
        delivered = np.zeros(context.num_clients, dtype=bool)
        delivered[[u.client for u in updates]] = True
        state["participations"] += delivered
        state["rounds"] += 1
        known = np.asarray(context.marginals.reach_prob[:, 0], dtype=np.float64)
        state["known_prob"] = known
        if "fedau" in state:
            estimator = FedAUEstimator.from_state(state["fedau"])
            inverse = estimator.observe(delivered)
            state["fedau"] = estimator.state_dict()
            state["estimate_history"].append(estimator.probability().tolist())
            return inverse
        with np.errstate(divide="ignore"):
            return np.where(known > 0, 1.0 / np.maximum(known, 1e-300), 0.0)

    def aggregate(self, params, buffers, updates, state, context, layout):
        """w_{t+1} = w_t + eta_s D, then h_i <- Delta_i for the participants (FedStale
        Algorithm 2); buffers are averaged over the participants."""
        full = [u for u in updates if u.coverage.is_full()]
        inverse = self.inverse_probabilities(state, context, full)
        memory = state["memory"]
        if self.refresh_before_direction:
            self._refresh(state, full)
        direction = self.direction(memory, full, state["client_weight"], inverse)
        if not self.refresh_before_direction:
            self._refresh(state, full)
        new_params = params.add(direction, alpha=self.options.server_lr)
        new_buffers = layerwise_mean_buffers(buffers, full, layout.buffer_slices) if full else buffers
        return new_params, new_buffers

    @staticmethod
    def _refresh(state: dict, updates: list[ClientUpdate]) -> None:
        for u in updates:
            state["memory"].set(u.client, u.delta)
            state["has_memory"][u.client] = True


class MemoryAlgorithmReporting(Reporting):
    """The memory rules' report: participation estimates and memory use."""

    def reports(self, state: dict) -> dict[str, dict]:
        memory = state["memory"]
        out = {
            "server_memory": {
                "clients": memory.num_clients,
                "floats_per_client": memory.num_params,
                "dtype": memory.dtype,
                "storage": memory.storage,
                "bytes": memory.nbytes,
                "megabytes": round(memory.nbytes / 2**20, 3),
                "clients_stored": int(state["has_memory"].sum()),
            }
        }
        rounds = max(int(state["rounds"]), 1)
        participation = {
            "rounds": int(state["rounds"]),
            "participations": state["participations"].tolist(),
            "observed_rate": (state["participations"] / rounds).tolist(),
        }
        if state["known_prob"] is not None:
            participation["known_prob"] = np.asarray(state["known_prob"]).tolist()
        if "fedau" in state:
            estimator = FedAUEstimator.from_state(state["fedau"])
            participation["fedau_cutoff"] = estimator.cutoff
            participation["fedau_estimate"] = estimator.probability().tolist()
            participation["fedau_estimate_history"] = state["estimate_history"]
            if state["known_prob"] is not None:
                error = np.abs(estimator.probability() - np.asarray(state["known_prob"]))
                participation["fedau_mean_abs_error"] = float(error.mean())
        out["participation"] = participation
        return out


class MemoryAlgorithm(Algorithm):
    """Shared machinery: the memory h, client weights q, p_i (known or FedAU), reports.

    Subclasses implement :meth:`direction` (the aggregate D of one round)."""

    Options = MemoryOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": SERVER_LR_RANGE}
    partial_work = "none"  # unfinished by the deadline: counts as absent, so not asked
    Aggregation = MemoryAggregation
    Reporting = MemoryAlgorithmReporting


def _step(client_weight: np.ndarray, inverse_prob: np.ndarray, client: int) -> float:
    """q_i / p_i, the weight of a fresh update."""
    return float(client_weight[client] * inverse_prob[client])


def _stale_sum(memory: ClientMemory, client_weight: np.ndarray) -> torch.Tensor:
    """sum_i q_i h_i over all N clients (kept up to date by the memory as rows change)."""
    return memory.stale_sum()


class UFedAvgAggregation(MemoryAggregation):
    """U-FedAvg's direction D over the memory."""

    def direction(self, memory, updates, client_weight, inverse_prob):
        out = torch.zeros(memory.num_params)
        for u in updates:
            out.add_(u.delta, alpha=_step(client_weight, inverse_prob, u.client))  # eq. (5)
        return out


class FedVARPAggregation(MemoryAggregation):
    """FedVARP's direction D over the memory."""

    def direction(self, memory, updates, client_weight, inverse_prob):
        out = _stale_sum(memory, client_weight)
        for u in updates:
            fresh = u.delta - memory.row(u.client)
            out.add_(fresh, alpha=_step(client_weight, inverse_prob, u.client))  # eq. (7)
        return out


class FedStaleAggregation(MemoryAggregation):
    """FedStale's direction D over the memory."""

    def direction(self, memory, updates, client_weight, inverse_prob):
        beta = self.options.beta
        out = beta * _stale_sum(memory, client_weight)
        for u in updates:
            fresh = u.delta - beta * memory.row(u.client)
            out.add_(fresh, alpha=_step(client_weight, inverse_prob, u.client))  # eq. (9)
        return out


class MIFAAggregation(MemoryAggregation):
    """MIFA's direction D over the memory."""

    refresh_before_direction = True

    def direction(self, memory, updates, client_weight, inverse_prob):
        return _stale_sum(memory, client_weight)


@register
class UFedAvg(MemoryAlgorithm):
    """Unbiased FedAvg (FedStale eq. (5)): D = sum_{i in S_t} q_i Delta_i / p_i."""

    name = "u-fedavg"
    summary = "FedAvg reweighted by 1/p_i, unbiased under heterogeneous participation (FedStale eq. 5)"
    Options = UnbiasedOptions
    Aggregation = UFedAvgAggregation


@register
class FedVARP(MemoryAlgorithm):
    """FedVARP (FedStale eq. (7)): D = sum_i q_i h_i + sum_{i in S_t} q_i (Delta_i - h_i) / p_i."""

    name = "fedvarp"
    summary = "stale updates of absent clients as control variates (FedStale eq. 7)"
    Options = UnbiasedOptions
    Aggregation = FedVARPAggregation


@register
class FedStale(MemoryAlgorithm):
    """FedStale (FedStale eq. (9)):
    D = beta sum_i q_i h_i + sum_{i in S_t} q_i (Delta_i - beta h_i) / p_i.

    beta = 0 is U-FedAvg, beta = 1 is FedVARP; for every beta, E[D] over participation draws
    is sum_i q_i Delta_i (unbiased)."""

    name = "fedstale"
    summary = "convex mix of fresh and stale updates, weight beta on stale (FedStale eq. 9)"
    Options = FedStaleOptions
    hyperparameters: ClassVar[dict[str, dict]] = {
        **MemoryAlgorithm.hyperparameters,
        "beta": {"low": 0.0, "high": 1.0},
    }
    Aggregation = FedStaleAggregation


@register
class MIFA(MemoryAlgorithm):
    """MIFA: refresh h_i with the participants' updates, then D = sum_i q_i h_i over all N
    clients (biased towards stale updates; no participation probabilities)."""

    name = "mifa"
    summary = "average of every client's latest update, fresh or stale (biased baseline)"
    Options = MemoryOptions
    partial_work = "none"  # unfinished by the deadline: counts as absent, so not asked
    Aggregation = MIFAAggregation
