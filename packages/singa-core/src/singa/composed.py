"""Primitives the core builds from a backend's other kernels (`primitives.COMPOSED`).

A backend may leave these out: `Device.table` then runs the steps below with the backend's own kernels, on the
device, instead of the host fallback. A backend provides the primitive itself where a library does the steps in one
pass (the CPU backend's conv2d_fused: oneDNN's convolution with sum and ReLU post-ops; its sgd_momentum: one C kernel).

Each builder takes the device's table before the composed entries are added (plain functions, so that a graph
recorder's hooks on the table see one call of the composed primitive, not its steps) and returns the kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from singa import dtypes, kernel_checks


def conv2d_fused(table: dict[str, Callable]) -> Callable:
    """relu(conv2d(x, w, b) + residual) as the backend's conv2d, then add and relu in place on the output."""
    conv, add, relu = table["conv2d"], table["add"], table["relu"]

    def kernel(out, x, w, b=None, residual=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
               activation="none") -> None:
        kernel_checks.conv_fused_args("core", out, residual, activation)
        conv(out, x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
        if residual is not None:
            add(out, out, residual)
        if activation == "relu":
            relu(out, out)

    kernel.__name__ = "composed_conv2d_fused"
    return kernel


def sgd_momentum(table: dict[str, Callable]) -> Callable:
    """buf = momentum * buf + g, then w = w - lr * buf: two passes of the backend's axpby."""
    axpby = table["axpby"]

    def kernel(w, buf, g, lr=0.0, momentum=0.0) -> None:
        kernel_checks.sgd_args("core", w, buf, g, dtypes.FLOATS + (dtypes.float64,))
        axpby(buf, buf, g, alpha=float(momentum), beta=1.0)
        axpby(w, w, buf, alpha=1.0, beta=-float(lr))

    kernel.__name__ = "composed_sgd_momentum"
    return kernel


BUILDERS: dict[str, Callable[[dict], Callable]] = {"conv2d_fused": conv2d_fused, "sgd_momentum": sgd_momentum}
