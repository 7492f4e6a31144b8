"""Plain text as a next-token task (``data.dataset = "text"``): a UTF-8 file cut into
windows of ``context`` characters, each window's targets the characters one position on
(:class:`fedhet.data.task.NextToken`: perplexity, lower is better).

The vocabulary is the file's characters, sorted. Windows start every ``context``
characters; a deterministic share ``test_fraction`` of them (drawn once from the file's
own stream, not the run's seed) is the test set. A play's speaking roles are its users
(``data.partition = "natural"`` makes each a client, as LEAF's Shakespeare does): a line
``NAME:`` on its own starts a speech of NAME, and a window belongs to the speaker of the
speech it starts in. Without such lines the text has one user.

fedhet ships a sample for tests and examples (``path`` empty): the first 64 KiB of the
Coriolanus text of the "tiny Shakespeare" corpus (public domain; karpathy/char-rnn,
data/tinyshakespeare/input.txt), 25 speaking roles with at least ... windows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.checks import at_least, path_option
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.data.task import NextToken
from fedhet.errors import ConfigError, DataError, read_user_text
from fedhet.registry import register

SAMPLE = Path(__file__).with_name("texts") / "coriolanus.txt"
_SPEAKER = re.compile(r"^([A-Z][A-Za-z' ]*[A-Za-z]):$")


@dataclass
class TextOptions:
    """``path``: a UTF-8 text file (empty: the shipped sample); ``context``: characters per
    window (the model's context); ``test_fraction``: the share of windows held out."""

    path: str = path_option()
    context: int = 64
    test_fraction: float = 0.1

    def validate(self) -> None:
        at_least("data.context", self.context, 2)
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"data.test_fraction = {self.test_fraction}: must be in (0, 1)")


def speakers(text: str) -> tuple[np.ndarray, list[str]]:
    """Per character, the index of the speaker whose speech it is in (0, ``""``, before any
    speech or in a text without speeches), and the speakers' names by index. A speech
    starts with a line ``NAME:`` alone after a blank line (or at the start)."""
    owner = np.zeros(len(text), dtype=np.int64)
    names: dict[str, int] = {"": 0}
    position, current, after_blank = 0, 0, True
    for line in text.splitlines(keepends=True):
        match = _SPEAKER.match(line.strip()) if after_blank else None
        if match:
            current = names.setdefault(match.group(1), len(names))
        owner[position : position + len(line)] = current
        position += len(line)
        after_blank = not line.strip()
    return owner, list(names)


def load_text(path: str, context: int = 64, test_fraction: float = 0.1) -> Dataset:
    """The text at ``path`` (the shipped sample when empty) as windows (module docstring)."""
    source = Path(path).expanduser() if path else SAMPLE
    text = read_user_text(source, "text (data.path)")
    count = (len(text) - 1) // context
    if count < 2:
        raise DataError(
            f"{source}: {len(text)} characters make fewer than 2 windows of data.context = {context}"
        )
    vocabulary = sorted(set(text))
    codes = _codes(text, vocabulary)
    starts = np.arange(count) * context
    windows = np.stack([codes[s : s + context + 1] for s in starts])
    owner, speaker_names = speakers(text)
    owners = owner[starts]
    held = np.zeros(count, dtype=bool)
    held[np.random.default_rng(0).permutation(count)[: max(1, round(test_fraction * count))]] = True
    present = sorted(set(owners[~held].tolist()))  # the users with training windows
    index = {u: i for i, u in enumerate(present)}
    x = torch.from_numpy(windows[:, :-1].astype(np.float32))
    y = torch.from_numpy(windows[:, 1:])
    train = torch.from_numpy(~held)
    return Dataset(
        name="text", x_train=x[train], y_train=y[train], x_test=x[~train], y_test=y[~train],
        num_classes=len(vocabulary), task=NextToken(),
        provenance={"file": str(source), "characters": len(text), "vocabulary": len(vocabulary),
                    "windows": count, "test_windows": int(held.sum())},
        train_users=torch.tensor([index[u] for u in owners[~held].tolist()], dtype=torch.int64),
        user_names=[speaker_names[u] or "(before any speech)" for u in present],
    )  # fmt: skip


def _codes(text: str, vocabulary: list[str]) -> np.ndarray:
    lookup = {c: i for i, c in enumerate(vocabulary)}
    return np.fromiter((lookup[c] for c in text), dtype=np.int64, count=len(text))


@register("dataset")
class Text(DatasetSource):
    """A text file as next-token prediction over its characters; a play's roles as users."""

    name = "text"
    Options = TextOptions

    @classmethod
    def build(cls, options: TextOptions, ctx=None) -> Dataset:
        return load_text(options.path, options.context, options.test_fraction)

    @classmethod
    def source_files(cls, options: TextOptions) -> Path | None:
        return Path(options.path).expanduser() if options.path else SAMPLE
