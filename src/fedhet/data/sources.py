"""Dataset loaders: digits (bundled with scikit-learn), fmnist and mnist (IDX files).

Every loader returns a :class:`Dataset` of in-memory tensors; clients are index arrays into
it (data stays put: no per-client copies). Missing or corrupt files raise
:class:`~fedhet.errors.DataError` with one line that names the file. Each source registers
itself as a ``dataset`` plug-in with its options (``data_dir``, ``normalize``).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.checks import one_of, path_option
from fedhet.data.compact import ByteImages, channel_moments, scaled_images
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.errors import DataError
from fedhet.registry import register

# Standard folder of Debian's `dataset-fashion-mnist` package.
FMNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IDX_UBYTE = 0x08


def check_data_file(path: Path) -> None:
    """A data file must exist and be a regular file (a folder, a FIFO or a device would
    hang or mislead a reader); errors name the file."""
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")


def read_data_file(path: Path) -> bytes:
    """The bytes of a data file, with one-line errors (missing, not a file, unreadable)."""
    check_data_file(path)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """Read one IDX file (gzipped or not) of unsigned bytes into an array.

    Checks the magic number, the number of dimensions and that the payload holds exactly the
    number of items the header announces; raises ``DataError`` naming ``path`` otherwise.
    """
    raw = read_data_file(path)
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: corrupt gzip data ({exc})") from None
    if len(raw) < 4:
        raise DataError(f"{path}: truncated: {len(raw)} bytes, no IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != IDX_UBYTE or ndim != expected_ndim:
        magic = int.from_bytes(raw[:4], "big")
        want = (IDX_UBYTE << 8) | expected_ndim
        raise DataError(f"{path}: wrong magic number 0x{magic:08x} (expected 0x{want:08x})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header ({len(raw)} bytes)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims))
    found = len(raw) - header
    if found != expected:
        kind = "truncated" if found < expected else "too long"
        raise DataError(f"{path}: {kind}: header announces {dims} = {expected} bytes, found {found}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.exists():
            return candidate
    raise DataError(f"{folder / stem}[.gz]: file not found")


def load_idx_folder(name: str, folder: str | Path, num_classes: int = 10) -> Dataset:
    """Load the four standard MNIST-format IDX files of ``folder``.

    Images are scaled to [0, 1]; :func:`load_dataset` normalises them.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DataError(f"{folder}: data folder for {name} not found (set data.data_dir)")
    arrays = {}
    for key, stem in IDX_FILES.items():
        arrays[key] = read_idx(_find_idx(folder, stem), 3 if key.endswith("images") else 1)
    for split in ("train", "test"):
        n_img, n_lab = len(arrays[f"{split}_images"]), len(arrays[f"{split}_labels"])
        if n_img == 0:
            path = _find_idx(folder, IDX_FILES[f"{split}_images"])
            raise DataError(f"{path}: holds 0 images")
        if n_img != n_lab:
            path = _find_idx(folder, IDX_FILES[f"{split}_labels"])
            raise DataError(f"{path}: wrong count: {n_lab} labels for {n_img} images")
        labels = arrays[f"{split}_labels"]
        if labels.size and labels.max() >= num_classes:
            path = _find_idx(folder, IDX_FILES[f"{split}_labels"])
            raise DataError(f"{path}: label {labels.max()} out of range 0..{num_classes - 1}")
    train_shape, test_shape = arrays["train_images"].shape[1:], arrays["test_images"].shape[1:]
    if train_shape != test_shape:
        path = _find_idx(folder, IDX_FILES["test_images"])
        raise DataError(
            f"{path}: images are {test_shape[0]}x{test_shape[1]}, the training images "
            f"{train_shape[0]}x{train_shape[1]}"
        )
    return Dataset(
        name=name,
        x_train=byte_images(arrays["train_images"][:, None]),
        y_train=torch.from_numpy(arrays["train_labels"].astype(np.int64)),
        x_test=byte_images(arrays["test_images"][:, None]),
        y_test=torch.from_numpy(arrays["test_labels"].astype(np.int64)),
        num_classes=num_classes,
        images=True,
    )


def load_fmnist(data_dir: str | None = None) -> Dataset:
    """Fashion-MNIST from IDX files; defaults to Debian's `dataset-fashion-mnist` folder."""
    return load_idx_folder("fmnist", data_dir or FMNIST_DEBIAN_DIR)


def load_mnist(data_dir: str | None = None) -> Dataset:
    """MNIST from the standard IDX files in ``data_dir`` (required)."""
    if not data_dir:
        raise DataError("mnist: no data folder given (set data.data_dir to the IDX files' folder)")
    return load_idx_folder("mnist", data_dir)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images [1797, 8, 8] float64 in 0..16, labels [1797]).

    Read from the package's ``datasets/data/digits.csv.gz`` (64 pixels and the label per
    row), found without importing scikit-learn: its import, with SciPy's, would be most of
    the start of every worker process, Ray actor and Flower ClientApp that loads digits.
    Falls back to ``sklearn.datasets.load_digits`` where that file is not found."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as rows:
                table = np.loadtxt(rows, delimiter=",")
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    return bunch.images, bunch.target.astype(np.int64)


def digits_split_from_sklearn(labels: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of scikit-learn's stratified ``train_test_split`` with
    ``random_state=0``, in the order it returns them."""
    from sklearn.model_selection import train_test_split

    index = np.arange(len(labels))
    train, test = train_test_split(index, test_size=test_fraction, random_state=0, stratify=labels)
    return np.asarray(train), np.asarray(test)


def digits_split(labels: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The digits' fixed train/test split: at the default 0.2 the stored copy of
    :func:`digits_split_from_sklearn`'s answer (``fedhet.data.digits_split``, checked
    against scikit-learn by the tests), else scikit-learn's."""
    from fedhet.data.digits_split import TEST, TEST_FRACTION, TRAIN

    if test_fraction == TEST_FRACTION and len(labels) == len(TRAIN) + len(TEST):
        return np.asarray(TRAIN, dtype=np.int64), np.asarray(TEST, dtype=np.int64)
    return digits_split_from_sklearn(labels, test_fraction)


def load_digits(data_dir: str | None = None, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's 1,797 8x8 handwritten digits, a fixed stratified train/test split.

    The split uses a fixed random state so every run, whatever its seed, tests on the same
    images. Pixels (0..16) are scaled to [0, 1]; :func:`load_dataset` normalises them.
    """
    raw, labels = digits_arrays()
    images = raw.astype(np.float32) / 16.0
    train, test = digits_split(labels, test_fraction)
    return Dataset(
        name="digits",
        x_train=torch.from_numpy(images[train]).unsqueeze(1),
        y_train=torch.from_numpy(labels[train]),
        x_test=torch.from_numpy(images[test]).unsqueeze(1),
        y_test=torch.from_numpy(labels[test]),
        num_classes=10,
        images=True,
    )


CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 "python version" batch: a pickled dict with ``data`` (uint8, N x 3072,
    the red, green and blue 32x32 planes of each image) and ``labels`` (N ints 0..9).
    Returns images [N, 3, 32, 32] (uint8) and labels (int64); errors name the file."""
    import pickle

    if path.exists() and not path.is_file():
        raise DataError(f"{path}: not a regular file")
    try:
        with path.open("rb") as fh:
            batch = pickle.load(fh, encoding="bytes")
    except FileNotFoundError:
        raise DataError(f"{path}: CIFAR-10 batch file not found") from None
    except PermissionError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise DataError(f"{path}: not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict):
        raise DataError(f"{path}: not a CIFAR-10 python batch (holds {type(batch).__name__}, not a dict)")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DataError(f"{path}: CIFAR-10 batch lacks 'data' or 'labels'")
    data = np.asarray(data)
    labels = np.asarray(labels, dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: CIFAR-10 data must be uint8 N x 3072, got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{path}: wrong count: {labels.size} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(
            f"{path}: label {labels.max() if labels.max() > 9 else labels.min()} out of range 0..9"
        )
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(data_dir: str | None = None) -> Dataset:
    """CIFAR-10 from the "python version" batches (``data_batch_1..5``, ``test_batch``) in
    ``data_dir`` (required; the extracted ``cifar-10-batches-py`` folder or its parent).
    Pixels are scaled to [0, 1]; :func:`load_dataset` normalises them."""
    if not data_dir:
        raise DataError("cifar10: no data folder given (set data.data_dir to cifar-10-batches-py)")
    folder = Path(data_dir).expanduser()
    if (folder / "cifar-10-batches-py").is_dir():
        folder = folder / "cifar-10-batches-py"
    if not folder.is_dir():
        raise DataError(f"{folder}: data folder for cifar10 not found (set data.data_dir)")
    parts = [read_cifar_batch(folder / name) for name in CIFAR10_TRAIN_BATCHES]
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = read_cifar_batch(folder / CIFAR10_TEST_BATCH)
    return Dataset(
        name="cifar10",
        x_train=byte_images(np.concatenate([p[0] for p in parts])),
        y_train=torch.from_numpy(y_train),
        x_test=byte_images(x_test),
        y_test=torch.from_numpy(y_test),
        num_classes=10,
        images=True,
    )


@dataclass
class ImageOptions:
    """``normalize``: how pixels in [0, 1] are normalised (:data:`NORMALIZATIONS`)."""

    normalize: str = "dataset"

    def validate(self) -> None:
        one_of("data.normalize", self.normalize, NORMALIZATIONS)


@dataclass
class ImageFolderOptions(ImageOptions):
    """``data_dir``: the folder of the dataset's files; ``normalize`` as for every image set."""

    data_dir: str = path_option()


@register("dataset")
class Digits(DatasetSource):
    """scikit-learn's bundled 8x8 digits (1,797 images)."""

    name = "digits"
    Options = ImageOptions

    @classmethod
    def build(cls, options: ImageOptions, ctx=None) -> Dataset:
        return normalize_images(load_digits(), options.normalize)


class ImageFolder(DatasetSource):
    """Shared by the image datasets read from a folder."""

    Options = ImageFolderOptions
    default_folder: str = ""
    loader: Callable[[str | None], Dataset] | None = None  # reads the folder (None: the default one)

    @classmethod
    def build(cls, options: ImageFolderOptions, ctx=None) -> Dataset:
        """The dataset read from ``options.data_dir`` (or its default folder), normalised."""
        if cls.loader is None:
            raise NotImplementedError(f"dataset {cls.name!r} has no loader")
        return normalize_images(cls.loader(options.data_dir or None), options.normalize)

    @classmethod
    def source_files(cls, options: ImageFolderOptions) -> Path | None:
        folder = options.data_dir or cls.default_folder
        return Path(folder).expanduser() if folder else None


@register("dataset")
class FashionMNIST(ImageFolder):
    """Fashion-MNIST (IDX files; default: Debian's dataset-fashion-mnist folder)."""

    name = "fmnist"
    default_folder = FMNIST_DEBIAN_DIR
    loader = staticmethod(load_fmnist)


@register("dataset")
class MNIST(ImageFolder):
    """MNIST (the standard IDX files in data_dir)."""

    name = "mnist"
    loader = staticmethod(load_mnist)


@register("dataset")
class CIFAR10(ImageFolder):
    """CIFAR-10 (the python batches in data_dir)."""

    name = "cifar10"
    loader = staticmethod(load_cifar10)


def subsample(dataset: Dataset, fraction: float, rng: np.random.Generator) -> Dataset:
    """Keep a random ``fraction`` of the train and of the test examples (the training
    examples as rows of the same features: :meth:`Dataset.selected`)."""
    if fraction >= 1.0:
        return dataset
    keep_tr = np.sort(rng.permutation(dataset.num_train)[: max(1, round(fraction * dataset.num_train))])
    n_te = int(dataset.x_test.shape[0])
    keep_te = np.sort(rng.permutation(n_te)[: max(1, round(fraction * n_te))])
    return replace(dataset.selected(keep_tr), x_test=dataset.x_test[keep_te], y_test=dataset.y_test[keep_te])


def split_validation(dataset: Dataset, fraction: float, rng: np.random.Generator) -> Dataset:
    """Hold out a random ``fraction`` of the training examples as the set a run evaluates
    on (in place of the test split), for tuning without looking at the test set; the rest
    is what the clients share, as rows of the same features (:meth:`Dataset.selected`: no
    copy of them). ``fraction`` 0 returns the dataset as it is."""
    if not fraction:
        return dataset
    n = dataset.num_train
    held = round(fraction * n)
    if not 0 < held < n:
        raise DataError(
            f"data.validation_fraction = {fraction:g}: holds out {held} of {n} training examples; "
            "it must leave at least one on each side"
        )
    order = rng.permutation(n)
    validation, train = np.sort(order[:held]), np.sort(order[held:])
    return replace(
        dataset.selected(train),
        x_test=dataset.train_features(validation),
        y_test=dataset.y_train[torch.from_numpy(validation)],
    )


# How image pixels (in [0, 1]) are normalised: "dataset" standardises each channel with the
# training split's mean and std; "half" is the common (x - 0.5) / 0.5 (pixels in [-1, 1], the
# transform of SALF's public code); "none" keeps [0, 1].
NORMALIZATIONS = ("dataset", "half", "none")


def normalize_images(dataset: Dataset, mode: str) -> Dataset:
    """Normalise a dataset's [0, 1] pixels by ``mode`` (one of :data:`NORMALIZATIONS`), per
    channel; statistics come from the training split only, so no test information leaks.
    In place: the loader's tensors, just decoded, are the ones normalised (no second copy
    of the images at the load's peak), so pass a dataset nothing else holds."""
    if mode not in NORMALIZATIONS:
        raise DataError(f"unknown normalisation {mode!r} (known: {', '.join(NORMALIZATIONS)})")
    if not dataset.images or mode == "none":
        return dataset
    channels = int(dataset.x_train.shape[1])
    if mode == "half":
        mean, std = [0.5] * channels, [0.5] * channels
    else:
        mean, std = _channel_moments(dataset.x_train)
    mean_of = torch.tensor(mean).view(1, -1, 1, 1)
    std_of = torch.tensor([value or 1.0 for value in std]).view(1, -1, 1, 1)
    return replace(
        dataset,
        x_train=_normalized(dataset.x_train, mean_of, std_of),
        x_test=_normalized(dataset.x_test, mean_of, std_of),
        images=False,
    )


def byte_images(codes: np.ndarray) -> ByteImages:
    """uint8 images (N x C x H x W) kept as their bytes, standing for ``code / 255``."""
    return scaled_images(torch.from_numpy(np.require(codes, requirements=["C", "W"])), 255.0)


def _channel_moments(images: torch.Tensor | ByteImages) -> tuple[list[float], list[float]]:
    """Each channel's mean and standard deviation of the pixels, as NumPy's ``mean`` and
    ``std`` of the float32 pixels give them. Byte images are not decoded for it where a
    sample of them shows :func:`~fedhet.data.compact.channel_moments` adding as NumPy does."""
    if isinstance(images, ByteImages) and _moments_agree(images):
        codes, table = images.codes.numpy(), images.table.numpy()
        moments = [channel_moments(codes, table, c) for c in range(codes.shape[1])]
        return [m for m, _ in moments], [s for _, s in moments]
    x = images.decoded().numpy() if isinstance(images, ByteImages) else images.numpy()
    channels = [x[:, c] for c in range(x.shape[1])]
    return [float(ch.mean()) for ch in channels], [float(ch.std()) for ch in channels]


def _moments_agree(images: ByteImages, sample: int = 2000) -> bool:
    """Whether the byte-wise moments equal NumPy's on the first ``sample`` images."""
    part = images.codes[:sample].numpy()
    x, table = images[:sample].numpy(), images.table.numpy()
    return all(
        channel_moments(part, table, c) == (float(x[:, c].mean()), float(x[:, c].std()))
        for c in range(part.shape[1])
    )


def _normalized(images: torch.Tensor | ByteImages, mean: torch.Tensor, std: torch.Tensor):
    """``(images - mean) / std`` per channel: in place for a float tensor (the loader's, just
    decoded: no second copy at the peak), in the table for byte images (the same float32
    operations on each of a channel's 256 values)."""
    if isinstance(images, ByteImages):
        return images.normalized(mean.view(-1), std.view(-1))
    return images.sub_(mean).div_(std)


# The last datasets loaded in this process, by source, options and the state of their files:
# the runs of a grid that share a dataset (every cell a worker runs) decode it once.
# Datasets are never modified in place (partitions, subsets and relabelling make new arrays).
_LOADED: dict[tuple, Dataset] = {}
_LOADED_MAX = 2


def _files_signature(folder: Path | None) -> tuple:
    """Names, sizes and modification times of the files a dataset is read from (two folder
    levels), so that a changed or replaced file is read again."""
    if folder is None:
        return ()
    signature = []
    try:
        for path in sorted([*folder.glob("*"), *folder.glob("*/*")]):
            if path.is_file():
                stat = path.stat()
                signature.append((str(path), stat.st_size, stat.st_mtime_ns))
    except OSError:
        return ("unreadable",)
    return tuple(signature)


def open_dataset(source: Any, options: Any) -> Dataset:
    """The dataset of plug-in class ``source`` with ``options``, checked; the last two
    loaded are kept in memory while their files stay unchanged."""
    import dataclasses

    values = tuple((f.name, repr(getattr(options, f.name))) for f in dataclasses.fields(options))
    key = (
        f"{source.__module__}:{source.__qualname__}",
        values,
        _files_signature(source.source_files(options)),
    )
    if key in _LOADED:
        return _LOADED[key]
    dataset = checked(source.build(options, None))
    if len(_LOADED) >= _LOADED_MAX:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = dataset
    return dataset


def load_dataset(name: str, data_dir: str | None = None, **options) -> Dataset:
    """Load dataset ``name`` (any registered dataset plug-in) with its options given as
    keywords (``data_dir``, ``normalize``, ``label_mode``, ...)."""
    from fedhet.checks import typed_options
    from fedhet.registry import resolve

    if data_dir:
        options["data_dir"] = str(data_dir)
    entry = resolve("dataset", name, "data.dataset")
    return open_dataset(entry.cls, typed_options(entry.cls.Options, options, "data", f"dataset {name}"))


def checked(dataset: Dataset) -> Dataset:
    """Refuse a dataset no run can use: an empty split, or test examples shaped unlike the
    training ones."""
    where = dataset.name
    if dataset.num_train == 0 or int(dataset.x_test.shape[0]) == 0:
        split = "training" if dataset.num_train == 0 else "test"
        raise DataError(f"{where}: the {split} set holds 0 examples")
    if dataset.x_test.shape[1:] != dataset.x_train.shape[1:]:
        raise DataError(
            f"{where}: test examples have shape {tuple(dataset.x_test.shape[1:])}, "
            f"training examples {tuple(dataset.x_train.shape[1:])}"
        )
    return dataset
