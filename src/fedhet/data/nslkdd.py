"""NSL-KDD (network intrusion detection; the AMSFL paper's dataset) from the standard files
in a user's folder: the training file ``KDDTrain+.txt`` (125,973 rows) or its official 20%
subset ``KDDTrain+_20Percent.txt`` (25,192 rows), and the test file ``KDDTest+.txt``.

Each file is a headerless CSV of 43 columns: 41 features, the attack name and a difficulty
level. The three categorical features (protocol_type, service, flag: columns 2-4) are
one-hot encoded with the categories of the training file (122 features on the full data),
every feature is min-max scaled with the training file's ranges (constant columns become 0),
and labels are ``binary`` (normal = 0, attack = 1) or ``5-class`` (normal, DoS, Probe, R2L,
U2R by the standard map of attack names).

A test row whose category the training file never has (KDDTest+.txt has service ``tftp_u``,
which the 20% subset lacks) gets an all-zero one-hot block for that column, and one warning
line counts such rows. A malformed row, an empty or non-finite number (``nan``, ``inf``), a
category missing from a training row or an unknown attack name stops with one line naming
the file and the line.

``test_set = "official"`` tests on KDDTest+.txt, whose attack mix differs from training (a
centralised model that reaches ~0.97 on held-out training rows stays near 0.78 there);
``"holdout"`` tests on a stratified ``test_fraction`` of the training file instead (seeded by
``holdout_seed``, the same for every run), the protocol that matches accuracies of ~0.9.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.checks import one_of, path_option
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.errors import ConfigError, DataError
from fedhet.registry import register

TRAIN_FILE, TEST_FILE = "KDDTrain+.txt", "KDDTest+.txt"
TRAIN_20_FILE = "KDDTrain+_20Percent.txt"
TRAIN_FILES = (TRAIN_FILE, TRAIN_20_FILE)  # the first present is used
TEST_SETS = ("official", "holdout")
COLUMN_NAMES = {1: "protocol_type", 2: "service", 3: "flag"}
log = logging.getLogger("fedhet")
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


def read_rows(path: Path) -> list[tuple[int, list[str]]]:
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


def _encode(
    path: Path, rows, categories: list[list[str]], label_mode: str, unseen: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of ``rows``. A category outside ``categories`` is an error, or,
    when ``unseen`` (a dict) is given, an all-zero one-hot block, counted there by
    (column name, value), and the row in ``unseen["rows"]``."""
    numeric_columns = [c for c in range(41) if c not in CATEGORICAL]
    width = len(numeric_columns) + sum(len(c) for c in categories)
    x = np.zeros((len(rows), width), dtype=np.float64)
    y = np.zeros(len(rows), dtype=np.int64)
    index = [{name: i for i, name in enumerate(cats)} for cats in categories]
    offsets = np.cumsum([len(numeric_columns)] + [len(c) for c in categories])[:-1]
    for r, (number, fields) in enumerate(rows):
        row_unseen = False
        for c in numeric_columns:
            value = fields[c]
            if not value:
                raise DataError(f"{path}:{number}: column {c + 1} is empty")
            if not _is_number(value):
                raise DataError(f"{path}:{number}: {value!r} is not a number")
            if not math.isfinite(float(value)):
                raise DataError(f"{path}:{number}: column {c + 1} is {value!r}, not a finite number")
        x[r, : len(numeric_columns)] = [float(fields[c]) for c in numeric_columns]
        for k, column in enumerate(CATEGORICAL):
            value = fields[column]
            if not value:
                raise DataError(f"{path}:{number}: column {column + 1} ({COLUMN_NAMES[column]}) is empty")
            if value not in index[k]:
                if unseen is None:
                    raise DataError(
                        f"{path}:{number}: category {value!r} of column {column + 1} is not in the "
                        "training file"
                    )
                key = (COLUMN_NAMES[column], value)
                unseen[key] = unseen.get(key, 0) + 1
                row_unseen = True
                continue  # all-zero one-hot: a category the model never saw
            x[r, offsets[k] + index[k][value]] = 1.0
        if row_unseen and unseen is not None:
            unseen["rows"] = unseen.get("rows", 0) + 1
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


def training_file(folder: Path, name: str = "") -> Path:
    """The training file to read: ``name`` when given, else KDDTrain+.txt, else the 20% subset."""
    if name:
        if name not in TRAIN_FILES:
            raise DataError(f"data.train_file = {name!r}: unknown (known: {', '.join(TRAIN_FILES)})")
        return folder / name
    for candidate in TRAIN_FILES:
        if (folder / candidate).exists():
            return folder / candidate
    raise DataError(
        f"{folder}: no NSL-KDD training file (expected {TRAIN_FILE} or {TRAIN_20_FILE} in data.data_dir)"
    )


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask over ``labels`` marking a seeded, stratified ``fraction`` of the rows
    (per class, round(fraction * n_class) rows, at least one row of each class stays out)."""
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        take = min(int(round(fraction * len(rows))), len(rows) - 1)
        held[rng.choice(rows, take, replace=False)] = True
    return held


def load_nslkdd(
    data_dir: str | None = None,
    label_mode: str = "binary",
    train_file: str = "",
    test_set: str = "official",
    test_fraction: float = 0.2,
    holdout_seed: int = 0,
) -> Dataset:
    """Load NSL-KDD from ``data_dir`` as a :class:`~fedhet.data.dataset.Dataset`; its
    ``provenance`` names the training file read and the test set."""
    if label_mode not in LABEL_MODES:
        raise DataError(f"data.label_mode = {label_mode!r}: unknown (known: {', '.join(LABEL_MODES)})")
    if test_set not in TEST_SETS:
        raise DataError(f"data.test_set = {test_set!r}: unknown (known: {', '.join(TEST_SETS)})")
    if not data_dir:
        raise DataError(
            f"dataset nsl-kdd: set data.data_dir to the folder holding {TRAIN_FILE} (or {TRAIN_20_FILE}) "
            f"and {TEST_FILE}"
        )
    folder = Path(data_dir)
    train_path = training_file(folder, train_file)
    train_rows = read_rows(train_path)
    if test_set == "holdout":
        labels = np.array([ATTACK_CATEGORY.get(fields[41].rstrip("."), "?") for _, fields in train_rows])
        held = stratified_holdout(labels, test_fraction, holdout_seed)
        if not held.any():
            raise DataError(
                f"data.test_fraction = {test_fraction:g}: holds out no row of {train_path.name} "
                f"({len(train_rows)} rows)"
            )
        test_rows = [row for row, h in zip(train_rows, held, strict=True) if h]
        train_rows = [row for row, h in zip(train_rows, held, strict=True) if not h]
        test_path = train_path
    else:
        test_path = folder / TEST_FILE
        test_rows = read_rows(test_path)
    categories = [sorted({fields[c] for _, fields in train_rows}) for c in CATEGORICAL]
    x_train, y_train = _encode(train_path, train_rows, categories, label_mode)
    unseen: dict = {}
    x_test, y_test = _encode(test_path, test_rows, categories, label_mode, unseen)
    unseen_rows = unseen.pop("rows", 0)
    if unseen_rows:
        which = ", ".join(f"{column} {value!r} x{count}" for (column, value), count in sorted(unseen.items()))
        log.warning(
            "%s: %d test row%s a category absent from %s (%s); encoded as all-zero one-hot",
            test_path.name if test_set == "official" else f"{test_path.name} (held-out rows)",
            unseen_rows,
            " has" if unseen_rows == 1 else "s have",
            train_path.name,
            which,
        )
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
        provenance={
            "train_file": train_path.name,
            "test_set": test_set
            if test_set == "official"
            else f"holdout {test_fraction:g} of {train_path.name}",
            "train_rows": len(train_rows),
            "test_rows": len(test_rows),
            "test_rows_with_unseen_categories": unseen_rows,
        },
    )


@dataclass
class NslKddOptions:
    """``data_dir``: the folder of the training file (KDDTrain+.txt or KDDTrain+_20Percent.txt)
    and KDDTest+.txt; ``train_file``: which training file ("" = the full one if present, else
    the 20% subset); ``label_mode``: "binary" or "5-class"; ``test_set``: "official"
    (KDDTest+.txt) or "holdout" (a stratified ``test_fraction`` of the training file, drawn
    with ``holdout_seed``). Features are always min-max scaled on the training rows."""

    data_dir: str = path_option()
    train_file: str = ""
    label_mode: str = "binary"
    test_set: str = "official"
    test_fraction: float = 0.2
    holdout_seed: int = 0
    normalize: str = "dataset"  # the only one: tabular features are always min-max scaled

    def validate(self) -> None:
        one_of("data.label_mode", self.label_mode, LABEL_MODES)
        one_of("data.test_set", self.test_set, TEST_SETS)
        if self.train_file:
            one_of("data.train_file", self.train_file, TRAIN_FILES)
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"data.test_fraction = {self.test_fraction!r}: must be in (0, 1)")
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
        return load_nslkdd(
            options.data_dir or None,
            options.label_mode,
            train_file=options.train_file,
            test_set=options.test_set,
            test_fraction=options.test_fraction,
            holdout_seed=options.holdout_seed,
        )

    @classmethod
    def source_files(cls, options: NslKddOptions) -> Path | None:
        return Path(options.data_dir).expanduser() if options.data_dir else None
