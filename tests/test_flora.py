"""FLoRA (fedhet.algorithms.flora): the server merges the clients' adapter products
sum_k p_k s B_k A_k into the base weights, held as buffers of the global model, and starts
new adapters (B = 0, a fresh A); the merged model computes the clients' weighted mean map
exactly (stacking, not averaging A and B apart); a half-rank client contributes its own
ranks only; uploads carry no base; a model whose base is not global is refused; a run
resumes to the same numbers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.algorithms import AlgorithmContext
from fedhet.algorithms.flora import FLoRA, FLoRAOptions, fresh_adapter_a
from fedhet.config import from_dict
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientUpdate, Coverage
from fedhet.models.layers import FlatModel, LayeredModel
from fedhet.models.lora import LoRALinear
from fedhet.models.width import width_mask


def _adapted(rank: int = 2) -> FlatModel:
    """One layer: a rank-``rank`` adapter (alpha 2, so s = 2 / rank) on a 3 -> 2 Linear
    whose weight is a buffer of the global model."""
    torch.manual_seed(0)
    adapted = LoRALinear(nn.Linear(3, 2), rank, 2.0, base_in_state=True)
    return FlatModel(LayeredModel([nn.Sequential(adapted)]))


def _rule():
    return FLoRA.build(FLoRAOptions(seed=7), AlgorithmContext(from_dict({}).train))


def _round(number: int = 3):
    return SimpleNamespace(plan=SimpleNamespace(round=number))


def test_the_base_weight_is_a_buffer_of_the_global_model_and_the_layout_finds_it():
    flat = _adapted()
    (adapter,) = flat.layout.adapters
    assert (adapter.a, adapter.a_shape, adapter.b, adapter.b_shape) == (0, (2, 3), 6, (2, 2))
    assert flat.params.numel() == 10 and flat.buffers.numel() == 6  # A, B trained; W (2 x 3) held
    module = flat.model.blocks[0][0]
    assert torch.equal(flat.buffers[adapter.weight : adapter.weight + 6].view(2, 3), module.base.weight)


def test_two_clients_products_are_merged_by_hand_and_the_adapters_restart():
    """A0 = [[1,0,0],[0,1,0]], B0 = 0, W = 0, s = 1. Client 0 (10 examples, p = 1/4) ends at
    B = [[1,0],[0,0]], A = A0; client 1 (30, p = 3/4) at B = [[0,0],[0,2]], A = A0 + [[0,0,0],
    [0,0,4]]. W' = 1/4 [[1,0,0],[0,0,0]] + 3/4 [[0,0,0],[0,2,8]] = [[.25,0,0],[0,1.5,6]]."""
    layout = _adapted().layout
    a0 = torch.tensor([[1.0, 0, 0], [0, 1, 0]])
    params = torch.cat([a0.reshape(-1), torch.zeros(4)])
    delta0 = torch.cat([torch.zeros(6), torch.tensor([1.0, 0, 0, 0])])
    delta1 = torch.cat([torch.tensor([0.0, 0, 0, 0, 0, 4]), torch.tensor([0.0, 0, 0, 2])])
    updates = [ClientUpdate(0, Coverage(), 1, 10, 0.0, delta0, torch.zeros(6)),
               ClientUpdate(1, Coverage(), 1, 30, 0.0, delta1, torch.zeros(6))]  # fmt: skip
    new_params, new_buffers = _rule().aggregation.aggregate(
        params, torch.zeros(6), updates, {}, _round(3), layout
    )
    assert new_buffers.tolist() == pytest.approx([0.25, 0, 0, 0, 1.5, 6.0])
    assert new_params[6:].abs().sum() == 0  # B <- 0: the merged model is where the next round starts
    fresh = fresh_adapter_a((2, 3), 7, 3, 0)
    assert torch.equal(new_params[:6].view(2, 3), fresh) and fresh.abs().max() <= 1 / np.sqrt(3)
    assert not torch.equal(fresh, fresh_adapter_a((2, 3), 7, 4, 0))  # a new direction each round


def test_the_merged_model_computes_the_clients_weighted_mean_map_exactly():
    """Stacking's point: after the merge, the global layer maps x to sum_k p_k f_k(x), where
    averaging A and B apart would give (sum p_k B_k)(sum p_k A_k) instead."""
    flat = _adapted(rank=2)
    layout, params, buffers = flat.layout, flat.params.clone(), flat.buffers.clone()
    generator = torch.Generator().manual_seed(1)
    deltas = [torch.randn(10, generator=generator) for _ in range(3)]
    sizes = [5, 10, 25]
    x = torch.randn(4, 3, generator=generator)
    outputs = []
    for delta in deltas:
        flat.load(params + delta, buffers)
        outputs.append(flat.model(x).detach())
    expected = sum(n / 40 * out for n, out in zip(sizes, outputs, strict=True))
    updates = [ClientUpdate(k, Coverage(), 1, n, 0.0, d, torch.zeros(6))
               for k, (n, d) in enumerate(zip(sizes, deltas, strict=True))]  # fmt: skip
    new_params, new_buffers = _rule().aggregation.aggregate(params, buffers, updates, {}, _round(), layout)
    flat.load(new_params, new_buffers)
    assert torch.allclose(flat.model(x), expected, atol=1e-5)
    averaged = params + sum(n / 40 * d for n, d in zip(sizes, deltas, strict=True))
    flat.load(averaged, buffers)
    assert not torch.allclose(flat.model(x), expected, atol=1e-3)  # FedAvg of A and B apart is not


def test_a_half_rank_client_merges_its_own_ranks_only():
    """A rank-4 adapter; a client at rate 0.5 trained ranks 1, 2 (its delta is zero on the
    others, as the trainer's mask leaves it): its product is B[:, :2] A[:2]."""
    flat = _adapted(rank=4)
    layout = flat.layout
    half = width_mask(layout, 0.5)
    generator = torch.Generator().manual_seed(2)
    params = torch.cat([torch.randn(12, generator=generator), torch.zeros(8)])
    delta = torch.where(half, torch.randn(20, generator=generator), torch.zeros(20))
    update = ClientUpdate(0, Coverage(1, 0.5), 1, 10, 0.0, delta, torch.zeros(6))
    _, merged = _rule().aggregation.aggregate(params, torch.zeros(6), [update], {}, _round(), layout)
    end = params + delta
    a, b = end[:12].view(4, 3), end[12:].view(2, 4)
    assert torch.allclose(merged.view(2, 3), 0.5 * b[:, :2] @ a[:2], atol=1e-6)  # s = 2 / 4


def _config(**algorithm):
    return from_dict({
        "run": {"name": "f", "seed": 1, "rounds": 6, "eval_every": 3, "threads": 1},
        "data": {"dataset": "text", "partition": "natural", "num_clients": 8, "context": 32},
        "model": {"name": "transformer", "width": 32, "blocks": 2, "heads": 2, "lora_rank": 4,
                  "lora_base": "global"},
        "train": {"lr": 0.003, "optimizer": "adam", "batch_size": 8, "local_steps": 2},
        "system": {"model": "per-step", "time_per_sample_step": 0.01, "deadline": 10.0,
                   "capability_profile": "list", "capabilities": [1, 1, 2, 2, 3, 3, 4, 4]},
        "algorithm": {"name": "flora", **algorithm},
    })  # fmt: skip


def test_a_flora_run_uploads_adapters_only_and_resumes(tmp_path):
    whole = run(_config(), tmp_path / "whole")
    header = (tmp_path / "whole" / "clients.csv").read_text().splitlines()[0].split(",")
    table = np.loadtxt(tmp_path / "whole" / "clients.csv", delimiter=",", skiprows=1)
    sent, received = table[:, header.index("bytes_up")], table[:, header.index("bytes_down")]
    # two blocks; rank 4 on qkv (32 -> 96), out (32 -> 32), the MLP's 32 -> 128 and 128 -> 32
    adapters = 2 * 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    fast = sent[-2:] / 6  # the fastest pair at the full rank, every round
    assert fast.tolist() == pytest.approx([4.0 * adapters] * 2)  # no base weights uploaded
    assert sent[:2].max() < sent[-2:].min() and (received > sent).all()  # the merged base comes down
    RunLoop(_config(), tmp_path / "cut").run(stop_after=4)
    assert RunLoop(_config(), tmp_path / "cut").run(resume=True).metrics == whole.metrics


def test_a_base_outside_the_global_model_and_bad_options_are_refused(tmp_path):
    document = _config().to_dict()
    document["model"]["lora_base"] = "frozen"
    with pytest.raises(ConfigError, match="model.lora_base = 'global'"):
        run(from_dict(document), tmp_path / "frozen")
    document["model"]["lora_base"] = "shared"
    with pytest.raises(ConfigError, match="model.lora_base"):
        run(from_dict(document), tmp_path / "bad")
    with pytest.raises(ConfigError, match="algorithm.rates"):
        FLoRAOptions(rates=[0.5]).validate()
