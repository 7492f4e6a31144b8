"""NSL-KDD (network intrusion detection; the AMSFL paper's dataset) from the standard files
``KDDTrain+.txt`` and ``KDDTest+.txt`` in a user's folder.

Each file is a headerless CSV of 43 columns: 41 features, the attack name and a difficulty
level. The three categorical features (protocol_type, service, flag: columns 2-4) are
one-hot encoded with the categories of the training file (122 features on the full data),
every feature is min-max scaled with the training file's ranges (constant columns become 0),
and labels are ``binary`` (normal = 0, attack = 1) or ``5-class`` (normal, DoS, Probe, R2L,
U2R by the standard map of attack names). A malformed row, an unknown category or attack
name in either file stops with one line naming the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.checks import one_of
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.errors import ConfigError, DataError
from fedhet.registry import register

TRAIN_FILE, TEST_FILE = "KDDTrain+.txt", "KDDTest+.txt"
NUM_COLUMNS = 43
CATEGORICAL = (1, 2, 3)  # protocol_type, service, flag
LABEL_MODES = ("binary", "5-class")
CLASSES_5 = ("normal", "dos", "probe", "r2l", "u2r")
ATTACK_CATEGORY = {
    **dict.fromkeys(
        ("apache2 back land mailbomb neptune pod processtable smurf teardrop udpstorm worm").split(), "dos"
    ),
    **dict.fromkeys("ipsweep mscan nmap portsweep saint satan".split(), "probe"),
    **dict.fromkeys(
        (
            "ftp_write guess_passwd httptunnel imap multihop named phf sendmail snmpgetattack "
            "snmpguess spy warezclient warezmaster xlock xsnoop"
        ).split(),
        "r2l",
    ),
    **dict.fromkeys("buffer_overflow loadmodule perl ps rootkit sqlattack xterm".split(), "u2r"),
    "normal": "normal",
}


def read_rows(path: Path) -> list[list[str]]:
    """The file's rows, each checked to have 43 columns; errors name the file and line."""
    if path.exists() and not path.is_file():
        raise DataError(f"{path}: not a regular file")
    if not path.is_file():
        raise DataError(
            f"{path}: NSL-KDD file not found (expected {TRAIN_FILE} and {TEST_FILE} in data.data_dir)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != NUM_COLUMNS:
            raise DataError(f"{path}:{number}: {len(fields)} columns, expected {NUM_COLUMNS}")
        rows.append((number, fields))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def _encode(path: Path, rows, categories: list[list[str]], label_mode: str) -> tuple[np.ndarray, np.ndarray]:
    numeric_columns = [c for c in range(41) if c not in CATEGORICAL]
    width = len(numeric_columns) + sum(len(c) for c in categories)
    x = np.zeros((len(rows), width), dtype=np.float64)
    y = np.zeros(len(rows), dtype=np.int64)
    index = [{name: i for i, name in enumerate(cats)} for cats in categories]
    offsets = np.cumsum([len(numeric_columns)] + [len(c) for c in categories])[:-1]
    for r, (number, fields) in enumerate(rows):
        try:
            x[r, : len(numeric_columns)] = [float(fields[c]) for c in numeric_columns]
        except ValueError:
            bad = next(fields[c] for c in numeric_columns if not _is_number(fields[c]))
            raise DataError(f"{path}:{number}: {bad!r} is not a number") from None
        for k, column in enumerate(CATEGORICAL):
            value = fields[column]
            if value not in index[k]:
                raise DataError(
                    f"{path}:{number}: category {value!r} of column {column + 1} is not in {TRAIN_FILE}"
                )
            x[r, offsets[k] + index[k][value]] = 1.0
        attack = fields[41].rstrip(".")
        if attack not in ATTACK_CATEGORY:
            raise DataError(f"{path}:{number}: unknown attack name {attack!r}")
        category = ATTACK_CATEGORY[attack]
        y[r] = (category != "normal") if label_mode == "binary" else CLASSES_5.index(category)
    return x, y


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_nslkdd(data_dir: str | None = None, label_mode: str = "binary") -> Dataset:
    """Load NSL-KDD from ``data_dir`` as a :class:`~fedhet.data.dataset.Dataset`."""
    if label_mode not in LABEL_MODES:
        raise DataError(f"data.label_mode = {label_mode!r}: unknown (known: {', '.join(LABEL_MODES)})")
    if not data_dir:
        raise DataError(
            f"dataset nsl-kdd: set data.data_dir to the folder holding {TRAIN_FILE} and {TEST_FILE}"
        )
    folder = Path(data_dir)
    train_rows = read_rows(folder / TRAIN_FILE)
    test_rows = read_rows(folder / TEST_FILE)
    categories = [sorted({fields[c] for _, fields in train_rows}) for c in CATEGORICAL]
    x_train, y_train = _encode(folder / TRAIN_FILE, train_rows, categories, label_mode)
    x_test, y_test = _encode(folder / TEST_FILE, test_rows, categories, label_mode)
    low, high = x_train.min(axis=0), x_train.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    x_train = np.where(high > low, (x_train - low) / span, 0.0)
    x_test = np.where(high > low, (x_test - low) / span, 0.0)  # train ranges; test may leave [0, 1]
    return Dataset(
        name="nsl-kdd",
        x_train=torch.from_numpy(x_train.astype(np.float32)),
        y_train=torch.from_numpy(y_train),
        x_test=torch.from_numpy(x_test.astype(np.float32)),
        y_test=torch.from_numpy(y_test),
        num_classes=2 if label_mode == "binary" else 5,
    )


@dataclass
class NslKddOptions:
    """``data_dir``: the folder of KDDTrain+.txt and KDDTest+.txt; ``label_mode``: "binary"
    or "5-class". Features are always min-max scaled on the training file."""

    data_dir: str = ""
    label_mode: str = "binary"
    normalize: str = "dataset"  # the only one: tabular features are always min-max scaled

    def validate(self) -> None:
        one_of("data.label_mode", self.label_mode, LABEL_MODES)
        if self.normalize != "dataset":
            raise ConfigError(
                f"data.normalize = {self.normalize!r}: nsl-kdd is tabular; its features are "
                "always standardised (only 'dataset' applies)"
            )


@register("dataset")
class NslKdd(DatasetSource):
    """NSL-KDD network intrusion records (tabular, 122 features after one-hot encoding)."""

    name = "nsl-kdd"
    Options = NslKddOptions

    @classmethod
    def build(cls, options: NslKddOptions, ctx=None) -> Dataset:
        return load_nslkdd(options.data_dir or None, options.label_mode)

    @classmethod
    def source_files(cls, options: NslKddOptions) -> Path | None:
        return Path(options.data_dir).expanduser() if options.data_dir else None
