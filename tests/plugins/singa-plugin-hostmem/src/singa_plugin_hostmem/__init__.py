"""A deliberately small third-party device plugin, used by the tests to prove the plugin contract end to end.

Its memory is Python bytearrays (so the core cannot mistake a buffer for a numpy array) and it implements three kernels:
`fill`, `copy` and `add`. Everything else runs through singa-core's host fallback, with a warning per kernel.
"""

from __future__ import annotations

import numpy as np

from singa import dtypes, hookimpl
from singa.backend import Backend, Device


def _array(view) -> np.ndarray:
    """A writable numpy window on the view's elements (this plugin's own memory, so it may)."""
    npdt = dtypes.to_numpy_dtype(view.dtype)
    base = np.frombuffer(view.buffer.handle, dtype=npdt)
    if not view.shape or 0 not in view.shape:
        return np.lib.stride_tricks.as_strided(
            base[view.offset:], view.shape, tuple(s * npdt.itemsize for s in view.strides))
    return np.empty(view.shape, npdt)


def _fill(out, value):
    _array(out)[...] = value


def _copy(out, x):
    _array(out)[...] = _array(x)


def _add(out, a, b):
    np.add(_array(a), _array(b), out=_array(out), casting="unsafe")


class HostMemDevice(Device):
    backend_name = "hostmem"
    kernels = {"fill": _fill, "copy": _copy, "add": _add}
    dtypes = dtypes.ALL + (dtypes.float64,)  # its kernels and the host fallback are numpy: float64 works too

    def _raw_alloc(self, nbytes):
        return bytearray(nbytes)

    def _raw_free(self, handle):
        pass

    def _copy_from_host(self, handle, byte_offset, host):
        raw = host.view(np.uint8).reshape(-1)
        handle[byte_offset:byte_offset + raw.size] = raw.tobytes()

    def _copy_to_host(self, handle, byte_offset, host):
        raw = host.view(np.uint8).reshape(-1)
        raw[...] = np.frombuffer(handle, np.uint8, raw.size, byte_offset)

    def _copy_on_device(self, dst, dst_off, src, src_off, nbytes):
        dst[dst_off:dst_off + nbytes] = src[src_off:src_off + nbytes]

    def description(self):
        return "hostmem:0 (bytearray memory, test plugin)"


class HostMemBackend(Backend):
    name = "hostmem"
    distribution = "singa-plugin-hostmem"
    version = "0.0.1"

    def create_device(self, index=0):
        return HostMemDevice(index)


@hookimpl
def singa_backend():
    return HostMemBackend()
