"""cuDNN's fused RNN behind SINGA's `layer.CudnnRNN` (`CudaDevice.rnn_operator`).

singa.rnn fixes what the RNN computes (cells, gates, `W`'s layout, sequence lengths) and computes it from autograd
operators on any device; here cuDNN's RNN (cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8)
computes the same in one call per direction of the pass. A `Plan` per (spec, dtype, sequence length, batch, lengths)
holds the descriptors, the workspace sizes, the sequence lengths on the device, and where each weight block of the
canonical layout lives in cuDNN's weight space: when cuDNN's layout is the canonical one (as it is in cuDNN 9, and
PyTorch's flattened weights rely on it) `W` is handed over as it is, else its blocks are copied in and the gradient's
copied out. The calls are recorded with `graph.external`, so graph mode replays them (and captures them into the
step's CUDA Graph). float32 runs on FMA kernels (no TF32), float16 on the tensor cores.
"""

from __future__ import annotations

import math

import numpy as np

from singa import autograd, dtypes, graph, ops
from singa.backend import View
from singa.tensor import Tensor
from singa_backend_cuda import cudnn
from singa_backend_cuda.cudnn import check, ffi

CELL = {"relu": 0, "tanh": 1, "lstm": 2, "gru": 3}
NO_BIAS, DOUBLE_BIAS = 0, 2
SEQ_MAJOR_UNPACKED = 0
PADDED_IO_ENABLED = 1
FWD_INFERENCE, FWD_TRAINING = 0, 1
WGRAD_ADD = 0
DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH = 0, 1, 3
DTYPES = {dtypes.float32: "float32", dtypes.float16: "float16", dtypes.float64: "float64"}


def _ptr(v) -> int:
    return v.buffer.handle.ptr + v.offset * dtypes.itemsize(v.dtype)


def _bytes_tensor(dev, nbytes: int) -> Tensor:
    """Scratch device memory of at least nbytes (a float32 tensor, used by address only)."""
    return Tensor((max(1, -(-nbytes // 4)),), dev, dtypes.float32, requires_grad=False)


class Plan:
    """cuDNN's descriptors and sizes for one RNN shape; see the module's docstring."""

    def __init__(self, dev, spec, dtype: int, T: int, B: int, lengths: tuple):
        lib = cudnn.get()
        self.dev, self.spec, self.dtype, self.T, self.B = dev, spec, dtype, T, B
        handle = dev.dnn().handle
        data = cudnn.DATA[DTYPES[dtype]]
        prec = cudnn.DATA["float64"] if dtype == dtypes.float64 else cudnn.DATA["float32"]
        math_type = TENSOR_OP_MATH if dtype == dtypes.float16 else FMA_MATH if dtype == dtypes.float32 else DEFAULT_MATH
        H, D, L = spec.hidden_size, spec.num_directions, spec.num_layers
        d = ffi.new("cudnnDropoutDescriptor_t *")
        check(lib.cudnnCreateDropoutDescriptor(d), "cudnnCreateDropoutDescriptor")
        self.dropout = ffi.gc(d[0], lib.cudnnDestroyDropoutDescriptor)
        check(lib.cudnnSetDropoutDescriptor(self.dropout, handle, 0.0, ffi.NULL, 0, 0), "cudnnSetDropoutDescriptor")
        r = ffi.new("cudnnRNNDescriptor_t *")
        check(lib.cudnnCreateRNNDescriptor(r), "cudnnCreateRNNDescriptor")
        self.rnn = ffi.gc(r[0], lib.cudnnDestroyRNNDescriptor)
        check(lib.cudnnSetRNNDescriptor_v8(self.rnn, 0, CELL[spec.mode], DOUBLE_BIAS if spec.bias else NO_BIAS,
                                           1 if spec.bidirectional else 0, 0, data, prec, math_type, spec.input_size,
                                           H, H, L, self.dropout, PADDED_IO_ENABLED),
              f"cudnnSetRNNDescriptor_v8({spec})")
        seq = ffi.new("int[]", list(lengths))
        fill = ffi.new("double *", 0.0) if dtype == dtypes.float64 else ffi.new("float *", 0.0)
        self.x = self._data(data, T, B, spec.input_size, seq, fill)
        self.y = self._data(data, T, B, D * H, seq, fill)
        self.h = cudnn._nd_tensor(data, (L * D, B, H))
        ws, work, reserve = ffi.new("size_t *"), ffi.new("size_t *"), ffi.new("size_t *")
        check(lib.cudnnGetRNNWeightSpaceSize(handle, self.rnn, ws), "cudnnGetRNNWeightSpaceSize")
        self.weight_bytes = int(ws[0])
        check(lib.cudnnGetRNNTempSpaceSizes(handle, self.rnn, FWD_TRAINING, self.x, work, reserve),
              "cudnnGetRNNTempSpaceSizes")
        self.work_bytes, self.reserve_bytes = int(work[0]), int(reserve[0])
        check(lib.cudnnGetRNNTempSpaceSizes(handle, self.rnn, FWD_INFERENCE, self.x, work, reserve),
              "cudnnGetRNNTempSpaceSizes")
        self.infer_work_bytes = int(work[0])
        self.lengths = dev.persistent_alloc(4 * B)  # cuDNN reads the lengths on the device as well
        dev.write(View(self.lengths, dtypes.int32, (B,)), np.asarray(lengths, np.int32))
        self.segments = self._segments(handle)

    def _data(self, data: int, T: int, B: int, width: int, seq, fill):
        lib = cudnn.get()
        d = ffi.new("cudnnRNNDataDescriptor_t *")
        check(lib.cudnnCreateRNNDataDescriptor(d), "cudnnCreateRNNDataDescriptor")
        desc = ffi.gc(d[0], lib.cudnnDestroyRNNDataDescriptor)
        check(lib.cudnnSetRNNDataDescriptor(desc, data, SEQ_MAJOR_UNPACKED, T, B, width, seq, fill),
              f"cudnnSetRNNDataDescriptor(T={T}, B={B}, width={width})")
        return desc

    def _segments(self, handle) -> list[tuple[int, int, int]] | None:
        """(canonical offset, cuDNN offset, elements) runs mapping W into cuDNN's weight space, in elements; None
        when the two layouts are one (W is then used as it is)."""
        lib = cudnn.get()
        spec = self.spec
        isz = dtypes.itemsize(self.dtype)
        probe = self.dev.alloc(self.weight_bytes)  # addresses only: cuDNN computes them, reads nothing
        base = probe.handle.ptr
        m_desc, b_desc = cudnn._nd_tensor(0, (1, 1, 1)), cudnn._nd_tensor(0, (1, 1, 1))
        m_addr, b_addr = ffi.new("void **"), ffi.new("void **")
        G, H = spec.gates, spec.hidden_size
        runs = []
        for layer, d, name, off, shape in spec.layout():
            pseudo = layer * spec.num_directions + d
            cols = shape[1] if len(shape) > 1 else 1
            for g in range(G):
                lin = g if name in ("w_ih", "b_ih") else G + g
                check(lib.cudnnGetRNNWeightParams(handle, self.rnn, pseudo, self.weight_bytes, base, lin, m_desc,
                                                  m_addr, b_desc, b_addr), "cudnnGetRNNWeightParams")
                addr = int(ffi.cast("uintptr_t", (b_addr if name.startswith("b") else m_addr)[0]))
                runs.append((off + g * H * cols, (addr - base) // isz, H * cols))
        del probe
        runs.sort()
        merged: list[list[int]] = []
        for src, dst, n in runs:
            if merged and merged[-1][0] + merged[-1][2] == src and merged[-1][1] + merged[-1][2] == dst:
                merged[-1][2] += n
            else:
                merged.append([src, dst, n])
        total = spec.weight_size()
        if len(merged) == 1 and merged[0] == [0, 0, total] and total * isz == self.weight_bytes:
            return None
        return [tuple(r) for r in merged]

    # -- the weight space ---------------------------------------------------------------------------------------------
    def weight_space(self, W: Tensor) -> Tensor:
        """W in cuDNN's layout: W itself, or a copy with its blocks moved."""
        if self.segments is None:
            return W
        ws = _bytes_tensor(self.dev, self.weight_bytes)
        self._move(W, ws, to_cudnn=True)
        return ws

    def canonical(self, dws: Tensor) -> Tensor:
        """A gradient in cuDNN's layout as a tensor in W's layout."""
        if self.segments is None:
            return dws
        dW = Tensor((self.spec.weight_size(),), self.dev, self.dtype, requires_grad=False)
        ops.fill(dW, 0)
        self._move(dws, dW, to_cudnn=False)
        return dW

    def _move(self, src: Tensor, dst: Tensor, to_cudnn: bool) -> None:
        copy = self.dev.table["copy"]
        for canon, cud, n in self.segments:
            a, b = (canon, cud) if to_cudnn else (cud, canon)
            copy(View(dst.buffer, self.dtype, (n,), offset=dst.offset + b),
                 View(src.buffer, self.dtype, (n,), offset=src.offset + a))

    # -- the calls (recorded with graph.external; views in, views out) -------------------------------------------------
    def forward(self, x, hx, cx, ws, y, hy, cy, work, reserve, training: bool) -> None:
        with self.dev.stream_lock:  # see CudaDevice: a capture in another thread must not record this
            self._forward(x, hx, cx, ws, y, hy, cy, work, reserve, training)

    def backward(self, y, dy, dhy, dcy, hx, cx, ws, x, dx, dhx, dcx, dws, work, reserve) -> None:
        with self.dev.stream_lock:
            self._backward(y, dy, dhy, dcy, hx, cx, ws, x, dx, dhx, dcx, dws, work, reserve)

    def _forward(self, x, hx, cx, ws, y, hy, cy, work, reserve, training: bool) -> None:
        lc = self.spec.mode == "lstm"
        check(cudnn.get().cudnnRNNForward(
            self.dev.dnn().handle, self.rnn, FWD_TRAINING if training else FWD_INFERENCE, self.lengths.handle.ptr,
            self.x, _ptr(x), self.y, _ptr(y), self.h, _ptr(hx), _ptr(hy), self.h, _ptr(cx) if lc else 0,
            _ptr(cy) if lc else 0, self.weight_bytes, _ptr(ws),
            self.work_bytes if training else self.infer_work_bytes, _ptr(work),
            self.reserve_bytes if training else 0, _ptr(reserve) if training else 0),
            f"cudnnRNNForward({self.spec.mode}, T={self.T}, B={self.B})")

    def _backward(self, y, dy, dhy, dcy, hx, cx, ws, x, dx, dhx, dcx, dws, work, reserve) -> None:
        lib, handle = cudnn.get(), self.dev.dnn().handle
        lc = self.spec.mode == "lstm"
        check(lib.cudnnRNNBackwardData_v8(
            handle, self.rnn, self.lengths.handle.ptr, self.y, _ptr(y), _ptr(dy), self.x, _ptr(dx), self.h, _ptr(hx),
            _ptr(dhy), _ptr(dhx), self.h, _ptr(cx) if lc else 0, _ptr(dcy) if lc else 0, _ptr(dcx) if lc else 0,
            self.weight_bytes, _ptr(ws), self.work_bytes, _ptr(work), self.reserve_bytes, _ptr(reserve)),
            f"cudnnRNNBackwardData_v8({self.spec.mode}, T={self.T}, B={self.B})")
        check(lib.cudnnRNNBackwardWeights_v8(
            handle, self.rnn, WGRAD_ADD, self.lengths.handle.ptr, self.x, _ptr(x), self.h, _ptr(hx), self.y, _ptr(y),
            self.weight_bytes, _ptr(dws), self.work_bytes, _ptr(work), self.reserve_bytes, _ptr(reserve)),
            f"cudnnRNNBackwardWeights_v8({self.spec.mode}, T={self.T}, B={self.B})")


class CudnnRNN(autograd.Operator):
    """op(x, hx, cx, W) -> (y, hy, cy), as singa.rnn.forward; backward gives (dx, dhx, dcx, dW)."""

    def __init__(self, dev, spec, seq_lengths=None):
        super().__init__()
        self.dev, self.spec = dev, spec
        self.seq_lengths = None if seq_lengths is None else tuple(int(v) for v in np.asarray(seq_lengths).ravel())

    def forward(self, x: Tensor, hx: Tensor, cx: Tensor, W: Tensor):
        spec, dev = self.spec, self.dev
        if x.dtype not in DTYPES:
            raise TypeError(f"cuda CudnnRNN: dtype {dtypes.name(x.dtype)} is not a float type")
        x, hx, cx, W = (ops.contiguous(t) for t in (x, hx, cx, W))
        T, B, _ = x.shape
        lengths = self.seq_lengths or (T,) * B
        if len(lengths) != B or not all(1 <= n <= T for n in lengths):
            raise ValueError(f"cuda CudnnRNN: seq_lengths {list(lengths)} must be {B} lengths in [1, {T}]")
        plan = dev.rnn_plan(spec, x.dtype, T, B, lengths)
        H, D, L = spec.hidden_size, spec.num_directions, spec.num_layers
        y = Tensor((T, B, D * H), dev, x.dtype)
        hy = Tensor((L * D, B, H), dev, x.dtype)
        cy = Tensor((L * D, B, H), dev, x.dtype)
        ws = plan.weight_space(W)
        training = autograd.training
        work = _bytes_tensor(dev, plan.work_bytes if training else plan.infer_work_bytes)
        reserve = _bytes_tensor(dev, plan.reserve_bytes if training else 0)
        graph.external("cudnn_rnn_forward", lambda *a: plan.forward(*a, training),
                       (x, hx, cx, ws, y, hy, cy, work, reserve), reads=(0, 1, 2, 3), writes=(4, 5, 6, 7, 8))
        if spec.mode != "lstm":
            ops.fill(cy, 0)
        if training:
            self.saved = (plan, x, hx, cx, ws, y, reserve)
        return y, hy, cy

    def backward(self, dy: Tensor, dhy: Tensor | None, dcy: Tensor | None):
        plan, x, hx, cx, ws, y, reserve = self.saved
        dev = self.dev

        def grad_or_zeros(g, like):
            if g is None:
                z = Tensor(like.shape, dev, like.dtype, requires_grad=False)
                return ops.fill(z, 0)
            return ops.contiguous(g)

        dy, dhy, dcy = grad_or_zeros(dy, y), grad_or_zeros(dhy, hx), grad_or_zeros(dcy, cx)
        dx = Tensor(x.shape, dev, x.dtype, requires_grad=False)
        dhx = Tensor(hx.shape, dev, x.dtype, requires_grad=False)
        dcx = Tensor(cx.shape, dev, x.dtype, requires_grad=False)
        dws = Tensor((math.ceil(plan.weight_bytes / dtypes.itemsize(x.dtype)),), dev, x.dtype, requires_grad=False)
        ops.fill(dws, 0)  # cuDNN adds the weight gradient into it
        work = _bytes_tensor(dev, plan.work_bytes)
        graph.external("cudnn_rnn_backward", plan.backward,
                       (y, dy, dhy, dcy, hx, cx, ws, x, dx, dhx, dcx, dws, work, reserve),
                       reads=(0, 1, 2, 3, 4, 5, 6, 7, 11, 13), writes=(8, 9, 10, 11, 12, 13))
        if self.spec.mode != "lstm":
            ops.fill(dcx, 0)
        return dx, dhx, dcx, plan.canonical(dws)
