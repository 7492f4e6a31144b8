"""Loaders read the real file formats and reject corrupt files with one clear line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from conftest import write_idx, write_idx_dataset

from fedhet.data import load_dataset
from fedhet.data.sources import FMNIST_DEBIAN_DIR, read_idx
from fedhet.errors import DataError


@pytest.mark.parametrize("name", ["mnist", "fmnist"])
@pytest.mark.parametrize("compress", [True, False])
def test_idx_loader_reads_gzipped_and_plain_files(tmp_path, name, compress):
    folder = write_idx_dataset(tmp_path / "d", n_train=50, n_test=10, compress=compress)
    ds = load_dataset(name, str(folder))
    assert ds.x_train.shape == (50, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)
    assert ds.y_train.dtype.is_floating_point is False and int(ds.y_train.max()) <= 9
    assert abs(float(ds.x_train.decoded().mean())) < 1e-4  # standardised with training statistics


def test_idx_values_round_trip(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "a-idx3-ubyte", array, compress=True)
    assert np.array_equal(read_idx(path, 3), array)


def _corrupt(folder: Path, kind: str) -> Path:
    target = folder / "train-images-idx3-ubyte.gz"
    raw = gzip.decompress(target.read_bytes())
    if kind == "truncated":
        raw = raw[:-100]
    elif kind == "magic":
        raw = b"\x00\x00\x09\x03" + raw[4:]
    target.write_bytes(gzip.compress(raw))
    return target


@pytest.mark.parametrize("name", ["mnist", "fmnist"])
@pytest.mark.parametrize(("kind", "words"), [("truncated", "truncated"), ("magic", "wrong magic number")])
def test_corrupt_idx_file_is_rejected_naming_the_file(idx_folder, name, kind, words):
    target = _corrupt(idx_folder, kind)
    with pytest.raises(DataError) as info:
        load_dataset(name, str(idx_folder))
    message = str(info.value)
    assert str(target) in message and words in message and "\n" not in message


def test_label_count_mismatch_is_rejected(tmp_path):
    folder = write_idx_dataset(tmp_path / "d", n_train=30, n_test=10)
    write_idx(folder / "train-labels-idx1-ubyte", np.zeros(29), compress=True)
    with pytest.raises(DataError, match="wrong count: 29 labels for 30 images"):
        load_dataset("mnist", str(folder))


def test_missing_folder_and_file_are_named(tmp_path):
    with pytest.raises(DataError, match="data folder for mnist not found"):
        load_dataset("mnist", str(tmp_path / "nowhere"))
    folder = write_idx_dataset(tmp_path / "d")
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.*not found"):
        load_dataset("mnist", str(folder))


def test_corrupt_gzip_is_rejected(idx_folder):
    target = idx_folder / "train-labels-idx1-ubyte.gz"
    target.write_bytes(target.read_bytes()[:20])
    with pytest.raises(DataError, match="corrupt gzip"):
        load_dataset("mnist", str(idx_folder))


def test_digits_is_bundled_and_split_fixed():
    a, b = load_dataset("digits"), load_dataset("digits")
    assert a.x_train.shape[1:] == (1, 8, 8) and a.num_train + len(a.y_test) == 1797
    assert np.array_equal(a.y_test.numpy(), b.y_test.numpy())


@pytest.mark.skipif(not Path(FMNIST_DEBIAN_DIR).is_dir(), reason="dataset-fashion-mnist not installed")
def test_digits_read_without_scikit_learn_equal_scikit_learns_split():
    """The stored split and the direct read of the CSV file give, image for image and in
    the same order, what scikit-learn's load_digits and stratified train_test_split
    (random_state=0) give: the split every digits result was run on."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    from fedhet.data.sources import digits_arrays, digits_split_from_sklearn, load_digits

    bunch = sk_load_digits()
    raw, labels = digits_arrays()
    assert np.array_equal(raw, bunch.images) and np.array_equal(labels, bunch.target)
    images = bunch.images.astype(np.float32) / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, bunch.target, test_size=0.2, random_state=0, stratify=bunch.target
    )
    mine = load_digits()
    assert np.array_equal(mine.x_train.squeeze(1).numpy(), x_tr) and np.array_equal(mine.y_train, y_tr)
    assert np.array_equal(mine.x_test.squeeze(1).numpy(), x_te) and np.array_equal(mine.y_test, y_te)
    # another fraction is scikit-learn's split, computed
    train, test = digits_split_from_sklearn(labels, 0.3)
    other = load_digits(test_fraction=0.3)
    assert len(other.y_test) == len(test) == 540 and np.array_equal(other.y_train.numpy(), labels[train])


def test_loading_digits_imports_neither_scikit_learn_nor_scipy():
    """A worker process, Ray actor or Flower ClientApp that loads digits starts without
    scikit-learn's and SciPy's imports (about 1 s of each such start)."""
    import subprocess
    import sys

    code = (
        "import sys; from fedhet.data import load_dataset; import fedhet.engine.loop; "
        "load_dataset('digits'); print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_real_fashion_mnist_from_debian_package():
    ds = load_dataset("fmnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train.numpy()).tolist() == [6000] * 10


def _write_cifar(folder: Path, per_batch: int = 4, seed: int = 0) -> dict:
    """The real CIFAR-10 "python version" layout: pickled dicts with bytes keys."""
    import pickle

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)],
        }
        with (folder / name).open("wb") as fh:
            pickle.dump(batch, fh, protocol=2)
        written[name] = batch
    return written


def test_cifar10_loader_reads_python_batches(tmp_path):
    written = _write_cifar(tmp_path / "cifar-10-batches-py")
    data = load_dataset("cifar10", str(tmp_path))  # the parent folder works too
    assert data.input_shape == (3, 32, 32) and data.num_train == 20 and len(data.y_test) == 4
    assert data.y_train[:4].tolist() == written["data_batch_1"][b"labels"]
    # the red plane of the first image, standardised per channel: order of pixels is kept
    red = written["data_batch_1"][b"data"][0, :1024].reshape(32, 32).astype(np.float32)
    got = data.x_train[0, 0].numpy()
    assert np.corrcoef(red.ravel(), got.ravel())[0, 1] > 0.999


@pytest.mark.parametrize(
    ("damage", "words"),
    [("truncate", "not a CIFAR-10 python batch"), ("delete", "not found"), ("labels", "wrong count")],
)
def test_bad_cifar10_batch_is_rejected_naming_the_file(tmp_path, damage, words):
    import pickle

    folder = tmp_path / "cifar"
    _write_cifar(folder)
    target = folder / "data_batch_3"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete":
        target.unlink()
    else:
        batch = pickle.loads(target.read_bytes(), encoding="bytes")
        batch[b"labels"] = batch[b"labels"][:-1]
        target.write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError, match=words) as info:
        load_dataset("cifar10", str(folder))
    assert "data_batch_3" in str(info.value)


def test_vgg11_trains_on_cifar_shaped_input(tmp_path):
    import torch

    from fedhet.models import FlatModel, build_model

    _write_cifar(tmp_path / "c")
    data = load_dataset("cifar10", str(tmp_path / "c"))
    flat = FlatModel(build_model("vgg11", data.input_shape, 10))
    out = flat.model(data.x_train[:4])
    assert out.shape == (4, 10) and torch.isfinite(out).all()


def test_a_test_set_with_no_images_is_refused_naming_the_file(tmp_path):
    folder = write_idx_dataset(tmp_path / "d", n_train=30, n_test=10)
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((0, 28, 28)), compress=True)
    write_idx(folder / "t10k-labels-idx1-ubyte", np.zeros(0), compress=True)
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz: holds 0 images"):
        load_dataset("mnist", str(folder))


def test_test_images_of_another_size_are_refused_naming_the_file(tmp_path):
    folder = write_idx_dataset(tmp_path / "d", n_train=30, n_test=10)
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((10, 27, 27)), compress=True)
    with pytest.raises(
        DataError, match="t10k-images-idx3-ubyte.gz: images are 27x27, the training images 28x28"
    ):
        load_dataset("mnist", str(folder))


def test_a_fifo_in_place_of_a_data_file_is_refused_without_waiting(tmp_path):
    """A named pipe would block a reader forever; it is refused as not a regular file."""
    import os

    folder = write_idx_dataset(tmp_path / "d", compress=False)
    target = folder / "train-labels-idx1-ubyte"
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(DataError, match="train-labels-idx1-ubyte: not a regular file"):
        load_dataset("mnist", str(folder))


def test_normalisations_map_pixels_as_documented(tmp_path):
    """'none' keeps pixel/255, 'half' maps it to 2 x - 1 (SALF's public code), 'dataset'
    standardises each channel with training statistics only (test mean is not forced to 0)."""
    written = _write_cifar(tmp_path / "cifar-10-batches-py")
    raw = written["data_batch_1"][b"data"][0].reshape(3, 32, 32).astype(np.float32) / 255.0
    none = load_dataset("cifar10", str(tmp_path), normalize="none")
    half = load_dataset("cifar10", str(tmp_path), normalize="half")
    dataset = load_dataset("cifar10", str(tmp_path), normalize="dataset")
    assert np.allclose(none.x_train[0].numpy(), raw)
    assert np.allclose(half.x_train[0].numpy(), 2 * raw - 1, atol=1e-6)
    x = dataset.x_train.decoded().numpy()
    assert np.allclose(x.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    assert np.allclose(x.std(axis=(0, 2, 3)), 1, atol=1e-4)
    pixels = none.x_train.decoded().numpy()
    mean, std = pixels.mean(axis=(0, 2, 3)), pixels.std(axis=(0, 2, 3))
    expected_test = (none.test_features().numpy() - mean[None, :, None, None]) / std[None, :, None, None]
    assert np.allclose(dataset.test_features().numpy(), expected_test, atol=1e-5)


def test_a_normalisation_for_tabular_data_is_refused_in_one_line():
    from fedhet.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="data.normalize = 'half': nsl-kdd is tabular"):
        from_dict({"data": {"dataset": "nsl-kdd", "normalize": "half"}, "algorithm": {"name": "fedavg"}})
    with pytest.raises(ConfigError, match="data.normalize"):
        from_dict({"data": {"normalize": "mean"}, "algorithm": {"name": "fedavg"}})
