"""cffi (ABI mode) bindings of cuDNN's convolutions, from the nvidia-cudnn-cu13 wheel, and their per-shape plans.

Loaded on first use (`get()`); a missing wheel raises `libs.MissingLibrary` naming it. Only the convolution calls
are used (forward, data and filter gradients): cuDNN's kernels there are what no hand-written kernel matches. Each
distinct convolution (shapes, dtype, stride, padding, dilation, groups, direction) gets a `Plan` once: descriptors,
the fastest algorithm that `cudnnFind*AlgorithmEx` measured on the real buffers within the workspace limit, and its
workspace size; later calls only launch. Two rules pick among the measured algorithms:
* deterministic ones first: the same inputs give the same bits, run after run and in graph mode as in eager mode
  (SINGA_CUDNN_DETERMINISTIC=0 also admits those that sum with atomics);
* float32 (without TF32) and float64 take only the GEMM-like and direct algorithms, whose error is that of the
  float32 products themselves, not FFT or Winograd transforms, which trade a few digits for speed as TF32 does;
  float32 uses FMA kernels unless TF32 is switched on, like the matrix products. float16 takes any algorithm, on the
  tensor cores, accumulating in float32.
"""

from __future__ import annotations

import math
import os

from cffi import FFI

from singa_backend_cuda import libs

ffi = FFI()
ffi.cdef("""
typedef int cudnnStatus_t;
typedef struct cudnnContext *cudnnHandle_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;
typedef struct { int algo; cudnnStatus_t status; float time; size_t memory; int determinism; int mathType;
                 int reserved[3]; } cudnnAlgoPerf_t;

size_t cudnnGetVersion(void);
const char *cudnnGetErrorString(cudnnStatus_t status);
cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, void *stream);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *desc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, int format, int dataType, int n, int c,
                                         int h, int w);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *desc);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, int dataType, int format, int k, int c,
                                         int h, int w);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *desc);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, int mode, int computeType);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int groups);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, int mathType);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc);

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc, uint64_t x,
    cudnnFilterDescriptor_t wDesc, uint64_t w, cudnnConvolutionDescriptor_t convDesc, cudnnTensorDescriptor_t yDesc,
    uint64_t y, int requestedAlgoCount, int *returnedAlgoCount, cudnnAlgoPerf_t *perfResults, uint64_t workSpace,
    size_t workSpaceSizeInBytes);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t xDesc,
    uint64_t x, cudnnFilterDescriptor_t wDesc, uint64_t w, cudnnConvolutionDescriptor_t convDesc, int algo,
    uint64_t workSpace, size_t workSpaceSizeInBytes, const void *beta, cudnnTensorDescriptor_t yDesc, uint64_t y);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, cudnnFilterDescriptor_t wDesc,
    uint64_t w, cudnnTensorDescriptor_t dyDesc, uint64_t dy, cudnnConvolutionDescriptor_t convDesc,
    cudnnTensorDescriptor_t dxDesc, uint64_t dx, int requestedAlgoCount, int *returnedAlgoCount,
    cudnnAlgoPerf_t *perfResults, uint64_t workSpace, size_t workSpaceSizeInBytes);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha, cudnnFilterDescriptor_t wDesc,
    uint64_t w, cudnnTensorDescriptor_t dyDesc, uint64_t dy, cudnnConvolutionDescriptor_t convDesc, int algo,
    uint64_t workSpace, size_t workSpaceSizeInBytes, const void *beta, cudnnTensorDescriptor_t dxDesc, uint64_t dx);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc,
    uint64_t x, cudnnTensorDescriptor_t dyDesc, uint64_t dy, cudnnConvolutionDescriptor_t convDesc,
    cudnnFilterDescriptor_t dwDesc, uint64_t dw, int requestedAlgoCount, int *returnedAlgoCount,
    cudnnAlgoPerf_t *perfResults, uint64_t workSpace, size_t workSpaceSizeInBytes);
typedef struct cudnnRNNStruct *cudnnRNNDescriptor_t;
typedef struct cudnnRNNDataStruct *cudnnRNNDataDescriptor_t;
typedef struct cudnnDropoutStruct *cudnnDropoutDescriptor_t;
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc, int dataType, int nbDims, const int dimA[],
                                         const int strideA[]);
cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t *desc);
cudnnStatus_t cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t desc);
cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t desc, cudnnHandle_t handle, float dropout,
                                        void *states, size_t stateSizeInBytes, unsigned long long seed);
cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *desc);
cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t desc);
cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t desc, int algo, int cellMode, int biasMode, int dirMode,
    int inputMode, int dataType, int mathPrec, int mathType, int32_t inputSize, int32_t hiddenSize, int32_t projSize,
    int32_t numLayers, cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags);
cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t *desc);
cudnnStatus_t cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t desc);
cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t desc, int dataType, int layout, int maxSeqLength,
                                        int batchSize, int vectorSize, const int seqLengthArray[], void *paddingFill);
cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, size_t *weightSpaceSize);
cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int fwdMode,
                                        cudnnRNNDataDescriptor_t xDesc, size_t *workSpaceSize,
                                        size_t *reserveSpaceSize);
cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int32_t pseudoLayer,
    size_t weightSpaceSize, uint64_t weightSpace, int32_t linLayerID, cudnnTensorDescriptor_t mDesc, void **mAddr,
    cudnnTensorDescriptor_t bDesc, void **bAddr);
cudnnStatus_t cudnnRNNForward(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int fwdMode, uint64_t devSeqLengths,
    cudnnRNNDataDescriptor_t xDesc, uint64_t x, cudnnRNNDataDescriptor_t yDesc, uint64_t y,
    cudnnTensorDescriptor_t hDesc, uint64_t hx, uint64_t hy, cudnnTensorDescriptor_t cDesc, uint64_t cx, uint64_t cy,
    size_t weightSpaceSize, uint64_t weightSpace, size_t workSpaceSize, uint64_t workSpace, size_t reserveSpaceSize,
    uint64_t reserveSpace);
cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, uint64_t devSeqLengths,
    cudnnRNNDataDescriptor_t yDesc, uint64_t y, uint64_t dy, cudnnRNNDataDescriptor_t xDesc, uint64_t dx,
    cudnnTensorDescriptor_t hDesc, uint64_t hx, uint64_t dhy, uint64_t dhx, cudnnTensorDescriptor_t cDesc,
    uint64_t cx, uint64_t dcy, uint64_t dcx, size_t weightSpaceSize, uint64_t weightSpace, size_t workSpaceSize,
    uint64_t workSpace, size_t reserveSpaceSize, uint64_t reserveSpace);
cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int addGrad,
    uint64_t devSeqLengths, cudnnRNNDataDescriptor_t xDesc, uint64_t x, cudnnTensorDescriptor_t hDesc, uint64_t hx,
    cudnnRNNDataDescriptor_t yDesc, uint64_t y, size_t weightSpaceSize, uint64_t dweightSpace, size_t workSpaceSize,
    uint64_t workSpace, size_t reserveSpaceSize, uint64_t reserveSpace);

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t xDesc,
    uint64_t x, cudnnTensorDescriptor_t dyDesc, uint64_t dy, cudnnConvolutionDescriptor_t convDesc, int algo,
    uint64_t workSpace, size_t workSpaceSizeInBytes, const void *beta, cudnnFilterDescriptor_t dwDesc, uint64_t dw);
""")

SONAME = "libcudnn.so.9"
NCHW = 0
DATA = {"float32": 0, "float64": 1, "float16": 2}
CROSS_CORRELATION = 1
TENSOR_OP_MATH, FMA_MATH = 1, 3
DETERMINISTIC = 1
# the algorithms that compute the plain sum of products (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t): implicit /
# precomputed / explicit GEMM and direct for the forward pass, ALGO_0/ALGO_1 (and ALGO_3) for the gradients
EXACT = {"forward": {0, 1, 2, 3}, "data": {0, 1}, "filter": {0, 1, 3}}
DIRECTIONS = ("forward", "data", "filter")

_lib = None


class CudnnError(RuntimeError):
    """A cuDNN call failed; `status` is its cudnnStatus_t."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def get():
    global _lib
    if _lib is None:
        _lib, _ = libs.load(SONAME, ffi)
    return _lib


def check(status: int, what: str) -> None:
    if status != 0:
        raise CudnnError(f"{what} failed: {ffi.string(get().cudnnGetErrorString(status)).decode()} ({status})",
                         status)


def version() -> int:
    return int(get().cudnnGetVersion())


class Handle:
    """A cuDNN handle bound to one device's stream."""

    def __init__(self, stream: int):
        h = ffi.new("cudnnHandle_t *")
        check(get().cudnnCreate(h), "cudnnCreate")
        self.handle = h[0]
        check(get().cudnnSetStream(self.handle, ffi.cast("void *", stream)), "cudnnSetStream")

    def close(self) -> None:
        if self.handle is not None:
            get().cudnnDestroy(self.handle)
            self.handle = None


def _tensor(dtype: int, n: int, c: int, h: int, w: int):
    d = ffi.new("cudnnTensorDescriptor_t *")
    check(get().cudnnCreateTensorDescriptor(d), "cudnnCreateTensorDescriptor")
    check(get().cudnnSetTensor4dDescriptor(d[0], NCHW, dtype, n, c, h, w), f"cudnnSetTensor4dDescriptor({n}, {c}, "
                                                                           f"{h}, {w})")
    return ffi.gc(d[0], get().cudnnDestroyTensorDescriptor)


def _filter(dtype: int, k: int, c: int, h: int, w: int):
    d = ffi.new("cudnnFilterDescriptor_t *")
    check(get().cudnnCreateFilterDescriptor(d), "cudnnCreateFilterDescriptor")
    check(get().cudnnSetFilter4dDescriptor(d[0], dtype, NCHW, k, c, h, w), f"cudnnSetFilter4dDescriptor({k}, {c}, "
                                                                           f"{h}, {w})")
    return ffi.gc(d[0], get().cudnnDestroyFilterDescriptor)


def _nd_tensor(dtype: int, dims: tuple):
    """A fully packed N-d tensor descriptor (N >= 3)."""
    d = ffi.new("cudnnTensorDescriptor_t *")
    check(get().cudnnCreateTensorDescriptor(d), "cudnnCreateTensorDescriptor")
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    check(get().cudnnSetTensorNdDescriptor(d[0], dtype, len(dims), ffi.new("int[]", list(dims)),
                                           ffi.new("int[]", strides)), f"cudnnSetTensorNdDescriptor({dims})")
    return ffi.gc(d[0], get().cudnnDestroyTensorDescriptor)


class Plan:
    """One convolution of fixed geometry and dtype in one direction: descriptors, algorithm, workspace size.

    x (N, C, H, W) is already padded where the padding is asymmetric (the caller pads it), so cuDNN's symmetric
    padding (ph, pw) is the rest."""

    def __init__(self, dtype: str, direction: str, x_shape, w_shape, y_shape, pad: tuple, stride: tuple,
                 dilation: tuple, groups: int, tf32: bool):
        lib = get()
        dt = DATA[dtype]
        self.dtype = dtype
        self.direction = direction
        self.x = _tensor(dt, *x_shape)
        self.w = _filter(dt, *w_shape)
        self.y = _tensor(dt, *y_shape)
        d = ffi.new("cudnnConvolutionDescriptor_t *")
        check(lib.cudnnCreateConvolutionDescriptor(d), "cudnnCreateConvolutionDescriptor")
        self.conv = ffi.gc(d[0], lib.cudnnDestroyConvolutionDescriptor)
        compute = DATA["float64"] if dtype == "float64" else DATA["float32"]
        check(lib.cudnnSetConvolution2dDescriptor(self.conv, pad[0], pad[1], stride[0], stride[1], dilation[0],
                                                  dilation[1], CROSS_CORRELATION, compute),
              "cudnnSetConvolution2dDescriptor")
        check(lib.cudnnSetConvolutionGroupCount(self.conv, groups), "cudnnSetConvolutionGroupCount")
        # FMA_MATH keeps float32 exact to float32 rounding (no TF32); half data may use the tensor cores
        math_type = TENSOR_OP_MATH if dtype == "float16" or (dtype == "float32" and tf32) else FMA_MATH
        check(lib.cudnnSetConvolutionMathType(self.conv, math_type), "cudnnSetConvolutionMathType")
        self.algo = None
        self.workspace = 0
        self.candidates: list[tuple[int, int, int]] = []  # (algo, workspace bytes, math type), best first
        # float64, and float32 without TF32: no reduced-precision (tensor-op) variant; with SINGA_CUDNN_EXACT=1 also
        # only the algorithms that sum the products directly (no Winograd or FFT), whose float32 results follow the
        # CPU backend's most closely
        self.full_precision = dtype == "float64" or (dtype == "float32" and not tf32)
        self.exact = self.full_precision and os.environ.get("SINGA_CUDNN_EXACT", "").strip() == "1"
        self.scalar = "double *" if dtype == "float64" else "float *"

    def find(self, handle, x: int, w: int, y: int, workspace: int, limit: int) -> None:
        """Measure the algorithms on these buffers (the output ones are overwritten) and keep the fastest that fits
        `limit` bytes of workspace."""
        lib = get()
        count = ffi.new("int *")
        perf = ffi.new("cudnnAlgoPerf_t[16]")
        if self.direction == "forward":
            status = lib.cudnnFindConvolutionForwardAlgorithmEx(handle, self.x, x, self.w, w, self.conv, self.y, y,
                                                                16, count, perf, workspace, limit)
        elif self.direction == "data":
            status = lib.cudnnFindConvolutionBackwardDataAlgorithmEx(handle, self.w, w, self.y, y, self.conv, self.x,
                                                                     x, 16, count, perf, workspace, limit)
        else:
            status = lib.cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, self.x, x, self.y, y, self.conv,
                                                                       self.w, w, 16, count, perf, workspace, limit)
        check(status, f"cudnnFindConvolution({self.direction}, {self.dtype})")
        usable = [perf[i] for i in range(count[0]) if perf[i].status == 0 and perf[i].memory <= limit]
        if self.full_precision:
            usable = [p for p in usable if p.mathType != TENSOR_OP_MATH] or usable
        if self.exact:
            usable = [p for p in usable if p.algo in EXACT[self.direction]] or usable
        if os.environ.get("SINGA_CUDNN_DETERMINISTIC", "").strip() != "0":
            usable = [p for p in usable if p.determinism == DETERMINISTIC] or usable
        if not usable:
            raise CudnnError(f"cuDNN has no {self.direction} convolution algorithm for these shapes within "
                             f"{limit} bytes of workspace")
        self.candidates = [(int(p.algo), int(p.memory), int(p.mathType)) for p in usable]  # cuDNN lists fastest first
        self._choose()

    def _choose(self) -> None:
        # each measured result holds for the math type it was measured with: the descriptor must carry that one
        self.algo, self.workspace, math_type = self.candidates[0]
        check(get().cudnnSetConvolutionMathType(self.conv, math_type), "cudnnSetConvolutionMathType")

    def drop(self, error: CudnnError) -> bool:
        """After `run` refused the chosen algorithm (BAD_PARAM or NOT_SUPPORTED: nothing was launched), move on to
        the next one Find measured; False when there is none or the error is of another kind."""
        if error.status // 1000 not in (2, 3) or len(self.candidates) < 2:
            return False
        self.candidates.pop(0)
        self._choose()
        return True

    def run(self, handle, x: int, w: int, y: int, workspace: int, beta: float = 0.0) -> None:
        """forward: y = conv(x, w); data: x = grad wrt x from y (dy) and w; filter: w = grad wrt w (+ beta w)."""
        lib = get()
        one, b = ffi.new(self.scalar, 1.0), ffi.new(self.scalar, beta)
        if self.direction == "forward":
            status = lib.cudnnConvolutionForward(handle, one, self.x, x, self.w, w, self.conv, self.algo, workspace,
                                                 self.workspace, b, self.y, y)
        elif self.direction == "data":
            status = lib.cudnnConvolutionBackwardData(handle, one, self.w, w, self.y, y, self.conv, self.algo,
                                                      workspace, self.workspace, b, self.x, x)
        else:
            status = lib.cudnnConvolutionBackwardFilter(handle, one, self.x, x, self.y, y, self.conv, self.algo,
                                                        workspace, self.workspace, b, self.w, w)
        check(status, f"cudnnConvolution({self.direction}, {self.dtype}, algo {self.algo})")
