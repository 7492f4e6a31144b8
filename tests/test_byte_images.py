"""Images kept as bytes (fedhet.data.compact): a run sees, bit for bit, the floats the decoded
and normalised tensor held, and the normalisation's statistics are NumPy's to the last bit."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_idx_dataset

from fedhet.data import sources
from fedhet.data.compact import LEAF, ByteImages, channel_moments, scaled_images, scaled_table
from fedhet.data.sources import FMNIST_DEBIAN_DIR, load_dataset


def decoded_the_old_way(codes: np.ndarray) -> np.ndarray:
    """What the loaders held before bytes: float32 pixels divided by 255 in place."""
    x = codes.astype(np.float32)
    x /= 255.0
    return x


@pytest.mark.parametrize(
    "shape",
    [(3, 1, 4, 4), (1797, 1, 8, 8), (2 * LEAF // 784 + 7, 1, 28, 28), (401, 3, 32, 32), (9, 3, 5, 7)],
)
def test_channel_moments_are_numpys_mean_and_std_to_the_bit(shape):
    """One channel is summed contiguously (pairwise, in subtrees above LEAF elements), several
    as a strided view (NumPy's buffered order): both must give NumPy's float32 exactly."""
    codes = np.random.default_rng(sum(shape)).integers(0, 256, shape).astype(np.uint8)
    x, table = decoded_the_old_way(codes), scaled_table(shape[1], 255.0).numpy()
    for channel in range(shape[1]):
        view = x[:, channel]
        assert channel_moments(codes, table, channel) == (float(view.mean()), float(view.std()))


def test_indexing_byte_images_gives_the_decoded_tensors_values():
    codes = np.random.default_rng(0).integers(0, 256, (20, 3, 4, 5)).astype(np.uint8)
    images = ByteImages(torch.from_numpy(codes), scaled_table(3, 255.0))
    dense = torch.from_numpy(decoded_the_old_way(codes))
    rows = np.array([4, 0, 19, 4])
    mask = np.arange(20) % 3 == 0
    for index in (
        3,
        slice(2, 9),
        torch.from_numpy(rows),
        rows,
        rows.astype(np.int32),
        mask,
        (2, 1),
        (slice(0, 5), 2, 3),
    ):
        assert torch.equal(images[index], dense[index]), index
    assert torch.equal(images.decoded(), dense)
    assert images.shape == dense.shape and images.dtype == torch.float32 and len(images) == 20
    again = pickle.loads(pickle.dumps(images))  # crosses to worker processes
    assert torch.equal(again[rows], dense[rows])


def test_decoding_replays_the_tables_steps_only_where_they_make_the_table():
    """Replaying the table's float32 steps on the codes gives the lookup's values bit for bit
    (every code, three channels, normalised); steps that do not make the table are not used."""
    codes = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (64, 3, 5, 7)).astype(np.uint8))
    mean, std = torch.tensor([0.2860, 0.5, 0.1], dtype=torch.float32), torch.tensor([0.353, 0.25, 0.7])
    images = scaled_images(codes, 255.0).normalized(mean, std)
    looked_up = ByteImages(codes, images.table)  # no steps: the table looked up
    assert images._replay is not None and looked_up._replay is None
    every_code = torch.arange(256, dtype=torch.uint8).repeat(3, 1).T.reshape(256, 3, 1, 1)
    everything = every_code.expand(256, 3, 5, 7)
    for index in (torch.arange(64), torch.tensor([3, 3, 0]), slice(1, 40)):
        assert torch.equal(images[index], looked_up[index])
    assert torch.equal(images.decode(everything.contiguous()), looked_up.decode(everything.contiguous()))
    wrong = ByteImages(codes, images.table, (("div", torch.full((3,), 254.0)),))
    assert wrong._replay is None and torch.equal(wrong[slice(0, 9)], looked_up[slice(0, 9)])
    assert images.to("cpu")._replay is not None


@pytest.mark.parametrize("normalize", ["dataset", "half", "none"])
def test_an_idx_set_kept_as_bytes_equals_the_decoded_normalised_one(tmp_path, normalize):
    """The table normalised by the same float32 operations the tensor was: the same bits."""
    folder = write_idx_dataset(tmp_path / "d", n_train=300, n_test=40, compress=False)
    data = load_dataset("mnist", str(folder), normalize=normalize)
    assert isinstance(data.x_train, ByteImages) and data.x_train.codes.dtype == torch.uint8
    assert data.x_train._replay is not None
    expected_train, expected_test = _normalised_the_old_way(folder, normalize)
    assert torch.equal(data.x_train.decoded(), expected_train)
    assert torch.equal(data.test_features(), expected_test)


def _normalised_the_old_way(folder: Path, normalize: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float tensors the IDX loader and ``normalize_images`` made before bytes."""
    read = {
        stem: decoded_the_old_way(sources.read_idx(sources._find_idx(folder, stem), 3))
        for stem in ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")
    }
    train, test = (
        torch.from_numpy(read["train-images-idx3-ubyte"]),
        torch.from_numpy(read["t10k-images-idx3-ubyte"]),
    )
    train, test = train.unsqueeze(1), test.unsqueeze(1)
    if normalize == "none":
        return train, test
    if normalize == "half":
        mean, std = torch.full((1, 1, 1, 1), 0.5), torch.full((1, 1, 1, 1), 0.5)
    else:
        pixels = train.numpy()[:, 0]
        mean = torch.tensor([float(pixels.mean())]).view(1, -1, 1, 1)
        std = torch.tensor([float(pixels.std())]).view(1, -1, 1, 1)
    return train.sub_(mean).div_(std), test.sub_(mean).div_(std)


def test_statistics_fall_back_to_decoding_where_the_sample_disagrees(tmp_path, monkeypatch):
    """Were NumPy to add in another order, the loader decodes and asks NumPy itself."""
    folder = write_idx_dataset(tmp_path / "d", n_train=120, n_test=10, compress=False)
    expected = load_dataset("mnist", str(folder)).x_train.decoded()
    sources._LOADED.clear()
    monkeypatch.setattr(sources, "_moments_agree", lambda images: False)
    assert torch.equal(load_dataset("mnist", str(folder)).x_train.decoded(), expected)
    sources._LOADED.clear()


@pytest.mark.skipif(
    not Path(FMNIST_DEBIAN_DIR).is_dir(), reason="Debian's dataset-fashion-mnist is not installed"
)
def test_real_fashion_mnist_as_bytes_is_the_decoded_set_bit_for_bit():
    data = load_dataset("fmnist")
    assert data.x_train.codes.numel() == 60000 * 784  # a quarter of the float32 pixels' bytes
    assert data.x_train._replay is not None  # decoded by its steps, not looked up
    expected_train, expected_test = _normalised_the_old_way(Path(FMNIST_DEBIAN_DIR), "dataset")
    assert torch.equal(data.x_train.decoded(), expected_train)
    assert torch.equal(data.test_features(), expected_test)
