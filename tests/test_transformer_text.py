"""A causal transformer on text (fedhet.models.transformer, fedhet.data.text, the NextToken
task): windows whose targets are the characters one on, a play's roles as users;
perplexity is exp of the mean cross-entropy per token; a position never sees the tokens
after it; the embedding, blocks and head are layer groups that truncated back-propagation
cuts between; LEAF's Shakespeare gives sequences; a short federated run learns."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedhet.client import ClientData, LocalTrainer
from fedhet.config import from_dict
from fedhet.data.task import NextToken
from fedhet.data.text import load_text, speakers
from fedhet.engine.launch import run
from fedhet.errors import ConfigError, DataError
from fedhet.messages import ClientTask, Coverage
from fedhet.models import FlatModel, build_model

PLAY = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?
"""


def test_windows_targets_vocabulary_and_speakers(tmp_path):
    path = tmp_path / "play.txt"
    path.write_text(PLAY)
    owner, names = speakers(PLAY)
    assert names == ["", "First Citizen", "All"] and owner[0] == 1 and owner[PLAY.index("Speak,")] == 2
    data = load_text(str(path), context=8, test_fraction=0.25)
    vocabulary = sorted(set(PLAY))
    assert data.num_classes == len(vocabulary) and data.input_shape == (8,)
    windows = (len(PLAY) - 1) // 8
    assert len(data.x_train) + len(data.x_test) == windows and len(data.x_test) == round(0.25 * windows)
    decode = lambda row: "".join(vocabulary[int(i)] for i in row)  # noqa: E731
    for x, y in zip(data.x_train, data.y_train, strict=True):
        text = decode(x)
        assert decode(y)[:-1] == text[1:]  # the target at position t is the input at t + 1
        assert text in PLAY
    assert set(data.user_names) <= {"First Citizen", "All"}  # the roles, as users
    again = load_text(str(path), context=8, test_fraction=0.25)
    assert torch.equal(again.x_test, data.x_test)  # the split is the file's, not the run's
    with pytest.raises(DataError, match="fewer than 2 windows"):
        load_text(str(path), context=len(PLAY))


def test_perplexity_is_exp_of_the_mean_cross_entropy_per_token():
    """Two sequences of two tokens over a vocabulary of 2, logits (0, 0) everywhere but one
    position sure of the right token (log 1 ~ 0): per-token losses log 2, log 2, log 2, ~0."""
    task = NextToken()
    logits = torch.zeros(2, 2, 2)
    logits[1, 1] = torch.tensor([0.0, 50.0])
    target = torch.tensor([[0, 1], [1, 1]])
    sums = task.batch_sums(logits, target)
    metrics = task.metrics(sums, count=2)
    assert sums["tokens"] == 4
    assert metrics["loss"] == pytest.approx(3 * math.log(2) / 4, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(3 * math.log(2) / 4), rel=1e-6)
    assert task.example_losses(logits, target).tolist() == pytest.approx([math.log(2), math.log(2) / 2])
    assert task.higher_is_better_for("perplexity") is False and task.higher_is_better_for("accuracy")


def test_a_position_never_sees_the_tokens_after_it():
    torch.manual_seed(0)
    model = build_model("transformer", (12,), 20)
    x = torch.randint(0, 20, (3, 12)).float()
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 20
    model.eval()
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert a.shape == (3, 12, 20)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_truncated_back_propagation_trains_the_blocks_nearest_the_output():
    """Embedding, 2 blocks, head: L = 4. A step at depth 3 delivers layers 3..4 only, and
    there it equals the full step's (a layer's gradient does not depend on whether the
    layers below it are trained)."""
    torch.manual_seed(0)
    flat = FlatModel(build_model("transformer", (12,), 20))
    assert flat.num_layers == 4
    trainer = LocalTrainer(flat, objective=NextToken())
    params, buffers = flat.params.detach().clone(), flat.buffers.detach().clone()
    data = ClientData(torch.randint(0, 20, (8, 12)).float(), torch.randint(0, 20, (8, 12)), np.arange(8))

    def delta(depth: int) -> torch.Tensor:
        task = ClientTask(0, 0, 0.1, 8, 1, Coverage(depth))
        return trainer.train(task, params, buffers, data, {}, np.random.default_rng(0)).delta

    full, cut = delta(1), delta(3)
    region = flat.layout.param_slices.from_depth(3)
    assert cut.numel() == region.stop - region.start
    torch.testing.assert_close(cut, full[region], atol=1e-6, rtol=1e-5)


def test_leaf_shakespeare_as_sequences(tmp_path):
    from test_tasks import _write_leaf

    lines = {"u1": (["to be or not to b", "hat is the questi"], ["e", "o"]),
             "u2": (["ll the world's a ", "nd all the men an"], ["s", "d"])}  # fmt: skip
    for split in ("train", "test"):
        _write_leaf(tmp_path / "shakespeare", lines, split, files=1)
    config = {"dataset": "leaf", "data_dir": str(tmp_path / "shakespeare"), "target": "sequence"}
    from fedhet.data.leaf import LEAF_LETTERS, Leaf, LeafOptions

    data = Leaf.build(LeafOptions(config["data_dir"], target="sequence"))
    assert data.task.name == "next-token" and data.num_classes == len(LEAF_LETTERS)
    decode = lambda row: "".join(LEAF_LETTERS[int(i)] for i in row)  # noqa: E731
    assert decode(data.y_train[0]) == "o be or not to be"
    with pytest.raises(ConfigError, match="data.target"):
        LeafOptions(config["data_dir"], target="words").validate()


def test_a_short_federated_run_of_the_transformer_learns(tmp_path):
    """SALF, half of 8 roles straggling, 12 rounds on the shipped text: the test perplexity
    falls well below the vocabulary's (a uniform guess), and the summary scores by it."""
    config = from_dict({
        "run": {"name": "lm", "seed": 1, "rounds": 12, "eval_every": 6, "threads": 1},
        "data": {"dataset": "text", "partition": "natural", "num_clients": 8, "context": 32},
        "model": {"name": "transformer", "width": 32, "blocks": 2, "heads": 2},
        "train": {"lr": 0.003, "optimizer": "adam", "batch_size": 8, "local_steps": 2},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "salf"},
    })  # fmt: skip
    result = run(config, tmp_path / "lm")
    vocabulary = json.loads((tmp_path / "lm" / "summary.json").read_text())
    first, last = result.metrics[5]["test_perplexity"], result.metrics[-1]["test_perplexity"]
    assert last < 0.5 * 59 and last <= first * 1.05
    assert "final_test_perplexity" in vocabulary and result.summary["final_test_perplexity"] == last


@pytest.mark.parametrize("rule", ["heterofl", "fjord", "slt"])
def test_width_rules_are_refused_on_a_model_whose_layers_are_not_units(tmp_path, rule):
    """Width masks keep the leading units of Linear and Conv layers; a transformer's
    embeddings, attention heads and LayerNorms are no such units: one line, before round 1."""
    config = from_dict({
        "run": {"name": "w", "rounds": 2, "threads": 1},
        "data": {"dataset": "text", "num_clients": 4, "context": 16},
        "model": {"name": "transformer", "width": 16, "heads": 2, "blocks": 1},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": rule},
    })  # fmt: skip
    with pytest.raises(ConfigError, match=f"algorithm '{rule}' trains width-reduced sub-models"):
        run(config, tmp_path / rule)


# --- LoRA ------------------------------------------------------------------------------------


def _lora_config(**run_keys):
    return from_dict({
        "run": {"name": "lora", "seed": 1, "rounds": 8, "eval_every": 4, "threads": 1, **run_keys},
        "data": {"dataset": "text", "partition": "natural", "num_clients": 8, "context": 32},
        "model": {"name": "transformer", "width": 32, "blocks": 2, "heads": 2, "lora_rank": 2,
                  "pretrain_steps": 30, "pretrain_fraction": 0.5},
        "train": {"lr": 0.01, "optimizer": "adam", "batch_size": 8, "local_steps": 2},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "salf"},
    })  # fmt: skip


def test_lora_adapters_are_the_only_parameters_and_start_as_the_base():
    from fedhet.models.transformer import with_lora

    torch.manual_seed(0)
    base = build_model("transformer", (12,), 20)
    x = torch.randint(0, 20, (2, 12)).float()
    base.eval()
    with torch.no_grad():
        before = base(x)
    model = with_lora(base, rank=2, alpha=4.0)
    flat = FlatModel(model)
    # per block: qkv 64 -> 192, out 64 -> 64, mlp 64 -> 256 -> 64: r (in + out) each
    per_block = 2 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    assert flat.params.numel() == 2 * per_block
    bounds = flat.layout.param_slices.bounds
    assert bounds[0][0] == bounds[0][1] and bounds[-1][0] == bounds[-1][1]  # embedding, head: frozen
    with torch.no_grad():
        torch.testing.assert_close(model(x), before)  # B = 0: the adapted model is the base


def test_the_base_is_pretrained_once_on_examples_no_client_gets(tmp_path, monkeypatch):
    from fedhet.world import build_world

    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    config = _lora_config()
    world = build_world(config)
    cached = list((tmp_path / "cache" / "pretrained").glob("*.pt"))
    assert len(cached) == 1
    full = load_text("", 32, 0.1).num_train
    assert sum(len(c) for c in world.client_indices) <= full - round(0.5 * full)
    stamp = cached[0].stat().st_mtime_ns
    again = build_world(config)  # read from the cache: the same base
    frozen = [p for p in world.flat.model.parameters() if not p.requires_grad]
    for a, b in zip(frozen, [p for p in again.flat.model.parameters() if not p.requires_grad], strict=True):
        assert torch.equal(a, b)
    after = list((tmp_path / "cache" / "pretrained").glob("*.pt"))
    assert after == cached and after[0].stat().st_mtime_ns == stamp  # read, not written again


def test_a_lora_run_trains_grouped_keeps_the_base_and_resumes(tmp_path, monkeypatch):
    from fedhet.engine.loop import RunLoop

    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    alone = run(_lora_config(pool="in-process"), tmp_path / "alone")
    grouped = run(_lora_config(pool="batched"), tmp_path / "grouped")
    assert grouped.summary["tasks_grouped"] > 0
    for a, b in zip(alone.metrics, grouped.metrics, strict=True):
        if a.get("test_perplexity") is not None:
            assert b["test_perplexity"] == pytest.approx(a["test_perplexity"], rel=1e-4)
    RunLoop(_lora_config(pool="in-process"), tmp_path / "cut").run(stop_after=3)
    resumed = RunLoop(_lora_config(pool="in-process"), tmp_path / "cut").run(resume=True)
    assert resumed.metrics == alone.metrics


def test_a_straggler_trains_the_adapters_of_the_blocks_it_reached():
    """On a LoRA model (embedding, 2 blocks with adapters, head: L = 4), a task at depth 3
    delivers block 2's adapters alone, equal there to the full step's; SALF and ADEL-FL use
    this through their coverage, no rule of their own for adapters."""
    from fedhet.models.transformer import with_lora

    torch.manual_seed(0)
    flat = FlatModel(with_lora(build_model("transformer", (12,), 20), rank=2, alpha=4.0))
    trainer = LocalTrainer(flat, objective=NextToken())
    params = flat.params.detach().clone() + 0.01  # B off zero, so that A moves too
    data = ClientData(torch.randint(0, 20, (8, 12)).float(), torch.randint(0, 20, (8, 12)), np.arange(8))

    def delta(depth: int) -> torch.Tensor:
        task = ClientTask(0, 0, 0.1, 8, 1, Coverage(depth))
        return trainer.train(task, params, flat.buffers.clone(), data, {}, np.random.default_rng(0)).delta

    full, cut = delta(1), delta(3)
    region = flat.layout.param_slices.from_depth(3)
    assert (
        region.stop - region.start
        == flat.layout.param_slices.of(3).stop - flat.layout.param_slices.of(3).start
    )
    assert cut.numel() == region.stop - region.start > 0  # block 2's adapters; the head holds none
    torch.testing.assert_close(cut, full[region], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rule", ["salf", "adel-fl"])
def test_salf_and_adel_fl_run_on_adapters_with_stragglers(tmp_path, monkeypatch, rule):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    document = _lora_config().to_dict()
    document["algorithm"] = {"name": rule}
    if rule == "adel-fl":  # its planner needs the exponential time model and a budget
        document["system"] = {"model": "exponential", "deadline": 0.0}
        document["run"].update(rounds=8, time_budget=16.0)
    done = run(from_dict(document), tmp_path / rule)
    depths = [row["mean_depth"] for row in done.metrics]
    assert max(depths) > 1  # some clients reached only the blocks nearest the output
    first, last = (row["test_perplexity"] for row in (done.metrics[3], done.metrics[-1]))
    assert math.isfinite(first) and math.isfinite(last)
