"""A run's evolving state and its checkpoint: everything needed to resume after an
interruption and end with exactly the metrics of an uninterrupted run.

Random streams are derived from (seed, round, client) (:mod:`fedhet.seeding`), so nothing
random needs saving.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.checks import counted
from fedhet.client import ClientStates
from fedhet.errors import FedhetError

CHECKPOINT_VERSION = 7  # 3: server memories beside the checkpoint; 4: plug-in configuration tree; 5: energy;
# 6: the event driver's buffer keeps model versions and held clients; 7: the server state by part


@dataclass
class RunState:
    """Where a run stands after ``round`` finished rounds."""

    params: torch.Tensor
    buffers: torch.Tensor
    round: int = 0
    sim_time: float = 0.0
    wall_time: float = 0.0
    algorithm: dict = field(default_factory=dict)
    clients: ClientStates = field(default_factory=ClientStates)
    metrics: list[dict] = field(default_factory=list)
    client_metrics: list[dict] = field(default_factory=list)
    stopped_by: str | None = None
    stopped_by_callback: str | None = None  # the callback that stopped the run (stopped_by = "callback")
    system: dict = field(default_factory=dict)  # what the system model learned (wall-clock)
    engine: dict = field(default_factory=dict)  # the event-driven driver's clients in flight
    server: dict = field(default_factory=dict)  # the server optimizer's moments ([server])
    energy: dict = field(default_factory=dict)  # per client: seconds and joules so far (EnergyAccount)
    evaluating: dict | None = None  # the model under evaluation: {"round", "params", "buffers"}


def comparable(config_dict: dict) -> dict:
    """The parts of a config that must match for a checkpoint to be resumed: every option
    but those declared :func:`~fedhet.checks.resumable`."""
    out = {k: dict(v) for k, v in config_dict.items()}
    skip = resumable_run_keys()
    out["run"] = {k: v for k, v in out["run"].items() if k not in skip}
    return out


def resumable_run_keys() -> set[str]:
    """The ``[run]`` keys declared resumable: the run's own, its engines' and its pools'
    (where a run's clients are placed and how fast, never what it computes), and the keys
    that moved elsewhere."""
    from fedhet.checks import is_resumable
    from fedhet.config import RunConfig
    from fedhet.registry import builtins, option_fields

    keys = {f.name for f in dataclasses.fields(RunConfig) if is_resumable(f)} | set(RunConfig.MOVED)
    for kind in ("engine", "pool"):
        for entry in builtins(kind).values():
            keys |= {key for key, f in option_fields(entry.cls).items() if is_resumable(f)}
    return keys


def _hook(algorithm: Any, config_dict: dict, hook: str, round_number: int, *args: Any) -> Any:
    """The algorithm's checkpoint hook ``hook``, guarded: a plug-in's exception is one line
    naming it as the configuration does."""
    from fedhet.engine.plugin_errors import guarded, plugin_label

    name = config_dict.get("algorithm", {}).get("name") or getattr(
        algorithm, "name", type(algorithm).__name__
    )
    label = plugin_label("algorithm", name)
    return guarded(label, hook, round_number, getattr(algorithm, hook), *args)


def differences(saved: dict, current: dict) -> list[str]:
    """The dotted keys whose values differ between two comparable configurations."""
    out = []
    for section in sorted(set(saved) | set(current)):
        a, b = saved.get(section, {}), current.get(section, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(f"{section}.{key} ({a.get(key, 'unset')!r} -> {b.get(key, 'unset')!r})")
    return out


class PackedList(list):
    """A list of plain values (metrics rows, a rule's log) that pickles as one bytes object:
    ``torch.save`` then visits one object instead of every value of every row, which kept a
    checkpoint of a long run (an event-driven rule's thousands of server steps) from costing
    time that grows with the square of its length. It loads back as a plain list."""

    def __reduce__(self):
        import pickle

        return (_unpacked, (pickle.dumps(list(self), protocol=pickle.HIGHEST_PROTOCOL),))


def _unpacked(data: bytes) -> list:
    import pickle

    return pickle.loads(data)


def _plain(value: Any) -> bool:
    """Whether ``value`` holds no tensor (it can be pickled on its own)."""
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return not isinstance(value, torch.Tensor | np.ndarray)


def _packable(value: Any) -> bool:
    """A list whose first item holds no tensor: lists here are uniform (rows, log entries),
    so one item says it; a tensor further in would still pickle, only unshared."""
    return isinstance(value, list) and (not value or _plain(value[0]))


def packed(value: Any) -> Any:
    """``value`` as a :class:`PackedList` where it is a list of plain values; a dict's such
    lists likewise (one level down: a rule's ``{"log": [...]}``); anything else as it is."""
    if _packable(value):
        return PackedList(value)
    if isinstance(value, dict):
        return {k: PackedList(v) if _packable(v) else v for k, v in value.items()}
    return value


def to_checkpoint(state: RunState, config_dict: dict, algorithm: Any, work_dir: Path) -> dict:
    """The run's checkpoint: the server state as ``algorithm.state_dict`` gives it (its long
    lists of plain values packed, :func:`packed`)."""
    return {
        "version": CHECKPOINT_VERSION,
        "config": config_dict,
        "round": state.round,
        "sim_time": state.sim_time,
        "wall_time": state.wall_time,
        "params": state.params,
        "buffers": state.buffers,
        "algorithm": packed(
            _hook(algorithm, config_dict, "state_dict", state.round, state.algorithm, work_dir)
        ),
        "client_states": state.clients.state_dict(),
        "metrics": packed(state.metrics),
        "client_metrics": packed(state.client_metrics),
        "stopped_by": state.stopped_by,
        "stopped_by_callback": state.stopped_by_callback,
        "system": state.system,
        "engine": state.engine,
        "server": state.server,
        "energy": state.energy,
        "evaluating": state.evaluating,
    }


CHECKPOINT_TYPES: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "config": dict,
    "round": int,
    "sim_time": (int, float),
    "wall_time": (int, float),
    "params": torch.Tensor,
    "buffers": torch.Tensor,
    "algorithm": dict,
    "client_states": dict,
    "metrics": list,
    "client_metrics": list,
    "stopped_by": (str, type(None)),
}
CURRENT_TYPES: dict[str, type] = {"energy": dict}  # keys of the current format only


def check_checkpoint(
    saved, where: str, num_params: int | None = None, num_buffers: int | None = None
) -> None:
    """One error naming the file when ``saved`` is not a checkpoint of this run's shape: not
    a dict, a missing key, a value of the wrong type, parameters of the wrong length, metrics
    rows that do not match its round count."""
    if not isinstance(saved, dict):
        raise FedhetError(f"{where}: not a fedhet checkpoint (it holds a {type(saved).__name__})")
    for key, kind in CHECKPOINT_TYPES.items():
        if key not in saved:
            raise FedhetError(f"{where}: not a fedhet checkpoint (no {key!r})")
        value = saved[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            raise FedhetError(f"{where}: damaged checkpoint ({key} is a {type(value).__name__})")
    if saved["version"] != CHECKPOINT_VERSION:
        return  # from_checkpoint names the format
    for key, kind in CURRENT_TYPES.items():
        if not isinstance(saved.get(key), kind):
            what = "no" if key not in saved else f"a {type(saved[key]).__name__} for"
            raise FedhetError(f"{where}: damaged checkpoint ({what} {key!r})")
    for key, size in (("params", num_params), ("buffers", num_buffers)):
        tensor = saved[key]
        if tensor.dim() != 1 or not tensor.is_floating_point() or size is not None and tensor.numel() != size:
            dtype = str(tensor.dtype).replace("torch.", "")
            model = f", the model has {size}" if size is not None else ""
            raise FedhetError(f"{where}: damaged checkpoint ({key}: {tuple(tensor.shape)} {dtype}{model})")
    if saved["round"] < 0 or len(saved["metrics"]) != saved["round"]:
        raise FedhetError(
            f"{where}: damaged checkpoint ({counted(saved['round'], 'round')} but "
            f"{counted(len(saved['metrics']), 'metrics row')})"
        )
    if not all(isinstance(row, dict) for row in saved["metrics"]):
        raise FedhetError(f"{where}: damaged checkpoint (a metrics row that is not a table row)")
    sections = saved["config"]
    if not all(isinstance(v, dict) for v in sections.values()):
        raise FedhetError(f"{where}: damaged checkpoint (its config is not a table of sections)")


def from_checkpoint(
    saved: dict,
    config_dict: dict,
    where: str,
    algorithm: Any,
    num_params: int | None = None,
    num_buffers: int | None = None,
) -> RunState:
    """Rebuild a run's state (the server state through ``algorithm.load_state_dict``);
    refuse a checkpoint of another configuration or format, or one that is not a checkpoint
    (:func:`check_checkpoint`)."""
    check_checkpoint(saved, where, num_params, num_buffers)
    if saved.get("version") != CHECKPOINT_VERSION:
        raise FedhetError(
            f"{where}: written by an older fedhet (format {saved.get('version', 1)}); start again"
        )
    changed = differences(comparable(saved["config"]), comparable(config_dict))
    if changed:
        more = f" and {len(changed) - 2} more" if len(changed) > 2 else ""
        raise FedhetError(
            f"{where}: written by a different configuration: {', '.join(changed[:2])}{more}; resume with "
            f"the same config (only run.{', run.'.join(sorted(resumable_run_keys()))} may change) "
            "or use --out"
        )
    clients = ClientStates()
    clients.load_state_dict(saved["client_states"])
    return RunState(
        params=saved["params"],
        buffers=saved["buffers"],
        round=saved["round"],
        sim_time=saved["sim_time"],
        wall_time=saved["wall_time"],
        algorithm=_hook(
            algorithm, config_dict, "load_state_dict", saved["round"], saved["algorithm"], Path(where).parent
        ),
        clients=clients,
        metrics=saved["metrics"],
        client_metrics=saved["client_metrics"],
        stopped_by=saved["stopped_by"],
        stopped_by_callback=saved.get("stopped_by_callback"),
        system=saved.get("system", {}),
        engine=saved.get("engine", {}),
        server=saved.get("server") or _preset_moments(algorithm, saved["algorithm"]),
        evaluating=saved.get("evaluating"),
        energy=saved["energy"],
    )


def _preset_moments(algorithm: Any, saved_algorithm: Any) -> dict:
    """The server step's moments of a checkpoint written when FedAvgM, FedAdam, FedYogi and
    FedAdagrad kept them in the rule's own state (``m``, ``v``): a resumed run of such a
    preset continues them instead of starting them again."""
    if not isinstance(saved_algorithm, dict) or algorithm.preset_server_optimizer() is None:
        return {}
    return {key: saved_algorithm[key] for key in ("m", "v") if saved_algorithm.get(key) is not None}
