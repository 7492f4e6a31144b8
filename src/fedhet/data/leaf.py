"""LEAF's JSON format (Caldas et al., "LEAF: A Benchmark for Federated Settings",
arXiv:1812.01097): datasets that bring their own users.

A LEAF dataset folder holds ``train/`` and ``test/`` folders of JSON files, each::

    {"users": ["f0000_14", ...], "num_samples": [n, ...],
     "user_data": {"f0000_14": {"x": [...], "y": [...]}, ...}}

The reader takes every file of both folders. Training examples keep their user, so
``data.partition = "natural"`` makes each user a client (the writers of FEMNIST, the
speaking roles of Shakespeare, the accounts of Sent140); the test examples of all users
form the test set. What an example is follows its ``x``:

- a list of numbers: features (FEMNIST's 784 pixels become a 1 x 28 x 28 image, in [0, 1]
  with ink high as LEAF writes them; other lengths stay vectors);
- a string (Shakespeare): each character's index in LEAF's 80-character alphabet (a
  float vector; the ``char-mlp`` model embeds them); the label ``y``, one character, is
  its index there;
- a list whose fifth entry is text (Sent140's ``[id, date, query, user, text]``): a
  bag of words hashed into ``hashed_features`` counts (scaled to sum 1).

Labels are integers (classification); the model's outputs are the largest label + 1 (at
most 80 for characters). Errors name the file: a missing folder, invalid JSON, users whose counts do
not match, examples of different shapes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.checks import path_option
from fedhet.data.compact import Features
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.data.task import NextToken
from fedhet.errors import DataError
from fedhet.registry import register

# LEAF's Shakespeare alphabet (80 characters; its language utilities' ALL_LETTERS)
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_LETTER_INDEX = {c: i for i, c in enumerate(LEAF_LETTERS)}
_WORD = re.compile(r"[a-z0-9']+")


@dataclass
class LeafOptions:
    """``data_dir``: the LEAF data folder (with ``train/`` and ``test/``);
    ``hashed_features``: the bag-of-words size of text examples (Sent140); ``target``:
    ``"label"`` (LEAF's own: one label per example) or ``"sequence"`` (character examples,
    Shakespeare: every position's next character, a language model's next-token task)."""

    data_dir: str = path_option()
    hashed_features: int = 1024
    target: str = "label"

    def validate(self) -> None:
        from fedhet.checks import at_least, one_of

        at_least("data.hashed_features", self.hashed_features, 1)
        one_of("data.target", self.target, ("label", "sequence"))


def _letter(char: str, where: str) -> int:
    if char not in _LETTER_INDEX:
        raise DataError(f"{where}: character {char!r} is not in LEAF's 80-letter alphabet")
    return _LETTER_INDEX[char]


def _hashed_words(text: str, size: int) -> np.ndarray:
    """A bag of words: each lower-cased word counted at a stable hash of it, scaled to sum 1."""
    out = np.zeros(size, dtype=np.float32)
    for word in _WORD.findall(text.lower()):
        out[int(hashlib.blake2b(word.encode(), digest_size=8).hexdigest(), 16) % size] += 1.0
    total = out.sum()
    return out / total if total else out


def _example(x, where: str, size: int) -> np.ndarray:
    """One example's features, by the kind of ``x`` (see the module's docstring); an
    example without any (an empty list or text) is refused: a model would learn biases only."""
    if isinstance(x, str | list) and len(x) == 0:
        raise DataError(f"{where}: an example's x is empty (no features to learn from)")
    if isinstance(x, str):
        return np.array([_letter(c, where) for c in x], dtype=np.float32)
    if isinstance(x, list) and len(x) >= 5 and isinstance(x[4], str):
        return _hashed_words(x[4], size)
    if isinstance(x, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in x):
        return np.asarray(x, dtype=np.float32)
    raise DataError(f"{where}: an example's x is neither numbers, text nor a Sent140 record")


def _label(y, where: str) -> int:
    if isinstance(y, str) and len(y) == 1:
        return _letter(y, where)
    if isinstance(y, bool) or not isinstance(y, int | float) or y != int(y) or y < 0:
        raise DataError(f"{where}: label {y!r} is not a class (an integer >= 0 or one character)")
    return int(y)


def read_leaf_file(path: Path, hashed_features: int = 1024) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The users of one LEAF JSON file: (user, features [n, ...], labels [n])."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(document, dict) or not isinstance(document.get("user_data"), dict):
        raise DataError(f"{path}: not a LEAF file (no 'user_data' table)")
    users = document.get("users", list(document["user_data"]))
    counts = document.get("num_samples", [None] * len(users))
    if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
        raise DataError(f"{path}: 'users' and 'num_samples' must be lists of the same length")
    out = []
    for user, count in zip(users, counts, strict=True):
        data = document["user_data"].get(user)
        where = f"{path}: user {user!r}"
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("x"), list)
            or not isinstance(data.get("y"), list)
        ):
            raise DataError(f"{where}: no 'x' and 'y' lists in user_data")
        if len(data["x"]) != len(data["y"]) or count is not None and count != len(data["y"]):
            raise DataError(
                f"{where}: {len(data['x'])} x, {len(data['y'])} y and num_samples {count} disagree"
            )
        if not data["y"]:
            continue
        features = [_example(x, where, hashed_features) for x in data["x"]]
        if len({f.shape for f in features}) != 1:
            raise DataError(f"{where}: examples of different lengths")
        out.append((str(user), np.stack(features), np.array([_label(y, where) for y in data["y"]])))
    return out


def _read_split(folder: Path, hashed_features: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    if not folder.is_dir():
        raise DataError(f"{folder}: LEAF split folder not found (a LEAF data folder holds train/ and test/)")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder}: no .json files")
    entries = [entry for path in files for entry in read_leaf_file(path, hashed_features)]
    if not entries:
        raise DataError(f"{folder}: no examples (its files hold no user with data)")
    return entries


def _as_tensor(features: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    if x.dim() == 2 and x.shape[1] == 28 * 28:  # FEMNIST: a 28 x 28 grey image
        x = x.view(-1, 1, 28, 28)
    return x


def load_leaf(data_dir: str, hashed_features: int = 1024) -> Dataset:
    """A LEAF dataset folder (see the module's docstring)."""
    if not data_dir:
        raise DataError("leaf: no data folder given (set data.data_dir to the folder with train/ and test/)")
    root = Path(data_dir).expanduser()
    train = _read_split(root / "train", hashed_features)
    test = _read_split(root / "test", hashed_features)
    shapes = {x.shape[1:] for _, x, _ in train + test}
    if len(shapes) != 1:
        raise DataError(f"{root}: train and test examples differ in shape ({sorted(shapes)})")
    names = sorted({user for user, _, _ in train})
    index = {name: i for i, name in enumerate(names)}
    labels = np.concatenate([y for _, _, y in train + test])
    num_classes = int(labels.max()) + 1
    return Dataset(
        name="leaf",
        x_train=_as_tensor(np.concatenate([x for _, x, _ in train])),
        y_train=torch.from_numpy(np.concatenate([y for _, _, y in train]).astype(np.int64)),
        x_test=_as_tensor(np.concatenate([x for _, x, _ in test])),
        y_test=torch.from_numpy(np.concatenate([y for _, _, y in test]).astype(np.int64)),
        num_classes=num_classes,
        provenance={
            "folder": str(root),
            "train_users": len(names),
            "train_rows": int(sum(len(y) for _, _, y in train)),
            "test_rows": int(sum(len(y) for _, _, y in test)),
        },  # fmt: skip
        train_users=torch.from_numpy(np.concatenate([np.full(len(y), index[u]) for u, _, y in train])),
        user_names=names,
    )


def as_sequences(dataset: Dataset) -> Dataset:
    """Character examples as next-token sequences: an example's targets are its characters
    from the second on, then its label (the character after them): LEAF's Shakespeare as a
    language model's task (:class:`~fedhet.data.task.NextToken`) over its 80 letters."""
    if dataset.x_train.dim() != 2 or int(dataset.y_train.max()) >= len(LEAF_LETTERS):
        raise DataError(
            f"{dataset.provenance.get('folder', 'leaf')}: data.target = 'sequence' needs character "
            "examples (LEAF's Shakespeare)"
        )

    def shifted(x: Features, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, 1:].long(), y.view(-1, 1)], dim=1)

    return dataclasses.replace(
        dataset,
        y_train=shifted(dataset.x_train, dataset.y_train),
        y_test=shifted(dataset.x_test, dataset.y_test),
        num_classes=len(LEAF_LETTERS),
        task=NextToken(),
    )


@register("dataset")
class Leaf(DatasetSource):
    """A LEAF-format folder (FEMNIST, Shakespeare, Sent140, ...): the data's own users."""

    name = "leaf"
    Options = LeafOptions

    @classmethod
    def build(cls, options: LeafOptions, ctx=None) -> Dataset:
        dataset = load_leaf(options.data_dir, options.hashed_features)
        return as_sequences(dataset) if options.target == "sequence" else dataset

    @classmethod
    def source_files(cls, options: LeafOptions) -> Path | None:
        return Path(options.data_dir).expanduser() if options.data_dir else None
