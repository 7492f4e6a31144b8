"""Images kept as their bytes: :class:`ByteImages`, a dataset's pixels stored as uint8 codes
with a per-channel table of what each code stands for (the pixel scaled and normalised),
and the per-channel statistics of those pixels computed without decoding them all.

A uint8 image set is a quarter of its float32 decoding (Fashion-MNIST's training images:
47 MB against 188 MB), and every pixel value a run sees is one of 256 per channel: indexing
the table with the codes gives, bit for bit, the float the decoded tensor held, because the
table's entries are made by the same float32 operations the decoding applied to each pixel.
The statistics (:func:`channel_moments`) add the decoded values in the order NumPy's
``mean`` and ``std`` of the decoded array add them, so the normalisation, and every result
after it, is that of the decoded tensor too (a sample of the images checks this at load).
"""

from __future__ import annotations

import numpy as np
import torch

CODES = 256  # values a uint8 pixel takes
LEAF = 1 << 16  # elements a subtree of the pairwise sum decodes at once (bounded memory)


class ByteImages:
    """Images as uint8 ``codes`` (N x C x H x W) and a float ``table`` (C x 256): example
    ``i`` is ``table[c, codes[i, c]]`` in each channel ``c``. Indexing along the first axis
    (an int, a slice, an index tensor or array) returns float tensors, as indexing the
    decoded tensor would; :meth:`decoded` is the whole float tensor."""

    def __init__(self, codes: torch.Tensor, table: torch.Tensor, steps: Steps = ()):
        if codes.dtype != torch.uint8 or codes.dim() < 2:
            raise TypeError(
                f"ByteImages needs uint8 codes N x C x ..., got {codes.dtype} {tuple(codes.shape)}"
            )
        if tuple(table.shape) != (codes.shape[1], CODES):
            raise TypeError(f"ByteImages' table must be {codes.shape[1]} x {CODES}, got {tuple(table.shape)}")
        self.codes, self.table = codes, table
        self._single = table[0] if codes.shape[1] == 1 else None  # one channel: its row
        channels = codes.shape[1]
        # channel c's entries start at c * 256 in the flat table
        self._offsets = (torch.arange(channels, device=codes.device) * CODES).view(
            channels, *[1] * (codes.dim() - 2)
        )
        self.steps = tuple(steps)
        # the steps replayed on the codes, where they give every entry of the table bit for bit
        self._replay = [
            (op, values.to(table.dtype).view(channels, *[1] * (codes.dim() - 2)))
            for op, values in self.steps
        ] if self.steps and replays_table(self.steps, table) else None  # fmt: skip

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def dim(self) -> int:
        return self.codes.dim()

    def __getitem__(self, index) -> torch.Tensor:
        if type(index) is torch.Tensor and index.dim() == 1 and not index.is_floating_point():
            return self.decode(self.codes.index_select(0, index))  # a client's batch: the common case
        if isinstance(index, tuple):  # examples first, then within them
            rows = self[index[0]]
            return rows[index[1:]] if isinstance(index[0], int) else rows[(slice(None), *index[1:])]
        if isinstance(index, np.ndarray):
            index = torch.from_numpy(index)
            if index.dim() == 1 and not index.is_floating_point() and index.dtype != torch.bool:
                return self[index]  # index_select: advanced indexing costs as much as the decoding
        return self.decode(self.codes[index])

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        """The examples at ``index`` (``dim`` 0 only), as ``Tensor.index_select``."""
        if dim != 0:
            raise TypeError("ByteImages are selected along their first axis only")
        return self.decode(self.codes.index_select(0, index))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The float values of ``codes`` (any number of leading axes before C x H x W): the
        table's float32 steps replayed on the codes where they make the table (an element-wise
        division and subtraction cost less than a lookup: 0.66 against 1.12 ms for 3,000
        Fashion-MNIST images), else the table looked up."""
        if self._replay is not None:
            values = codes.to(self.table.dtype)
            for op, operand in self._replay:
                values = values.div_(operand) if op == "div" else values.sub_(operand)
            return values
        if self._single is not None:
            flat = self._single.index_select(0, codes.reshape(-1).long())
        else:
            flat = self.table.view(-1).index_select(0, (codes.long() + self._offsets).reshape(-1))
        return flat.view(codes.shape)

    def decoded(self) -> torch.Tensor:
        """Every image as one float tensor (a new one)."""
        return self.decode(self.codes)

    def new_empty(self, size, **kwargs) -> torch.Tensor:
        """An uninitialised float tensor on this set's device, as ``Tensor.new_empty``."""
        return self.table.new_empty(size, **kwargs)

    def to(self, device) -> ByteImages:
        """These images on ``device`` (codes, table and its steps)."""
        steps = tuple((op, values.to(device)) for op, values in self.steps)
        return ByteImages(self.codes.to(device), self.table.to(device), steps)

    def with_table(self, table: torch.Tensor) -> ByteImages:
        """The same codes standing for other values (looked up in ``table``)."""
        return ByteImages(self.codes, table)

    def normalized(self, mean: torch.Tensor, std: torch.Tensor) -> ByteImages:
        """The same codes standing for ``(value - mean) / std`` per channel (``mean`` and
        ``std``: one float32 value per channel): the table's entries, and its steps, made
        by those float32 operations."""
        channels = self.codes.shape[1]
        mean, std = mean.reshape(channels), std.reshape(channels)
        table = self.table.clone().sub_(mean.view(-1, 1)).div_(std.view(-1, 1))
        return ByteImages(self.codes, table, (*self.steps, ("sub", mean), ("div", std)))


Features = torch.Tensor | ByteImages  # what a dataset's features may be held as
Steps = tuple[tuple[str, torch.Tensor], ...]  # float32 operations on a table: ("div" | "sub", per channel)
STEP_OPS = ("div", "sub")


def replays_table(steps: Steps, table: torch.Tensor, repeats: int = 5) -> bool:
    """Whether ``steps``, applied in order to every code (as a float of the table's dtype),
    give the table's entries bit for bit. The codes are checked in a row of ``repeats`` x
    256 + 3 per channel, so that vectorised and leftover elements of a kernel both meet
    every code."""
    channels = table.shape[0]
    if any(op not in STEP_OPS or values.numel() != channels for op, values in steps):
        return False
    codes = (torch.arange(repeats * CODES + 3, device=table.device) % CODES).repeat(channels, 1)
    values = codes.to(table.dtype)
    for op, operand in steps:
        operand = operand.to(device=table.device, dtype=table.dtype).view(channels, 1)
        values = values.div_(operand) if op == "div" else values.sub_(operand)
    return torch.equal(values, torch.gather(table, 1, codes))


def scaled_table(channels: int, scale: float) -> torch.Tensor:
    """Each code's value ``code / scale`` in float32, as NumPy divides a float32 array of the
    codes by ``scale`` (C x 256, the same row per channel)."""
    values = np.arange(CODES, dtype=np.float32)
    values /= scale
    return torch.from_numpy(np.tile(values, (channels, 1)))


def scaled_images(codes: torch.Tensor, scale: float) -> ByteImages:
    """uint8 ``codes`` (N x C x ...) standing for ``code / scale`` in float32."""
    channels = codes.shape[1]
    steps = (("div", torch.full((channels,), scale, dtype=torch.float32)),)
    return ByteImages(codes, scaled_table(channels, scale), steps)


def _pairwise(values, start: int, count: int) -> np.float32:
    """NumPy's pairwise sum of ``count`` contiguous float32 values from ``start``
    (``values(lo, hi)`` decodes that range): the same split of the range in halves rounded
    down to a multiple of 8 as NumPy's reduction, down to subtrees of at most :data:`LEAF`
    elements that NumPy adds itself, so the float32 result is NumPy's to the last bit."""
    if count <= LEAF:
        return np.add.reduce(values(start, start + count))
    half = count // 2
    half -= half % 8
    return np.float32(_pairwise(values, start, half) + _pairwise(values, start + half, count - half))


def _buffered(values, count: int) -> np.float32:
    """NumPy's sum of a strided (not contiguous) float32 array of ``count`` elements: its
    iterator copies ``np.getbufsize()`` elements at a time, adds each buffer pairwise and
    the buffers' sums one after another."""
    size, total = np.getbufsize(), np.float32(0.0)
    for start in range(0, count, size):
        total = np.float32(total + np.add.reduce(values(start, min(start + size, count))))
    return total


def channel_moments(codes: np.ndarray, table: np.ndarray, channel: int) -> tuple[float, float]:
    """The mean and standard deviation of channel ``channel`` of the decoded images
    (``table[channel][codes[:, channel]]``), equal to the bits to NumPy's ``mean()`` and
    ``std()`` of the decoded float32 array's ``[:, channel]`` view, without decoding it."""
    plane = codes[:, channel].reshape(-1) if codes.shape[1] == 1 else None
    lookup = table[channel]
    count = codes[:, channel].size

    def values(lo: int, hi: int) -> np.ndarray:
        if plane is not None:
            return lookup[plane[lo:hi]]
        return lookup[_logical(codes, channel, lo, hi)]

    total = _pairwise(values, 0, count) if plane is not None else _buffered(values, count)
    mean = _divided(total, count)

    def squares(lo: int, hi: int) -> np.ndarray:
        deviation = values(lo, hi) - mean
        return deviation * deviation

    variance = _divided(_pairwise(squares, 0, count), count)
    return float(mean), float(np.sqrt(variance))


def _divided(total: np.float32, count: int) -> np.float32:
    """``total / count`` as NumPy's ``mean`` and ``var`` divide a float32 sum by their count
    (an ``intp``): in float64, rounded back to float32."""
    return np.float32(np.float64(total) / np.float64(count))


def _logical(codes: np.ndarray, channel: int, lo: int, hi: int) -> np.ndarray:
    """Elements ``lo:hi`` of channel ``channel``'s codes in C order (image by image)."""
    per_image = int(np.prod(codes.shape[2:]))
    first, last = lo // per_image, -(-hi // per_image)
    block = codes[first:last, channel].reshape(-1)
    return block[lo - first * per_image : hi - first * per_image]
