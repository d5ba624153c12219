"""singa.data: the IDX reader on files written here (plain and gzip'd, every type code, malformed ones), load_mnist on
a generated MNIST folder, the bilinear resize, the digits loader and the batch iterator."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from singa import data

CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}


def idx_bytes(arr: np.ndarray, code: int | None = None) -> bytes:
    """The IDX encoding of `arr`, written from the format's description (not with singa.data)."""
    arr = np.asarray(arr)
    code = CODES[arr.dtype.type] if code is None else code
    head = struct.pack(">HBB", 0, code, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write(path, payload: bytes, gz: bool = False):
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("dtype", list(CODES), ids=lambda t: t.__name__)
def test_read_idx_roundtrip(tmp_path, dtype, gz):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    got = data.read_idx(write(tmp_path / "a.idx", idx_bytes(arr), gz))
    assert got.dtype == np.dtype(dtype).newbyteorder("=")
    assert got.shape == (3, 4, 5)
    np.testing.assert_array_equal(got, arr)
    got[0, 0, 0] = 1  # a writable, native-order copy


def test_read_idx_mnist_like_header_bytes(tmp_path):
    # The first bytes of MNIST's label file: magic 0x00000801, then the count; the data follow.
    labels = np.array([5, 0, 4, 1, 9], np.uint8)
    raw = bytes.fromhex("00000801") + (5).to_bytes(4, "big") + labels.tobytes()
    np.testing.assert_array_equal(data.read_idx(write(tmp_path / "l", raw)), labels)


@pytest.mark.parametrize(("payload", "message"), [
    (b"\x00\x00", "too short"),
    (b"\x01\x00\x08\x01\x00\x00\x00\x01\x00", "bad magic number"),
    (b"\x00\x00\x07\x01\x00\x00\x00\x01\x00", "unknown IDX data type code 0x07"),
    (b"\x00\x00\x08\x00", "0 dimensions"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x02", "truncated header"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x04\x01\x02", "truncated data"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x01\x01\x02", "trailing bytes"),
    (b"\x00\x00\x0d\x01\x00\x00\x00\x02" + b"\x00" * 7, "needs 8 bytes, the file has 7"),
])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_read_idx_malformed(tmp_path, payload, message, gz):
    path = write(tmp_path / "bad-file", payload, gz)
    with pytest.raises(ValueError, match=message) as info:
        data.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_corrupt_gzip_and_missing(tmp_path):
    path = write(tmp_path / "broken.gz", gzip.compress(idx_bytes(np.zeros(10, np.uint8)))[:-6])
    with pytest.raises(data.IDXFormatError, match="corrupt gzip") as info:
        data.read_idx(path)
    assert str(path) in str(info.value)
    with pytest.raises(FileNotFoundError):
        data.read_idx(tmp_path / "nope")


def make_mnist(folder, n_train=6, n_test=4, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n, dtype=np.uint8)
        out[split] = (x, y)
        suffix = ".gz" if gz else ""
        write(folder / (data.MNIST_FILES[f"{split}_images"] + suffix), idx_bytes(x), gz)
        write(folder / (data.MNIST_FILES[f"{split}_labels"] + suffix), idx_bytes(y), gz)
    return out


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_load_mnist(tmp_path, gz):
    raw = make_mnist(tmp_path, gz=gz)
    x_train, y_train, x_test, y_test = data.load_mnist(tmp_path)
    assert x_train.shape == (6, 1, 28, 28)
    assert x_test.shape == (4, 1, 28, 28)
    assert x_train.dtype == np.float32
    assert y_train.dtype == np.int32
    np.testing.assert_array_equal(y_train, raw["train"][1])
    np.testing.assert_array_equal(y_test, raw["test"][1])
    expected = (raw["train"][0][:, None] / 255.0 - data.MNIST_MEAN) / data.MNIST_STD
    np.testing.assert_allclose(x_train, expected, rtol=1e-5, atol=1e-6)
    x_plain = data.load_mnist(tmp_path, normalize=False)[2]
    np.testing.assert_allclose(x_plain, raw["test"][0][:, None] / 255.0, rtol=1e-6)


def test_load_mnist_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        data.load_mnist(tmp_path)
    make_mnist(tmp_path)
    lpath = tmp_path / data.MNIST_FILES["test_labels"]
    write(lpath, idx_bytes(np.zeros(3, np.uint8)))
    with pytest.raises(ValueError, match="3 labels for the 4 images") as info:
        data.load_mnist(tmp_path)
    assert str(lpath) in str(info.value)


def test_resize_bilinear():
    # Constant images stay constant; a linear ramp stays a ramp inside (edges clamp, as half-pixel resizers do).
    const = np.full((2, 8, 8), 0.25)
    np.testing.assert_allclose(data.resize_bilinear(const, (28, 28)), 0.25)
    ramp = np.tile(np.arange(4.0), (4, 1))  # columns 0, 1, 2, 3
    out = data.resize_bilinear(ramp, (4, 8))
    np.testing.assert_allclose(out[0], [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3])
    # The same size is the identity; against a direct per-pixel evaluation on random data.
    img = np.random.default_rng(0).random((5, 7))
    np.testing.assert_allclose(data.resize_bilinear(img, (5, 7)), img)
    out = data.resize_bilinear(img, (9, 3))
    for i in range(9):
        for j in range(3):
            sy = min(max((i + 0.5) * 5 / 9 - 0.5, 0), 4)
            sx = min(max((j + 0.5) * 7 / 3 - 0.5, 0), 6)
            y0, x0 = int(sy), int(sx)
            y1, x1 = min(y0 + 1, 4), min(x0 + 1, 6)
            fy, fx = sy - y0, sx - x0
            ref = ((1 - fy) * ((1 - fx) * img[y0, x0] + fx * img[y0, x1])
                   + fy * ((1 - fx) * img[y1, x0] + fx * img[y1, x1]))
            assert out[i, j] == pytest.approx(ref)


def test_load_digits_28x28():
    pytest.importorskip("sklearn")
    x_train, y_train, x_test, y_test = data.load_digits_28x28(test_fraction=0.2, seed=0)
    assert x_train.shape[1:] == (1, 28, 28)
    assert x_test.shape[1:] == (1, 28, 28)
    assert x_train.dtype == np.float32
    assert y_train.dtype == np.int32
    assert len(x_train) + len(x_test) == 1797
    assert len(x_test) == pytest.approx(1797 * 0.2, abs=10)
    # Stratified: every digit held out in about the same share.
    counts = np.bincount(y_test, minlength=10)
    assert counts.min() >= 30
    assert counts.max() <= 40
    # Normalised with the training split's statistics.
    assert abs(float(x_train.mean())) < 1e-4
    assert float(x_train.std()) == pytest.approx(1.0, abs=1e-4)
    # Deterministic for a seed, different for another; the unnormalised pixels lie in [0, 1].
    again = data.load_digits_28x28(test_fraction=0.2, seed=0)
    np.testing.assert_array_equal(again[0], x_train)
    np.testing.assert_array_equal(again[3], y_test)
    assert not np.array_equal(data.load_digits_28x28(seed=1)[3], y_test)
    raw = data.load_digits_28x28(normalize=False)[0]
    assert raw.min() >= 0.0
    assert raw.max() <= 1.0
    assert raw.max() > 0.9
    # The images are the digits: the 28x28 image scaled back down is close to sklearn's 8x8 original.
    from sklearn.datasets import load_digits

    originals = {tuple(np.round(im.ravel(), 6)) for im in load_digits().images / 16.0}
    back = data.resize_bilinear(raw[:20, 0], (8, 8))
    for im in back:
        best = min(np.abs(np.array(o) - im.ravel()).mean() for o in originals)
        assert best < 0.1


def test_load_digits_bad_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        data.load_digits_28x28(test_fraction=1.5)


def test_batches():
    x = np.arange(10 * 3).reshape(10, 3)
    y = np.arange(10)
    got = list(data.batches(x, y, 4))
    assert [len(b[0]) for b in got] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in got]), x)
    assert [len(b[0]) for b in data.batches(x, y, 4, drop_last=True)] == [4, 4]
    shuffled = list(data.batches(x, y, 3, shuffle=True, seed=7))
    xs = np.concatenate([b[0] for b in shuffled])
    ys = np.concatenate([b[1] for b in shuffled])
    np.testing.assert_array_equal(xs[:, 0] // 3, ys)  # rows stay paired with their labels
    assert sorted(ys.tolist()) == list(range(10))
    assert ys.tolist() != list(range(10))
    again = np.concatenate([b[1] for b in data.batches(x, y, 3, shuffle=True, seed=7)])
    np.testing.assert_array_equal(again, ys)
    assert all(b[1] is None for b in data.batches(x, None, 5))
    with pytest.raises(ValueError, match="10 rows but y has 9"):
        list(data.batches(x, y[:9], 2))
    with pytest.raises(ValueError, match="batch_size"):
        list(data.batches(x, y, 0))
