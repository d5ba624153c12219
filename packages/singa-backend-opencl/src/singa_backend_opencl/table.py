"""The OpenCL kernel table: singa.gpu's shared GPU kernels, plus matrix products and convolution.

Every primitive but these comes from `singa.gpu.table`, compiled from the shared sources after this backend's prelude
(kernels/common.cl). Matrix products of float32 (and float16, through float32 copies) go to CLBlast (the portable
kernel of gemm.cl where CLBlast is missing, and for integers); convolutions unfold their input with kernels/conv.cl
(im2col / col2im) and multiply with the same GEMM.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from singa import kernel_checks
from singa.gpu import table as gpu
from singa.gpu.table import (
    F16,
    F32,
    F64,
    FLOATS,
    I32,
    I32_,
    I64,
    I64_,
    ITEMSIZE,
    SUFFIX,
    _cast,
    _contiguous,
    _dtype_error,
    _fill,
    _new,
)
from singa_backend_opencl import build, clblast

# program kinds of this backend only (the shared ones are in singa.gpu.table.SOURCES)
SOURCES: dict[str, Callable] = {"conv": lambda dev, dt: gpu.real_types(dt) + build.read_source("conv.cl")}


def source_of(program: str, dev) -> str:
    """The OpenCL C source (without common.cl) of a program such as 'ew:add:float32' or 'conv:float32'."""
    return gpu.source_of(program, dev, SOURCES)


# -- matrix products ----------------------------------------------------------------------------------------------


_BLAS = {F32: ("S", "float[]"), F64: ("D", "double[]")}


def _gemm(dev, dt: int, a, b, c, m: int, n: int, k: int, ta: bool, tb: bool, alpha: float, beta: float,
          offsets: list) -> None:
    """float32 or float64 (`dt`) products C_i = alpha op(A_i) op(B_i) + beta C_i of (a offset, b offset, c offset)
    triples, on the ClBuffers a, b, c with natural leading dimensions (row-major)."""
    lda, ldb, ldc = (m if ta else k), (k if tb else n), n
    lib = clblast.lib
    if lib is None:  # the portable kernel, one product at a time
        kern = dev.kernel(f"gemm:{SUFFIX[dt]}", "sg_gemm")
        for ao, bo, co in offsets:
            gpu.own_gemm(dev, kern, a, ao, b, bo, c, co, 1, 1, 1, m, n, k, ta, tb, alpha, beta)
        return
    tra = clblast.TRANS if ta else clblast.NO_TRANS
    trb = clblast.TRANS if tb else clblast.NO_TRANS
    q = dev.queue_ptr
    p, scalars = _BLAS[dt]
    if len(offsets) == 1:
        ao, bo, co = offsets[0]
        clblast.check(getattr(lib, f"CLBlast{p}gemm")(clblast.ROW_MAJOR, tra, trb, m, n, k, alpha, a.mem, ao, lda,
                                                      b.mem, bo, ldb, beta, c.mem, co, ldc, q, clblast.ffi.NULL),
                      f"{p}gemm {m}x{n}x{k}")
        return
    steps = [tuple(y - x for x, y in zip(offsets[i], offsets[i + 1])) for i in range(len(offsets) - 1)]
    if all(s == steps[0] for s in steps) and min(steps[0]) >= 0:
        (ao, bo, co), (sa, sb, sc) = offsets[0], steps[0]
        clblast.check(getattr(lib, f"CLBlast{p}gemmStridedBatched")(
            clblast.ROW_MAJOR, tra, trb, m, n, k, alpha, a.mem, ao, lda, sa, b.mem, bo, ldb, sb, beta, c.mem, co, ldc,
            sc, len(offsets), q, clblast.ffi.NULL), f"{p}gemmStridedBatched {m}x{n}x{k}")
        return
    count = len(offsets)
    ffi = clblast.ffi
    clblast.check(getattr(lib, f"CLBlast{p}gemmBatched")(
        clblast.ROW_MAJOR, tra, trb, m, n, k, ffi.new(scalars, [alpha] * count), a.mem,
        ffi.new("size_t[]", [o[0] for o in offsets]), lda, b.mem, ffi.new("size_t[]", [o[1] for o in offsets]), ldb,
        ffi.new(scalars, [beta] * count), c.mem, ffi.new("size_t[]", [o[2] for o in offsets]), ldc, count, q,
        ffi.NULL), f"{p}gemmBatched {m}x{n}x{k} x{count}")


def _matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
    setup = gpu.matmul_setup(out, a, b, trans_a, trans_b, alpha, beta, (F32, F16, I32_, I64_, F64))
    if setup is None:
        return
    a, b, batch, ba, bb, m, n, k = setup
    dev = out.buffer.device
    dt = a.dtype
    ta, tb = bool(trans_a), bool(trans_b)
    if dt in FLOATS and clblast.lib is not None:
        if dt == F16:  # through float32 copies: CLBlast's half product would also accumulate in half
            fa, fb, fo = _new(dev, a.shape, F32), _new(dev, b.shape, F32), _new(dev, out.shape, F32)
            _cast(fa, a)
            _cast(fb, b)
            if beta != 0:
                _cast(fo, out)
            _matmul_real(dev, fa, fb, fo, batch, ba, bb, m, n, k, ta, tb, alpha, beta)
            _cast(out, fo)
            return
        _matmul_real(dev, a, b, out, batch, ba, bb, m, n, k, ta, tb, alpha, beta)
        return
    gpu.own_gemm(dev, dev.kernel(f"gemm:{SUFFIX[dt]}", "sg_gemm"), a.buffer.handle, a.offset, b.buffer.handle,
                 b.offset, out.buffer.handle, out.offset, batch, ba, bb, m, n, k, ta, tb, alpha, beta)


def _matmul_real(dev, a, b, out, batch, ba, bb, m, n, k, ta, tb, alpha, beta) -> None:
    """A float32 or float64 product through CLBlast."""
    ah, bh, ch = a.buffer.handle, b.buffer.handle, out.buffer.handle
    if batch > 1 and ba == batch and bb == 1 and not ta:
        # a stack of row-major matrices times one matrix is one taller product
        _gemm(dev, a.dtype, ah, bh, ch, batch * m, n, k, ta, tb, alpha, beta, [(a.offset, b.offset, out.offset)])
        return
    offsets = [(a.offset + (0 if ba == 1 else i * m * k), b.offset + (0 if bb == 1 else i * k * n),
                out.offset + i * m * n) for i in range(batch)]
    _gemm(dev, a.dtype, ah, bh, ch, m, n, k, ta, tb, alpha, beta, offsets)


# -- convolution --------------------------------------------------------------------------------------------------

_CONV = struct.Struct("<16q")  # sg_conv of kernels/conv.cl
COL_BUDGET = 1 << 24  # floats in one unfolded chunk (64 MiB)


class _Geometry(kernel_checks.ConvGeometry):
    def __init__(self, name, x_shape, w_shape, y_shape, stride, padding, dilation, groups, views):
        super().__init__("opencl", name, x_shape, w_shape, y_shape, stride, padding, dilation, groups, views)
        self.packed = _CONV.pack(self.N, self.C, self.H, self.W, self.K, self.kh, self.kw, self.OH, self.OW, self.sh,
                                 self.sw, self.pt, self.pl, self.dh, self.dw, self.G)

    def chunk(self, per_image: int) -> int:
        return max(1, min(self.N, COL_BUDGET // max(per_image, 1)))


def _conv_args(name: str, dts, views) -> None:
    dev = views[0].buffer.device
    dt = views[0].dtype
    if dt not in FLOATS or any(v is not None and v.dtype != dt for v in views) or dt not in dev.dtypes:
        raise _dtype_error(name, views, FLOATS)


def _as_f32(v):
    """float32 view of a float16 view (a converted copy; float32 and float64 views are used as they are)."""
    if v is None or v.dtype != F16:
        return v
    f = _new(v.buffer.device, v.shape, F32)
    _cast(f, v)
    return f


def _conv2d(out, x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (out, x, w, b)
    _conv_args("conv2d", FLOATS, views)
    x, w, b = _contiguous(x), _contiguous(w), _contiguous(b)
    g = _Geometry("conv2d", x.shape, w.shape, out.shape, stride, padding, dilation, groups, views)
    if g.N * g.K * g.ohw == 0:
        return
    if out.dtype == F16:
        y = _new(out.buffer.device, out.shape, F32)
        _conv2d_real(g, y, _as_f32(x), _as_f32(w), _as_f32(b))
        _cast(out, y)
        return
    _conv2d_real(g, out, x, w, b)


def _conv2d_real(g: _Geometry, y, x, w, b) -> None:
    dev = y.buffer.device
    if g.ckk == 0:  # nothing to correlate: the bias alone
        if b is None:
            _fill(y, 0.0)
        else:
            _conv_bias(dev, g, y, b, 1)
        return
    nb = g.chunk(g.rows * g.ohw)
    dt, isz = y.dtype, ITEMSIZE[y.dtype]
    col = None if g.pointwise else dev.alloc(nb * g.rows * g.ohw * isz)
    for n0 in range(0, g.N, nb):
        cnt = min(nb, g.N - n0)
        if g.pointwise:  # x itself is the unfolded matrix
            src, base = x.buffer.handle, x.offset + n0 * g.C * g.hw
        else:
            _im2col(dev, g, x, n0, cnt, col, g.rows * g.ohw, g.ohw)
            src, base = col.handle, 0
        offsets = [(w.offset + gi * g.Kg * g.ckk, base + (i * g.rows + gi * g.ckk) * g.ohw,
                    y.offset + ((n0 + i) * g.K + gi * g.Kg) * g.ohw) for i in range(cnt) for gi in range(g.G)]
        _gemm(dev, dt, w.buffer.handle, src, y.buffer.handle, g.Kg, g.ohw, g.ckk, False, False, 1.0, 0.0, offsets)
    if b is not None:
        _conv_bias(dev, g, y, b, 0)


def _conv_bias(dev, g: _Geometry, y, b, set_: int) -> None:
    rows = g.N * g.K
    dev.launch(dev.kernel(f"conv:{SUFFIX[y.dtype]}", "sg_conv_bias"), rows,
               (I64(rows), I64(g.K), I64(g.ohw), y.buffer.handle.arg, I64(y.offset), b.buffer.handle.arg, I64(b.offset),
                I32(set_)))


def _im2col(dev, g: _Geometry, x, n0: int, nb: int, col, col_sn: int, col_sr: int) -> None:
    total = nb * g.rows * g.OH  # one work-item per output row of each unfolded row
    dev.launch(dev.kernel(f"conv:{SUFFIX[x.dtype]}", "sg_im2col"), total,
               (g.packed, I64(n0), I64(nb), x.buffer.handle.arg, I64(x.offset), col.handle.arg, I64(0), I64(col_sn),
                I64(col_sr)))


def _conv2d_backward_data(dx, dy, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dx, dy, w)
    _conv_args("conv2d_backward_data", FLOATS, views)
    dy, w = _contiguous(dy), _contiguous(w)
    g = _Geometry("conv2d_backward_data", dx.shape, w.shape, dy.shape, stride, padding, dilation, groups, views)
    if g.N * g.C * g.hw == 0:
        return
    if g.ohw == 0 or g.K == 0 or g.kh * g.kw == 0:
        _fill(dx, 0.0)
        return
    if dx.dtype == F16:
        f = _new(dx.buffer.device, dx.shape, F32)
        _conv_bwd_data_real(g, f, _as_f32(dy), _as_f32(w))
        _cast(dx, f)
        return
    _conv_bwd_data_real(g, dx, dy, w)


def _conv_bwd_data_real(g: _Geometry, dx, dy, w) -> None:
    dev = dx.buffer.device
    nb = g.chunk(g.rows * g.ohw)
    dt, isz = dx.dtype, ITEMSIZE[dx.dtype]
    col = None if g.pointwise else dev.alloc(nb * g.rows * g.ohw * isz)
    for n0 in range(0, g.N, nb):
        cnt = min(nb, g.N - n0)
        # column gradient of image i, group gi: w_g^T (ckk, Kg) @ dy_(i, g) (Kg, ohw); pointwise: dx itself
        target, base = (dx.buffer.handle, dx.offset + n0 * g.C * g.hw) if g.pointwise else (col.handle, 0)
        offsets = [(w.offset + gi * g.Kg * g.ckk, dy.offset + ((n0 + i) * g.K + gi * g.Kg) * g.ohw,
                    base + (i * g.rows + gi * g.ckk) * g.ohw) for i in range(cnt) for gi in range(g.G)]
        _gemm(dev, dt, w.buffer.handle, dy.buffer.handle, target, g.ckk, g.ohw, g.Kg, True, False, 1.0, 0.0, offsets)
        if not g.pointwise:
            total = cnt * g.C * g.H  # one work-item per row of dx
            dev.launch(dev.kernel(f"conv:{SUFFIX[dt]}", "sg_col2im"), total,
                       (g.packed, I64(n0), I64(cnt), col.handle.arg, I64(0), I64(g.rows * g.ohw), I64(g.ohw),
                        dx.buffer.handle.arg, I64(dx.offset)))


def _conv2d_backward_weight(dw, dy, x, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dw, dy, x)
    _conv_args("conv2d_backward_weight", FLOATS, views)
    dy, x = _contiguous(dy), _contiguous(x)
    g = _Geometry("conv2d_backward_weight", x.shape, dw.shape, dy.shape, stride, padding, dilation, groups, views)
    if g.K * g.ckk == 0:
        return
    if g.N == 0 or g.ohw == 0:
        _fill(dw, 0.0)
        return
    if dw.dtype == F16:
        f = _new(dw.buffer.device, dw.shape, F32)
        _conv_bwd_weight_real(g, f, _as_f32(dy), _as_f32(x))
        _cast(dw, f)
        return
    _conv_bwd_weight_real(g, dw, dy, x)


def _conv_bwd_weight_real(g: _Geometry, dw, dy, x) -> None:
    dev = dw.buffer.device
    nb = g.chunk((g.rows + g.K) * g.ohw)
    dt, isz = dw.dtype, ITEMSIZE[dw.dtype]
    col = dev.alloc(nb * g.rows * g.ohw * isz)
    dyt = dev.alloc(nb * g.K * g.ohw * isz) if nb > 1 else None
    for n0 in range(0, g.N, nb):
        cnt = min(nb, g.N - n0)
        L = cnt * g.ohw
        # unfolded rows (C*kh*kw, images * ohw), so group gi's block is the contiguous (ckk, L) at gi * ckk * L
        _im2col(dev, g, x, n0, cnt, col, g.ohw, L)
        if cnt > 1:  # dy of the chunk as (K, images * ohw)
            dev.launch(dev.kernel(f"conv:{SUFFIX[dt]}", "sg_batch_to_rows"), g.K * cnt,
                       (I64(g.K), I64(g.ohw), I64(n0), I64(cnt), dy.buffer.handle.arg, I64(dy.offset),
                        dyt.handle.arg))
            dsrc, dbase = dyt.handle, 0
        else:
            dsrc, dbase = dy.buffer.handle, dy.offset + n0 * g.K * g.ohw
        # dw_g (Kg, ckk) (+)= dy_g (Kg, L) @ col_g^T (L, ckk)
        offsets = [(dbase + gi * g.Kg * L, gi * g.ckk * L, dw.offset + gi * g.Kg * g.ckk) for gi in range(g.G)]
        _gemm(dev, dt, dsrc, col.handle, dw.buffer.handle, g.Kg, g.ckk, L, False, True, 1.0, 0.0 if n0 == 0 else 1.0,
              offsets)


kernels: dict[str, Callable] = gpu.assemble("opencl", globals())
