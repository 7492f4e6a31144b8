"""HetLoRA (fedhet.algorithms.hetlora): a client trains the leading ranks of every LoRA
adapter its speed tier allows (A's rows, B's columns); the server averages the adapters
zero-padded to the full rank; the fastest clients get the largest rank; only the kept ranks
travel; a model without adapters is refused; a run resumes to the same numbers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.hetlora import HetLoRA, HetLoRAOptions
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models.layers import FlatModel, LayeredModel
from fedhet.models.lora import LoRALinear
from fedhet.models.width import width_mask


def _adapted():
    """One layer: a LoRA adapter of rank 4 on a 3 -> 2 Linear (A: 4 x 3, B: 2 x 4)."""
    torch.manual_seed(0)
    return FlatModel(LayeredModel([nn.Sequential(LoRALinear(nn.Linear(3, 2), rank=4, alpha=4.0))]))


def test_a_rank_share_keeps_the_leading_rows_of_a_and_columns_of_b():
    flat = _adapted()
    assert flat.params.numel() == 4 * 3 + 2 * 4 and len(flat.layout.rank_axes) == 2
    mask = width_mask(flat.layout, 0.5)
    a, b = mask[:12].view(4, 3), mask[12:].view(2, 4)
    assert a[:2].all() and not a[2:].any()  # ranks 1, 2 of A: its first two rows
    assert b[:, :2].all() and not b[:, 2:].any()  # and B's first two columns
    assert bool(width_mask(flat.layout, 0.25).sum() == 3 + 2)  # rank 1


def test_adapters_are_averaged_zero_padded_to_the_full_rank():
    """Two clients: one at the full rank with a delta of 1s, one at half the rank with 3s
    on its ranks. Padded: w <- (1/2) sum_k pad(w + delta_k): the kept ranks move by 2, the
    others to (w + 1) / 2."""
    flat = _adapted()
    layout = flat.layout
    rule = HetLoRA.build(HetLoRAOptions(), AlgorithmContext(from_dict({}).train))
    params = torch.full((20,), 0.5)
    half = width_mask(layout, 0.5)
    updates = [ClientUpdate(0, Coverage(), 1, 10, 0.0, torch.ones(20)),
               ClientUpdate(1, Coverage(1, 0.5), 1, 10, 0.0, torch.where(half, 3.0, 0.0))]  # fmt: skip
    new, _ = rule.aggregation.aggregate(params, torch.zeros(0), updates, {}, SimpleNamespace(), layout)
    assert new[half].tolist() == pytest.approx([2.5] * int(half.sum()))
    assert new[~half].tolist() == pytest.approx([0.75] * int((~half).sum()))


def test_the_fastest_tier_gets_the_largest_rank():
    rule = HetLoRA.build(HetLoRAOptions(rates=[1.0, 0.5, 0.25]), AlgorithmContext(from_dict({}).train))
    times = [5.0, 1.0, 3.0, 2.0, 6.0, 4.0]  # fastest first: clients 1, 3, 2, 5, 0, 4
    context = SimpleNamespace(plan=SimpleNamespace(record={"estimated_full_time": times}))
    assert [rule.planner.tier_rate(context, c) for c in range(6)] == [0.25, 1.0, 0.5, 1.0, 0.25, 0.5]


def _config(**algorithm):
    return from_dict({
        "run": {"name": "h", "seed": 1, "rounds": 8, "eval_every": 4, "threads": 1},
        "data": {"dataset": "text", "partition": "natural", "num_clients": 8, "context": 32},
        "model": {"name": "transformer", "width": 32, "blocks": 2, "heads": 2, "lora_rank": 4},
        "train": {"lr": 0.01, "optimizer": "adam", "batch_size": 8},
        "system": {"model": "per-step", "time_per_sample_step": 0.01, "deadline": 10.0,
                   "capability_profile": "list", "capabilities": [1, 1, 2, 2, 3, 3, 4, 4]},
        "algorithm": {"name": "hetlora", **algorithm},
    })  # fmt: skip


def test_a_hetlora_run_sends_fewer_bytes_from_slow_clients_and_resumes(tmp_path):
    whole = run(_config(), tmp_path / "whole")
    sent = np.loadtxt(tmp_path / "whole" / "clients.csv", delimiter=",", skiprows=1,
                      usecols=_column(tmp_path / "whole" / "clients.csv", "bytes_up"))  # fmt: skip
    assert sent[:2].max() < sent[-2:].min()  # the slowest pair at rank 1, the fastest at rank 4
    RunLoop(_config(), tmp_path / "cut").run(stop_after=3)
    assert RunLoop(_config(), tmp_path / "cut").run(resume=True).metrics == whole.metrics


def _column(path, name: str) -> int:
    return path.read_text().splitlines()[0].split(",").index(name)


def test_a_model_without_adapters_and_bad_options_are_refused(tmp_path):
    document = _config().to_dict()
    document["model"]["lora_rank"] = 0
    with pytest.raises(ConfigError, match="algorithm 'hetlora' truncates LoRA adapters' ranks"):
        run(from_dict(document), tmp_path / "none")
    with pytest.raises(ConfigError, match="algorithm.rank_rule"):
        HetLoRAOptions(rank_rule="random").validate()


def test_fjords_ordered_dropout_refuses_adapters(tmp_path):
    """FjORD drops the blocks' outputs, which a rank has nothing to do with: still refused."""
    document = _config().to_dict()
    document["algorithm"] = {"name": "fjord"}
    with pytest.raises(ConfigError, match="algorithm 'fjord' trains width-reduced sub-models"):
        run(from_dict(document), tmp_path / "fjord")
