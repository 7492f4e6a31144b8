"""CA2FL (Yujia Wang, Yuanpu Cao, Jingcheng Wu, Ruoyu Chen, Jinghui Chen, "Tackling the
Data Heterogeneity in Asynchronous Federated Learning with Cached Update Calibration", ICLR
2024): FedBuff's buffered asynchronous
aggregation with each client's latest update cached on the server, and every server step
calibrated by the cache. Runs on the event-driven driver, as FedBuff.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from fedhet.algorithms.base import SERVER_LR_RANGE, register
from fedhet.algorithms.fedbuff import FedBuff, FedBuffAggregation, FedBuffOptions, FedBuffReporting
from fedhet.algorithms.memory import DTYPES, FOLDER, STORAGES, ClientMemory, persisted, restored
from fedhet.checks import one_of


@dataclass
class CA2FLOptions(FedBuffOptions):
    """FedBuff's options (the buffer of M updates, the concurrency, eta), and the cache's
    storage, as MIFA's memory: ``memory_dtype``: float32 or float16; ``memory_storage``: ram,
    or disk (memory-mapped)."""

    memory_dtype: str = "float32"
    memory_storage: str = "ram"

    def validate(self) -> None:
        super().validate()
        one_of("algorithm.memory_dtype", self.memory_dtype, tuple(DTYPES))
        one_of("algorithm.memory_storage", self.memory_storage, STORAGES)


class CA2FLAggregation(FedBuffAggregation):
    """CA2FL's server step: the buffer's updates calibrated by each client's cached update
    (cache-aided asynchronous aggregation)."""

    def init_state(self, setting) -> dict:
        state = super().init_state(setting)
        folder = None if setting.work_dir is None else setting.work_dir / FOLDER
        weight = np.full(setting.num_clients, 1.0 / setting.num_clients)
        options = self.options
        state["memory"] = ClientMemory(setting.num_clients, setting.num_params, weight, options.memory_dtype,
                                       options.memory_storage, folder)  # fmt: skip
        return state

    def apply_buffer(self, params, buffers, entries, state: dict, version: int):
        """One calibrated server step from ``entries`` = [(update, staleness), ...]."""
        memory: ClientMemory = state["memory"]
        k = len(entries)
        direction = memory.stale_sum().clone()  # h_t, before this step's caches
        for update, _ in entries:
            direction.add_(update.delta - memory.row(update.client), alpha=1.0 / k)
        new_params, new_buffers = params.add(direction, alpha=self.options.server_lr), buffers.clone()
        for update, _ in entries:
            memory.set(update.client, update.delta)
            if buffers.numel():
                new_buffers.add_(update.delta_buffers, alpha=1.0 / k)
        state["log"].append({"step": version + 1, "clients": [u.client for u, _ in entries],
                             "staleness": [s for _, s in entries]})  # fmt: skip
        return new_params, new_buffers

    def state_dict(self, state: dict, work_dir: Path | None = None) -> dict:
        """The cache, persisted as the memory-based rules' (:func:`~fedhet.algorithms.memory.persisted`)."""
        return {**state, "memory": persisted(state["memory"])}

    def load_state_dict(self, saved: dict, work_dir: Path | None = None) -> dict:
        """The cache rebuilt from its files as they were at the checkpoint."""
        return {**saved, "memory": restored(saved["memory"], work_dir, self.name)}


class CA2FLReporting(FedBuffReporting):
    """CA2FL's report: the server steps and the cache."""

    def reports(self, state: dict) -> dict[str, dict]:
        return {"ca2fl": {"server_steps": state["log"]}}


@register
class CA2FL(FedBuff):
    """CA2FL's Algorithm 1. The server caches h_i, client i's latest update (0 before it
    first delivers), and their mean h = (1/N) sum_i h_i. At server step t, from the buffer S_t
    of M updates,

        v_t = h_t + (1/M) sum_{i in S_t} (Delta_i - h_i),    x_{t+1} = x_t + eta v_t,

    then h_i <- Delta_i for i in S_t. The calibration replaces FedBuff's staleness weights:
    v_t estimates the mean update of all N clients, stale ones included, rather than the
    mean of whoever arrived. A client delivering twice in one buffer: the later update
    counts as a separate entry and is cached last."""

    name = "ca2fl"
    summary = "CA2FL: FedBuff calibrated by every client's cached latest update (Wang et al. ICLR 2024)"
    Options = CA2FLOptions
    hyperparameters: ClassVar[dict[str, dict]] = {"server_lr": SERVER_LR_RANGE}
    Aggregation = CA2FLAggregation
    Reporting = CA2FLReporting
