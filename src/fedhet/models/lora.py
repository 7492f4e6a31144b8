"""LoRA adapters on a frozen, centrally pre-trained base (Hu et al., "LoRA: Low-Rank
Adaptation of Large Language Models", arXiv:2106.09685).

Every projection of a transformer block (attention's ``qkv`` and ``out``, the MLP's two
layers) becomes W x + b + (alpha / r) B A x, with A (r x in) drawn as PyTorch draws a
Linear's weight and B (out x r) zero, so that the adapted model starts as the base. The base's
parameters are frozen (``requires_grad`` off): :class:`~fedhet.models.layers.FlatModel` leaves
them out of the flat vector, so the clients train, send and the server averages the
adapters alone, and truncated back-propagation still stops between blocks (each block's
adapters are its layer group's parameters; the embedding and the head hold none). The
base is the same on every client: it is pre-trained once, centrally, and cached.

Pre-training (``model.pretrain_steps`` > 0): a share ``pretrain_fraction`` of the training
examples, drawn from a stream fixed by the data (not the run's seed), is set aside before
the clients are formed and never given to a client; the full model is trained on it with
Adam (``pretrain_lr``, batches of ``pretrain_batch``) for ``pretrain_steps`` steps from an
initialisation fixed likewise, so every seed of a bench starts from the same base. The
weights are cached in ``$FEDHET_CACHE`` (default ``~/.cache/fedhet``) under a hash of what
they depend on (the model's options, the data's provenance and examples, the pre-training
options); a later run reads them.

fedhet's own module, not ``peft``: peft wraps modules by name into its own model class,
while fedhet's layer groups, flat parameter vector and grouped trainer need the adapters to
be plain parameters of the existing blocks; the adapter itself is a few lines.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

PRETRAIN_STREAM = 20231  # the fixed seed of the held-out share and the base's initialisation


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update (alpha / r) B A.

    ``base_in_state``: the base's weight becomes a float buffer, so it lives in the model's
    flat buffer vector: part of the global model the server holds, sends each round and may
    change (FLoRA merges the round's adapters into it); otherwise it is a frozen parameter,
    the same on every client for the whole run."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, base_in_state: bool = False):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        if base_in_state:
            weight = base.weight.detach().clone()
            del base.weight
            base.register_buffer("weight", weight)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.lora_a.rank_axis, self.lora_b.rank_axis = 0, 1  # type: ignore[attr-defined]  # HetLoRA's sub-models
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale


def held_out_share(count: int, fraction: float) -> np.ndarray:
    """The positions of the training examples set aside for pre-training (sorted), drawn
    from a stream fixed by nothing but the data's size."""
    if fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(PRETRAIN_STREAM)
    return np.sort(rng.permutation(count)[: max(1, round(fraction * count))])


def cache_folder() -> Path:
    """Where pre-trained bases are kept: ``$FEDHET_CACHE``, else ``~/.cache/fedhet``."""
    return Path(os.environ.get("FEDHET_CACHE") or Path.home() / ".cache" / "fedhet") / "pretrained"


def cache_key(what: dict, x: torch.Tensor, y: torch.Tensor) -> str:
    """A hash of the pre-training's options and its examples (their bytes)."""
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode())
    digest.update(x.detach().cpu().numpy().tobytes())
    digest.update(y.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:20]


def pretrain(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss, steps: int, lr: float,
             batch: int) -> None:  # fmt: skip
    """``steps`` Adam steps of the whole model on batches drawn from (x, y) with a fixed
    stream, in place."""
    generator = torch.Generator().manual_seed(PRETRAIN_STREAM)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(x), (min(batch, len(x)),), generator=generator)
        optimizer.zero_grad()
        loss(model(x[index]), y[index]).backward()
        optimizer.step()


def pretrained_base(build, options: dict, x: torch.Tensor, y: torch.Tensor, loss, steps: int, lr: float,
                    batch: int) -> nn.Module:  # fmt: skip
    """The base model ``build()`` makes (from a fixed initialisation), pre-trained on (x, y),
    read from the cache when it holds it, else trained and cached (written atomically)."""
    torch.manual_seed(PRETRAIN_STREAM)
    model = build()
    key = cache_key({"model": options, "steps": steps, "lr": lr, "batch": batch}, x, y)
    path = cache_folder() / f"{key}.pt"
    if path.is_file():
        try:
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            return model
        except (OSError, RuntimeError, EOFError):  # a damaged file: train again and replace it
            pass
    pretrain(model, x, y, loss, steps, lr, batch)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(model.state_dict(), partial)
        os.replace(partial, path)
    except OSError:
        pass  # no cache (a read-only home): the next run trains it again, with the same result
    return model
