"""The CUDA kernel table: singa.gpu's shared GPU kernels, plus cuBLAS matrix products and cuDNN convolutions.

Every primitive but these comes from `singa.gpu.table`, compiled by NVRTC from the shared sources after this
backend's prelude (kernels/prelude.cuh). Float matrix products go to cuBLAS (float16 on the tensor cores, float32
without TF32 unless it is switched on), integer ones to the portable kernel of gemm.cl; convolutions and their
gradients go to cuDNN with one plan per shape (cudnn.Plan: the fastest algorithm measured once).
"""

from __future__ import annotations

from collections.abc import Callable

from singa import dtypes, kernel_checks
from singa.backend import View, contiguous_strides
from singa.gpu import table as gpu
from singa.gpu.table import F16, F32, F64, FLOATS, I32_, I64_, SUFFIX, _copy, _dtype_error, _fill, _new
from singa_backend_cuda import cudnn


def source_of(program: str, dev) -> str:
    """The CUDA C++ source (without the prelude) of a program such as 'ew:add:float32' or 'pool:float16'."""
    return gpu.source_of(program, dev)


def _ptr(v) -> int:
    """The device address of a view's first element."""
    return v.buffer.handle.ptr + v.offset * dtypes.itemsize(v.dtype)


# -- matrix products ----------------------------------------------------------------------------------------------


def _matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
    setup = gpu.matmul_setup(out, a, b, trans_a, trans_b, alpha, beta, (F32, F16, F64, I32_, I64_))
    if setup is None:
        return
    a, b, batch, ba, bb, m, n, k = setup
    dev = out.buffer.device
    ta, tb = bool(trans_a), bool(trans_b)
    if a.dtype not in FLOATS:
        gpu.own_gemm(dev, dev.kernel(f"gemm:{SUFFIX[a.dtype]}", "sg_gemm"), a.buffer.handle, a.offset,
                     b.buffer.handle, b.offset, out.buffer.handle, out.offset, batch, ba, bb, m, n, k, ta, tb, alpha,
                     beta)
        return
    blas = dev.blas()
    name = SUFFIX[a.dtype]
    with dev.stream_lock:
        if batch > 1 and ba == batch and bb == 1 and not ta:  # a stack of row-major matrices times one: one product
            blas.gemm(name, ta, tb, batch * m, n, k, alpha, _ptr(a), 0, _ptr(b), 0, beta, _ptr(out), 1)
        else:
            blas.gemm(name, ta, tb, m, n, k, alpha, _ptr(a), 0 if ba == 1 else m * k, _ptr(b),
                      0 if bb == 1 else k * n, beta, _ptr(out), batch)


# -- convolution --------------------------------------------------------------------------------------------------


def _conv_views(name: str, views: tuple) -> None:
    dev = views[0].buffer.device
    dt = views[0].dtype
    if dt not in FLOATS or any(v is not None and v.dtype != dt for v in views) or dt not in dev.dtypes:
        raise _dtype_error(name, views, FLOATS)


class _Conv:
    """A convolution as cuDNN runs it: symmetric padding (ph, pw) over x, or over a padded copy of x of height
    `hp` and width `wp` when the declared padding is asymmetric (ONNX SAME_UPPER, say) or has rows no window reads."""

    def __init__(self, name: str, x_shape, w_shape, y_shape, stride, padding, dilation, groups, views):
        g = kernel_checks.ConvGeometry("cuda", name, x_shape, w_shape, y_shape, stride, padding, dilation, groups,
                                       views)
        self.g = g
        need_h = (g.OH - 1) * g.sh + g.dh * (g.kh - 1) + 1  # padded extent the output windows read
        need_w = (g.OW - 1) * g.sw + g.dw * (g.kw - 1) + 1

        def fits(size, pad, k, s, d, out):
            return (size + 2 * pad - d * (k - 1) - 1) // s + 1 == out

        # symmetric padding that gives the declared output: cuDNN reads x in place (extra declared padding at the
        # bottom or right that no window reaches does not matter)
        self.direct = fits(g.H, g.pt, g.kh, g.sh, g.dh, g.OH) and fits(g.W, g.pl, g.kw, g.sw, g.dw, g.OW)
        if self.direct:
            self.pad = (g.pt, g.pl)
            self.xp_shape = (g.N, g.C, g.H, g.W)
        else:
            self.pad = (0, 0)
            self.xp_shape = (g.N, g.C, need_h, need_w)
        self.y_shape = (g.N, g.K, g.OH, g.OW)
        self.w_shape = (g.K, g.Cg, g.kh, g.kw)

    def interior(self, xp) -> tuple[View, tuple]:
        """(the part of the padded copy that holds x's rows and columns, the shape of x's part that is read)."""
        g = self.g
        h = min(g.H, self.xp_shape[2] - g.pt)
        w = min(g.W, self.xp_shape[3] - g.pl)
        st = contiguous_strides(self.xp_shape)
        return View(xp.buffer, xp.dtype, (g.N, g.C, h, w), st, xp.offset + g.pt * st[2] + g.pl * st[3]), (h, w)

    def padded(self, x):
        """x itself, or a zero-padded copy of it of shape xp_shape."""
        if self.direct:
            return x
        xp = _new(x.buffer.device, self.xp_shape, x.dtype)
        _fill(xp, 0)
        inner, (h, w) = self.interior(xp)
        src = View(x.buffer, x.dtype, (self.g.N, self.g.C, h, w), x.strides, x.offset)
        _copy(inner, src)
        return xp

    def run(self, direction: str, x, w, y) -> None:
        """One cuDNN call on the (padded) x, w and y views: forward writes y, data writes x, filter writes w."""
        dev = y.buffer.device
        g = self.g
        dt = SUFFIX[y.dtype]
        key = (direction, dt, self.xp_shape, self.w_shape, self.y_shape, self.pad, (g.sh, g.sw), (g.dh, g.dw), g.G,
               dev.tf32)
        plan, new = dev.conv_plan(key, lambda: cudnn.Plan(dt, direction, self.xp_shape, self.w_shape, self.y_shape,
                                                          self.pad, (g.sh, g.sw), (g.dh, g.dw), g.G, dev.tf32))
        handle = dev.dnn().handle
        with dev.stream_lock:
            if new:
                limit = dev.find_limit()
                scratch = dev.alloc(max(limit, 1))
                plan.find(handle, _ptr(x), _ptr(w), _ptr(y), scratch.handle.ptr, limit)
                del scratch
            while True:
                space = dev.workspace(plan.workspace)
                try:
                    plan.run(handle, _ptr(x), _ptr(w), _ptr(y), space.handle.ptr)
                    return
                except cudnn.CudnnError as e:
                    if not plan.drop(e):
                        raise


def _add_bias(out, b) -> None:
    """out += b over the channel axis, through the element-wise add with a broadcast view of b."""
    bias = View(b.buffer, b.dtype, out.shape, (0, 1, 0, 0), b.offset)
    out.buffer.device.table["add"](out, out, bias)


def _conv2d(out, x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (out, x, w, b)
    _conv_views("conv2d", views)
    x, w, b = gpu._contiguous(x), gpu._contiguous(w), gpu._contiguous(b)
    conv = _Conv("conv2d", x.shape, w.shape, out.shape, stride, padding, dilation, groups, views)
    g = conv.g
    if g.N * g.K * g.ohw == 0:
        return
    if g.ckk == 0:  # nothing to correlate: the bias alone
        _fill(out, 0)
    else:
        conv.run("forward", conv.padded(x), w, out)
    if b is not None:
        _add_bias(out, b)


def _conv2d_backward_data(dx, dy, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dx, dy, w)
    _conv_views("conv2d_backward_data", views)
    dy, w = gpu._contiguous(dy), gpu._contiguous(w)
    conv = _Conv("conv2d_backward_data", dx.shape, w.shape, dy.shape, stride, padding, dilation, groups, views)
    g = conv.g
    if g.N * g.C * g.hw == 0:
        return
    if g.ohw == 0 or g.K == 0 or g.kh * g.kw == 0:
        _fill(dx, 0)
        return
    if conv.direct:
        conv.run("data", dx, w, dy)
        return
    dxp = _new(dx.buffer.device, conv.xp_shape, dx.dtype)
    conv.run("data", dxp, w, dy)
    inner, (h, wd) = conv.interior(dxp)
    if (h, wd) != (g.H, g.W):
        _fill(dx, 0)  # rows or columns no window reads get no gradient
    _copy(View(dx.buffer, dx.dtype, inner.shape, dx.strides, dx.offset), inner)


def _conv2d_backward_weight(dw, dy, x, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dw, dy, x)
    _conv_views("conv2d_backward_weight", views)
    dy, x = gpu._contiguous(dy), gpu._contiguous(x)
    conv = _Conv("conv2d_backward_weight", x.shape, dw.shape, dy.shape, stride, padding, dilation, groups, views)
    g = conv.g
    if g.K * g.ckk == 0:
        return
    if g.N == 0 or g.ohw == 0:
        _fill(dw, 0)
        return
    conv.run("filter", conv.padded(x), dw, dy)


kernels: dict[str, Callable] = gpu.assemble("cuda", globals())
