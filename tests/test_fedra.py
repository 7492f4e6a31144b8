"""FedRA (fedhet.algorithms.fedra): each client runs and trains a random subset of the
blocks, as many as its deadline allows (the embedding and the head always run); a model
runs without its skipped blocks; the parameters of blocks a client did not get stay as they
were; slow clients get fewer blocks; a run resumes to the same numbers; a model without
skippable blocks is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms.fedra import allocation
from fedhet.client import ClientData, LocalTrainer
from fedhet.config import from_dict
from fedhet.data.task import NextToken
from fedhet.engine.launch import run
from fedhet.engine.loop import RunLoop
from fedhet.errors import ConfigError
from fedhet.messages import ClientTask, Coverage
from fedhet.models import FlatModel, build_model
from fedhet.models.width import layer_mask


def test_the_allocation_is_the_fixed_layers_and_the_first_blocks_of_the_order():
    """Embedding, three blocks, head: skippable (no, yes, yes, yes, no); order (3, 1, 2)
    (0-based layer indices): one block is layers {1, 4, 5}, two blocks {1, 2, 4, 5}."""
    skippable = (False, True, True, True, False)
    order = np.array([3, 1, 2])
    assert allocation(skippable, order, 1) == 0b11001
    assert allocation(skippable, order, 2) == 0b11011


def test_a_model_runs_without_its_skipped_blocks():
    torch.manual_seed(0)
    model = build_model("transformer", (8,), 11)
    model.eval()
    x = torch.randint(0, 11, (2, 8)).float()
    with torch.no_grad():
        by_hand = model.blocks[3](model.blocks[1](model.blocks[0](x)))  # embedding, block 1, head
        model.skipped = frozenset({3})
        skipped = model(x)
        model.skipped = frozenset()
        whole = model(x)
    torch.testing.assert_close(skipped, by_hand)
    assert not torch.allclose(skipped, whole)


def test_a_client_trains_only_the_blocks_it_got():
    torch.manual_seed(0)
    flat = FlatModel(build_model("transformer", (8,), 11))
    trainer = LocalTrainer(flat, objective=NextToken())
    params, buffers = flat.params.detach().clone(), flat.buffers.detach().clone()
    data = ClientData(torch.randint(0, 11, (16, 8)).float(), torch.randint(0, 11, (16, 8)), np.arange(16))
    layers = 0b1011  # embedding, block 1, head: block 2 (layer 3) left out
    task = ClientTask(0, 0, 0.1, 8, 2, Coverage(1, 1.0, 0, 0, layers))
    update = trainer.train(task, params, buffers, data, {}, np.random.default_rng(0))
    held = layer_mask(flat.layout, layers)
    assert bool((update.delta[~held] == 0).all()) and bool((update.delta[held] != 0).any())
    assert flat.model.skipped == frozenset()  # the working model runs every block again


def _config(**keys):
    return from_dict({
        "run": {"name": "ra", "seed": 1, "rounds": 8, "eval_every": 4, "threads": 1, **keys},
        "data": {"dataset": "text", "partition": "natural", "num_clients": 8, "context": 16},
        "model": {"name": "transformer", "width": 16, "blocks": 3, "heads": 2, "lora_rank": 2},
        "train": {"lr": 0.01, "optimizer": "adam", "batch_size": 8},
        "system": {"model": "per-step", "time_per_sample_step": 0.01, "deadline": 0.11,
                   "capability_profile": "list", "capabilities": [0.5, 0.5, 0.7, 0.7, 1, 1, 2, 2]},
        "algorithm": {"name": "fedra"},
    })  # fmt: skip


def test_slow_clients_get_fewer_blocks_and_a_run_resumes(tmp_path):
    whole = run(_config(), tmp_path / "whole")
    header = (tmp_path / "whole" / "clients.csv").read_text().splitlines()[0].split(",")
    sent = np.loadtxt(tmp_path / "whole" / "clients.csv", delimiter=",", skiprows=1,
                      usecols=header.index("bytes_up"))  # fmt: skip
    assert 0 < sent[:2].max() < sent[-2:].min()
    RunLoop(_config(), tmp_path / "cut").run(stop_after=3)
    assert RunLoop(_config(), tmp_path / "cut").run(resume=True).metrics == whole.metrics


def test_a_model_without_skippable_blocks_is_refused(tmp_path):
    document = _config().to_dict()
    document["data"] = {"dataset": "digits", "num_clients": 8}
    document["model"] = {"name": "mlp"}
    with pytest.raises(ConfigError, match="algorithm 'fedra' allocates blocks"):
        run(from_dict(document), tmp_path / "mlp")
