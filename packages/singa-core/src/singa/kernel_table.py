"""The dispatch every backend's kernel table shares: element-wise kernels over views of any layout, and the table.

A backend supplies *launchers*, the glue that starts one of its compiled kernels, and the core does the rest:

    contig(n, out_handle, out_offset, in_handle, in_offset, ..., *params)
        every operand contiguous, n elements (offsets in elements; handles are `view.buffer.handle`)
    strided(nd, dims_and_strides, out_handle, out_offset, in_handle, in_offset, ..., *params)
        any strides: `dims_and_strides` is a list of nd sizes followed by nd strides per operand (output first, in
        elements; 0 for a broadcast axis), with size-1 axes dropped and mergeable neighbours merged

With `with_device=True` both are called with the device first (`contig(device, n, ...)`): launchers of a GPU backend
need it, the CPU's C functions do not. `max_dims` bounds `nd` for backends whose strided kernels walk a fixed number
of axes: longer layouts run as one launch per index of the leading axes.

`elementwise_kernel` turns one entry of `singa.expressions.TABLE` and its launchers (one per dtype code) into the
table's callable, keeping the common case (every operand contiguous with the output's shape) to a few attribute reads
and one launcher call: this is what a Python loop of small operations pays per call. `assemble` builds the whole
table from the backend's element-wise factory and its module's `_<primitive>` functions.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

from singa import dtypes, expressions, primitives
from singa.backend import View
from singa.kernel_args import LAYOUTS, coalesce, elementwise_error, elementwise_out_dtypes, layout

Launcher = Callable[..., None]


def run_layout(contig: Launcher, strided: Launcher, shape: tuple, views: tuple, extra: tuple = (), *,
               device=None, max_dims: int = 0) -> None:
    """Run an element-wise kernel over views of any strides, all of `shape`; `extra` are its trailing arguments.
    `device` is passed first to the launchers when given."""
    n = math.prod(shape)
    if n == 0:
        return
    dims, strides = coalesce(shape, [v.strides for v in views])
    lead = () if device is None else (device,)
    if not dims or (len(dims) == 1 and all(s[0] == 1 for s in strides)):
        args = []
        for v in views:
            args += (v.buffer.handle, v.offset)
        contig(*lead, n, *args, *extra)
        return
    if not max_dims or len(dims) <= max_dims:
        args = []
        for v in views:
            args += (v.buffer.handle, v.offset)
        strided(*lead, len(dims), dims + [s for st in strides for s in st], *args, *extra)
        return
    # more axes than the kernel walks: one launch per index of the leading ones
    cut = len(dims) - max_dims
    inner = dims[cut:]
    packed = inner + [s for st in strides for s in st[cut:]]
    for idx in itertools.product(*(range(d) for d in dims[:cut])):
        args = []
        for v, st in zip(views, strides):
            args += (v.buffer.handle, v.offset + sum(i * s for i, s in zip(idx, st)))
        strided(*lead, max_dims, packed, *args, *extra)


def bind_layout(contig: Launcher, strided: Launcher, shape: tuple, views: tuple, extra: tuple = (), *,
                device=None, max_dims: int = 0) -> Callable[[], None] | None:
    """`run_layout(...)` as a zero-argument callable with its launch arguments worked out once (a graph replays the
    same views at every step), or None where it takes more than one launch."""
    n = math.prod(shape)
    if n == 0:
        return _nothing
    lead = () if device is None else (device,)
    dims, strides = coalesce(shape, [v.strides for v in views])
    handles = [a for v in views for a in (v.buffer.handle, v.offset)]
    if not dims or (len(dims) == 1 and all(st[0] == 1 for st in strides)):
        return functools.partial(contig, *lead, n, *handles, *extra)
    if not max_dims or len(dims) <= max_dims:
        return functools.partial(strided, *lead, len(dims), dims + [x for st in strides for x in st], *handles, *extra)
    return None


def elementwise_kernel(backend: str, entry: expressions.Elementwise, contig: list, strided: list, *,
                       with_device: bool = False, max_dims: int = 0, check_device_dtypes: bool = False) -> Callable:
    """The table's callable for `entry`: `contig[dt]` / `strided[dt]` are the launchers for input dtype code dt (None
    where it has no kernel). `check_device_dtypes`: also refuse dtypes missing from the device's `dtypes` (a backend
    whose devices differ in what they compute)."""
    name, supported = entry.name, entry.kernel_dtypes
    out_dtypes = elementwise_out_dtypes(entry)
    layouts = LAYOUTS
    binary = entry.arity == 2

    def reject(views: tuple) -> None:
        raise elementwise_error(backend, name, views, supported, out_dtypes)

    def run(views: tuple, params: tuple) -> None:
        out = views[0]
        dt = views[1].dtype
        dev = out.buffer.device
        run_layout(contig[dt], strided[dt], out.shape, views, params, device=dev if with_device else None,
                   max_dims=max_dims)

    # The four hot paths below are spelled out (rather than sharing one generic body) so that a call costs a handful
    # of attribute reads, tuple compares and the launcher call.
    if binary and not entry.takes_params:
        if with_device:
            def kernel(out, a, b):
                shape = out.shape
                dt = a.dtype
                fn = contig[dt]
                dev = out.buffer.device
                if (fn is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != shape
                        or b.shape != shape or (check_device_dtypes and dt not in dev.dtypes)):
                    reject((out, a, b))
                cs, n = layouts.get(shape) or layout(shape)
                if a.strides == cs and b.strides == cs and out.strides == cs:
                    if n:
                        fn(dev, n, out.buffer.handle, out.offset, a.buffer.handle, a.offset, b.buffer.handle,
                           b.offset)
                    return
                run((out, a, b), ())
        else:
            def kernel(out, a, b):
                shape = out.shape
                dt = a.dtype
                fn = contig[dt]
                if fn is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != shape or b.shape != shape:
                    reject((out, a, b))
                cs, n = layouts.get(shape) or layout(shape)
                if a.strides == cs and b.strides == cs and out.strides == cs:
                    if n:
                        fn(n, out.buffer.handle, out.offset, a.buffer.handle, a.offset, b.buffer.handle, b.offset)
                    return
                run((out, a, b), ())
    elif binary:
        def kernel(out, a, b, alpha=0.0, beta=0.0):  # entries with params (axpby, every optimizer's update)
            shape = out.shape
            dt = a.dtype
            fn = contig[dt]
            dev = out.buffer.device
            if (fn is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != shape
                    or b.shape != shape or (check_device_dtypes and dt not in dev.dtypes)):
                reject((out, a, b))
            cs, n = layouts.get(shape) or layout(shape)
            if a.strides == cs and b.strides == cs and out.strides == cs:
                if n:
                    lead = (dev,) if with_device else ()
                    fn(*lead, n, out.buffer.handle, out.offset, a.buffer.handle, a.offset, b.buffer.handle,
                       b.offset, alpha, beta)
                return
            run((out, a, b), (alpha, beta))
    elif with_device:
        def kernel(out, x, alpha=0.0, beta=0.0):
            shape = out.shape
            dt = x.dtype
            fn = contig[dt]
            dev = out.buffer.device
            if (fn is None or out.dtype != out_dtypes[dt] or x.shape != shape
                    or (check_device_dtypes and dt not in dev.dtypes)):
                reject((out, x))
            cs, n = layouts.get(shape) or layout(shape)
            if x.strides == cs and out.strides == cs:
                if n:
                    fn(dev, n, out.buffer.handle, out.offset, x.buffer.handle, x.offset, alpha, beta)
                return
            run((out, x), (alpha, beta))
    else:
        def kernel(out, x, alpha=0.0, beta=0.0):
            shape = out.shape
            dt = x.dtype
            fn = contig[dt]
            if fn is None or out.dtype != out_dtypes[dt] or x.shape != shape:
                reject((out, x))
            cs, n = layouts.get(shape) or layout(shape)
            if x.strides == cs and out.strides == cs:
                if n:
                    fn(n, out.buffer.handle, out.offset, x.buffer.handle, x.offset, alpha, beta)
                return
            run((out, x), (alpha, beta))

    def bind(*views, alpha=0.0, beta=0.0) -> Callable[[], None] | None:
        """The call `kernel(*views, ...)` as a zero-argument callable with its launch arguments worked out once (a
        graph replays it with the same views at every step), or None where it takes more than one launch. The
        views were checked when the call was recorded."""
        if len(views) != (3 if binary else 2) or not all(hasattr(v, "strides") for v in views):
            return None  # parameters given positionally: left to the kernel itself
        out, dt = views[0], views[1].dtype
        extra = (alpha, beta) if (not binary or entry.takes_params) else ()
        return bind_layout(contig[dt], strided[dt], out.shape, views, extra,
                           device=out.buffer.device if with_device else None, max_dims=max_dims)

    kernel.__name__ = name
    kernel.bind = bind
    return kernel


def _nothing() -> None:
    pass


def contiguous(v, copy: Callable):
    """The view itself when contiguous, else a contiguous copy on the same device made with the backend's `copy`
    kernel (kernels outside the element-wise family read plain row-major data; the core normally hands them that)."""
    if v is None:
        return None
    cs, n = layout(v.shape)
    if v.strides == cs or n <= 1:
        return v
    out = View(v.buffer.device.alloc(n * dtypes.itemsize(v.dtype)), v.dtype, v.shape)
    copy(out, v)
    return out


def assemble(elementwise: Callable[[expressions.Elementwise], Callable],
             namespace: dict) -> dict[str, Callable]:
    """The kernel table: `elementwise(entry)` for every entry of the expression table, and for every hand-written
    primitive `p` the callable `namespace["_" + p]` (a table module passes its `globals()`: `_matmul`, `_conv2d`...).
    A primitive the namespace lacks is left to the host fallback (the device's `table` fills it in)."""
    table = {entry.name: elementwise(entry) for entry in expressions.TABLE.values()}
    for name in primitives.SPECIAL_BY_NAME:
        fn = namespace.get("_" + name)
        if fn is not None:
            table[name] = fn
    return table
