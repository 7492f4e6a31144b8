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
    assert abs(float(ds.x_train.mean())) < 1e-4  # standardised with training statistics


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
def test_real_fashion_mnist_from_debian_package():
    ds = load_dataset("fmnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train.numpy()).tolist() == [6000] * 10
