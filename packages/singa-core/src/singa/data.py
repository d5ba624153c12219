"""Small data helpers: the MNIST IDX reader, a real handwritten-digit set that needs no download, a batch iterator.

* `read_idx(path)` reads one file in the IDX format of the original MNIST distribution (plain or gzip'd) into numpy;
  `load_mnist(folder)` loads the four MNIST files of a folder as training-ready arrays.
* `load_digits_28x28()` turns scikit-learn's bundled handwritten digits (1797 images of 8x8 pixels, shipped inside the
  scikit-learn wheel) into MNIST-shaped float32 images (N, 1, 28, 28), split into training and held-out sets.
  scikit-learn is needed for this function only (`pip install scikit-learn`); nothing else here imports it.
* `batches(x, y, batch_size, shuffle, seed)` yields mini-batches of numpy arrays.
* `shard(*arrays, rank, world_size)` gives one rank of a data-parallel job (`opt.DistOpt`) its part of a data set, and
  `shard_indices(n, rank, world_size)` the positions of that part (to read only those from a file).

Everything returns numpy arrays: copy them into tensors with `tensor.from_numpy` or `Tensor.copy_from_numpy`.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "load_mnist", "load_digits_28x28", "resize_bilinear", "batches", "shard", "shard_indices",
           "IDXFormatError", "MNIST_FILES", "IDX_DTYPES"]

# IDX type byte -> big-endian numpy dtype (the format as described with the MNIST database).
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# The four files of the MNIST distribution, by role.
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# MNIST's pixel mean and standard deviation after scaling to [0, 1] (the usual normalisation constants).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class IDXFormatError(ValueError):
    """A file that is not a well-formed IDX file; the message names the file and what is wrong."""


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    if head == b"\x1f\x8b":  # gzip magic, whatever the file is called
        try:
            with gzip.open(path, "rb") as f:
                return f.read()
        except (OSError, EOFError) as exc:
            raise IDXFormatError(f"{path}: corrupt gzip data ({exc})") from None
    return path.read_bytes()


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in an IDX file (MNIST's format), gzip'd or not, in native byte order.

    Layout: two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64),
    the number of dimensions, one big-endian uint32 per dimension, then the data, big-endian, row-major.
    Raises FileNotFoundError for a missing file and IDXFormatError (a ValueError) naming the file for a malformed one.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise IDXFormatError(f"{path}: {len(raw)} bytes is too short for an IDX header (4 bytes of magic number)")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0:
        raise IDXFormatError(f"{path}: bad magic number 0x{raw[:4].hex()}: an IDX file starts with two zero bytes")
    dtype = IDX_DTYPES.get(code)
    if dtype is None:
        known = ", ".join(f"0x{c:02X}" for c in IDX_DTYPES)
        raise IDXFormatError(f"{path}: unknown IDX data type code 0x{code:02X} (known: {known})")
    if ndim == 0:
        raise IDXFormatError(f"{path}: the header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXFormatError(f"{path}: truncated header: {ndim} dimensions need {header} bytes, the file has "
                             f"{len(raw)}")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header
    if got != expected:
        what = "truncated data" if got < expected else "trailing bytes after the data"
        raise IDXFormatError(f"{path}: {what}: shape {shape} of {dtype.newbyteorder('=').name} needs {expected} "
                             f"bytes, the file has {got}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))  # native order, and a writable copy


def _find(folder: Path, stem: str) -> Path:
    # The files are distributed as `train-images-idx3-ubyte(.gz)`; some mirrors write `train-images.idx3-ubyte`.
    alt = stem.replace("-idx", ".idx")
    for name in (stem, stem + ".gz", alt, alt + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder}: no {stem} or {stem}.gz (the MNIST files are train-images-idx3-ubyte, "
                            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte)")


def _images(arr: np.ndarray, path: Path, normalize: bool) -> np.ndarray:
    if arr.ndim != 3:
        raise IDXFormatError(f"{path}: expected images of shape (N, rows, cols), got {arr.shape}")
    x = arr.astype(np.float32)[:, None] / 255.0
    if normalize:
        x = (x - MNIST_MEAN) / MNIST_STD
    return x.astype(np.float32)


def load_mnist(folder: str | os.PathLike, normalize: bool = True) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test) from a folder holding the four MNIST IDX files (plain or .gz).

    Images become float32 (N, 1, 28, 28) scaled to [0, 1] and, with `normalize`, standardised with MNIST's mean and
    std (0.1307, 0.3081); labels become int32 (N,).
    """
    folder = Path(folder)
    out = []
    for split in ("train", "test"):
        ipath, lpath = _find(folder, MNIST_FILES[f"{split}_images"]), _find(folder, MNIST_FILES[f"{split}_labels"])
        images, labels = read_idx(ipath), read_idx(lpath)
        if labels.ndim != 1:
            raise IDXFormatError(f"{lpath}: expected labels of shape (N,), got {labels.shape}")
        if len(labels) != len(images):
            raise IDXFormatError(f"{lpath}: {len(labels)} labels for the {len(images)} images of {ipath}")
        out += [_images(images, ipath, normalize), labels.astype(np.int32)]
    return tuple(out)


def _bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of 1-D linear interpolation with pixel centres aligned (align_corners=False)."""
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1 - frac)
    np.add.at(m, (np.arange(n_out), hi), frac)
    return m


def resize_bilinear(images: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of the last two axes of `images` to `size` (separable: one matrix per axis), float64 out."""
    h, w = images.shape[-2:]
    rows, cols = _bilinear_matrix(h, size[0]), _bilinear_matrix(w, size[1])
    return np.einsum("ih,...hw,jw->...ij", rows, images.astype(np.float64), cols)


def load_digits_28x28(test_fraction: float = 0.2, seed: int = 0,
                      normalize: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): scikit-learn's handwritten digits as MNIST-shaped data, no download needed.

    The 1797 8x8 images (grey levels 0..16, shipped inside scikit-learn) are resized bilinearly to 28x28, scaled to
    [0, 1] and, with `normalize`, standardised with the mean and std of the training split (as MNIST is with its own).
    The split is stratified by class and deterministic for a given `seed`: `test_fraction` of each digit is held out.
    Images are float32 (N, 1, 28, 28), labels int32 (N,). Needs scikit-learn (`pip install scikit-learn`).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction}")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("singa.data.load_digits_28x28 needs scikit-learn, which ships the digits data: "
                          "pip install scikit-learn") from None
    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.float64) / 16.0
    labels = np.asarray(digits.target, dtype=np.int32)
    x = np.clip(resize_bilinear(images, (28, 28)), 0.0, 1.0)[:, None].astype(np.float32)

    rng = np.random.default_rng(seed)
    test_idx = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        test_idx.append(idx[:max(1, round(len(idx) * test_fraction))])
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[np.concatenate(test_idx)] = True
    train, test = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    train, test = train[rng.permutation(len(train))], test[rng.permutation(len(test))]

    x_train, x_test = x[train], x[test]
    if normalize:
        mean, std = float(x_train.mean()), float(x_train.std())
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return x_train.astype(np.float32), labels[train], x_test.astype(np.float32), labels[test]


def batches(x: np.ndarray, y: np.ndarray | None = None, batch_size: int = 64, shuffle: bool = False,
            seed: int | None = None, drop_last: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Yield (x_batch, y_batch) pairs over the first axis; `shuffle` permutes with `np.random.default_rng(seed)`.

    `drop_last=True` skips a final short batch (graph mode replays fixed shapes). Batches are contiguous copies.
    """
    n = len(x)
    if y is not None and len(y) != n:
        raise ValueError(f"batches: x has {n} rows but y has {len(y)}")
    if batch_size < 1:
        raise ValueError(f"batches: batch_size must be positive, got {batch_size}")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        idx = order[i:i + batch_size]
        yield np.ascontiguousarray(x[idx]), (None if y is None else np.ascontiguousarray(y[idx]))


def shard_indices(n: int, rank: int, world_size: int, shuffle: bool = True, seed: int = 0) -> np.ndarray:
    """The positions (sorted, int64) of rank `rank`'s part of `n` samples shared by `world_size` ranks.

    Every rank gets n // world_size samples (the n % world_size left over are dropped: ranks that ran different numbers
    of steps would wait for each other forever). With `shuffle`, the samples are first permuted by
    `np.random.default_rng(seed)`, the same on every rank (give them the same seed), so that each rank's part is a
    random sample of the whole set, not one block of a set sorted by class; then rank r takes every world_size-th one.
    """
    n, rank, world_size = int(n), int(rank), int(world_size)
    if world_size < 1:
        raise ValueError(f"shard: world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} is not a rank of a world of {world_size}")
    if n < world_size:
        raise ValueError(f"shard: {n} samples cannot be shared by {world_size} ranks (each needs at least one)")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    return np.sort(order[rank::world_size][: n // world_size])


def shard(*arrays: np.ndarray, rank: int, world_size: int, shuffle: bool = True,
          seed: int = 0) -> tuple[np.ndarray, ...]:
    """Rank `rank`'s part of each array (same rows for each: images and their labels stay together); see
    `shard_indices`. Typically `x, y = data.shard(x, y, rank=sgd.global_rank, world_size=sgd.world_size)`."""
    if not arrays:
        raise ValueError("shard: give at least one array")
    n = len(arrays[0])
    for i, a in enumerate(arrays[1:], start=1):
        if len(a) != n:
            raise ValueError(f"shard: array 0 has {n} rows but array {i} has {len(a)}")
    idx = shard_indices(n, rank, world_size, shuffle, seed)
    return tuple(np.ascontiguousarray(a[idx]) for a in arrays)
