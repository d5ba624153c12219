"""The primitive kernel set: every kernel a backend may provide, with its calling contract.

A kernel is called as ``device.table[name](*views, **params)``; views come first, outputs before inputs, in the order
of `Primitive.outputs` then `Primitive.inputs`; parameters are keyword arguments with plain Python values. Views are
described in `singa.backend`. Unless a primitive says otherwise:

* outputs are contiguous, freshly allocated by the core, with the dtype and shape stated; `accumulate`/in-place outputs
  say so;
* inputs are contiguous (the core calls `contiguous()` first); the element-wise family and `copy`/`cast`/`where`
  take inputs of any strides, and already broadcast: every input has the output's shape, broadcast axes have stride 0;
* every dtype in `dtypes.ALL` is accepted where it makes sense (floats for transcendental math, numeric for arithmetic);
  float16 may be computed in float32 internally;
* shapes may be empty (a zero-sized axis) and 0-d.

Element-wise kernels are generated from `singa.expressions.TABLE` (one kernel per entry, same name): unary
``name(out, x, alpha=0.0, beta=0.0)``, binary ``name(out, a, b)`` (``name(out, a, b, alpha=0.0, beta=0.0)`` for a binary
entry with `params`, such as ``axpby``); `out` has the input dtype, or bool for comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass

from singa import expressions


@dataclass(frozen=True)
class Primitive:
    name: str
    outputs: tuple  # view arguments written by the kernel
    inputs: tuple  # view arguments read by the kernel (names ending in '?' may be None)
    params: tuple  # keyword parameters
    doc: str
    group: str
    inplace: tuple = ()  # outputs that are also read (updated in place)


P = Primitive

SPECIAL = [
    # -- memory / layout --------------------------------------------------------------------------------------------
    P("fill", ("out",), (), ("value",), "Set every element of `out` (any strides) to `value`.", "memory"),
    P("copy", ("out",), ("x",), (), "Copy `x` into `out`; same dtype and shape, both of any strides (transpose, slice, "
      "expand, concat and pad are copies between views).", "memory"),
    P("cast", ("out",), ("x",), (), "Convert `x` to `out.dtype` (any strides in). Float to int truncates toward zero; "
      "to bool is `x != 0`.", "memory"),
    P("where", ("out",), ("cond", "a", "b"), (), "out = cond ? a : b; cond is bool; all broadcast to out.shape.",
      "elementwise"),
    # -- reductions -------------------------------------------------------------------------------------------------
    P("reduce_sum", ("out",), ("x",), ("axes",), "Sum over `axes` (sorted tuple, may be empty = copy). out.shape is x.shape "
      "without those axes. Float16 accumulates in float32.", "reduction"),
    P("reduce_mean", ("out",), ("x",), ("axes",), "Mean over `axes`; an empty reduction gives NaN (0 for integers). "
      "Integer means truncate toward zero.", "reduction"),
    P("reduce_max", ("out",), ("x",), ("axes",), "Maximum over `axes` (NaN propagates); needs a non-empty reduction.",
      "reduction"),
    P("reduce_min", ("out",), ("x",), ("axes",), "Minimum over `axes` (NaN propagates); needs a non-empty reduction.",
      "reduction"),
    P("reduce_prod", ("out",), ("x",), ("axes",), "Product over `axes`.", "reduction"),
    P("argmax", ("out",), ("x",), ("axis",), "Index (int64) of the first maximum along `axis`; out.shape drops it.",
      "reduction"),
    P("argmin", ("out",), ("x",), ("axis",), "Index (int64) of the first minimum along `axis`.", "reduction"),
    # -- linear algebra ---------------------------------------------------------------------------------------------
    P("matmul", ("out",), ("a", "b"), ("trans_a", "trans_b", "alpha", "beta"),
      "Batched matrix product out = alpha * op(a) @ op(b) + beta * out. a is (Ba, m, k), or (Ba, k, m) with trans_a; "
      "b is (Bb, k, n), or (Bb, n, k) with trans_b; out is (B, m, n) with Ba, Bb in {1, B} (1 broadcasts). "
      "beta != 0 reads out (accumulate). a and b are contiguous unless the kernel callable sets "
      "`strided_operands = True`: then they may also come with strides (batch stride, row stride, 1), the row stride "
      "at least the row's length, or as (B1, B2, rows, cols) with strides (s1, s2, row stride, 1) (attention's heads "
      "where they lie in a (batch, seq, heads * dim) tensor).", "linalg",
      inplace=("out",)),
    # -- convolution and pooling (NCHW) -----------------------------------------------------------------------------
    P("conv2d", ("out",), ("x", "w", "b?"), ("stride", "padding", "dilation", "groups"),
      "2-D cross-correlation. x (N, C, H, W), w (K, C/groups, kh, kw), b (K,) or None, out (N, K, OH, OW). "
      "stride and dilation are (sh, sw); padding is (top, left, bottom, right) zeros.", "nn"),
    P("conv2d_fused", ("out",), ("x", "w", "b?", "residual?"),
      ("stride", "padding", "dilation", "groups", "activation"),
      "out = act(conv2d(x, w, b) + residual): residual (N, K, OH, OW) or None, not overlapping out (unless it is "
      "out's very view and the device lists conv2d_fused in Device.shares_output_with); activation 'relu' or "
      "'none'. Optional (see COMPOSED): without it, the core runs conv2d, add and relu of the same "
      "backend. Where `Device.channel_block` is B > 0, it also takes `blocks=(bx, bout)`, each 0 or B: x, and "
      "out with the residual, laid out in channel blocks (N, C/B, H, W, B) (see backend.channel_split); the "
      "keyword is never passed elsewhere.", "nn"),
    P("conv2d_backward_data", ("dx",), ("dy", "w"), ("stride", "padding", "dilation", "groups"),
      "Gradient of conv2d with respect to x; dx has x's shape.", "nn"),
    P("conv2d_backward_weight", ("dw",), ("dy", "x"), ("stride", "padding", "dilation", "groups"),
      "Gradient of conv2d with respect to w; dw has w's shape.", "nn"),
    P("pool2d", ("out", "indices?"), ("x",), ("kernel", "stride", "padding", "dilation", "mode", "count_include_pad"),
      "2-D pooling, mode 'max' or 'avg'. x (N, C, H, W), out (N, C, OH, OW) with OH, OW chosen by the caller (ceil "
      "mode makes windows run past the padded input; they are clipped). padding is (top, left, bottom, right). For "
      "'max', padded positions never win and `indices` (int64, out's shape, or None) receives the flat index h*W+w of "
      "the winner in its (n, c) plane (a window with no element inside the input gives 0 and index -1). For "
      "'avg' `indices`, if given, is filled with -1; the divisor counts the window's elements inside [0, H) x [0, W), plus, with count_include_pad, those "
      "inside the declared padding. Where `Device.channel_block` is B > 0, it also takes `blocks=B`: x and out in channel "
      "blocks (as conv2d_fused's), indices None.", "nn"),
    P("pool2d_backward", ("dx",), ("dy", "x", "indices?"), ("kernel", "stride", "padding", "dilation", "mode", "count_include_pad"),
      "Gradient of pool2d: 'max' scatters dy to `indices` (from the forward), 'avg' spreads dy over each window with "
      "the forward's divisor. dx has x's shape.", "nn"),
    P("batchnorm_train", ("y", "running_mean", "running_var", "saved_mean", "saved_invstd"),
      ("x", "scale", "bias"), ("momentum", "eps"),
      "Batch normalisation over axes (0, 2, 3) of x (N, C, H, W) (or (0,) of (N, C)), with batch statistics. "
      "saved_mean and saved_invstd (C,) get the batch mean and 1/sqrt(var + eps) (biased var). running_mean/var are "
      "updated in place: r = momentum * r + (1 - momentum) * batch, using the unbiased variance for running_var.",
      "nn", inplace=("running_mean", "running_var")),
    P("batchnorm_infer", ("y",), ("x", "scale", "bias", "mean", "var"), ("eps",),
      "y = (x - mean) / sqrt(var + eps) * scale + bias, per channel (axis 1).", "nn"),
    P("batchnorm_backward", ("dx", "dscale", "dbias"), ("dy", "x", "scale", "saved_mean", "saved_invstd"), (),
      "Gradients of batchnorm_train with respect to x, scale and bias.", "nn"),
    P("batchnorm_apply", ("y",), ("x", "scale", "bias", "saved_mean", "saved_invstd"), ("activation",),
      "y = act((x - saved_mean) * saved_invstd * scale + bias) per channel (axis 1), act 'relu' or 'none', with the "
      "statistics a batchnorm_train call saved. Graph mode uses it to recompute a training step's BatchNorm (+ ReLU) "
      "output in the backward instead of keeping it alive from the forward (see graph_fuse.recompute_batchnorm), and "
      "only on a backend that has it (`Device.kernels`; elsewhere the host fallback serves direct calls): there, for "
      "float32 and float64 data with statistics of the same dtype, y must equal that batchnorm_train call's y (relu'd "
      "like the relu kernel: NaN stays) bit for bit.", "nn"),
    P("layer_norm", ("y", "mean", "invstd"), ("x", "scale?", "bias?"), ("eps",),
      "Normalise each row of x, a (rows, cols) matrix: mean and invstd = 1 / sqrt(var + eps) of the row (biased "
      "variance), both (rows,) in x's dtype; y = (x - mean) * invstd * scale + bias with scale and bias (cols,) "
      "(each may be None: 1 and 0). Float16 computes in float32.", "nn"),
    P("softmax", ("out",), ("x",), ("axis",), "Softmax along `axis` (numerically stable).", "nn"),
    P("log_softmax", ("out",), ("x",), ("axis",), "Log-softmax along `axis`.", "nn"),
    P("softmax_backward", ("dx",), ("dy", "y"), ("axis",), "dx = y * (dy - sum(dy * y, axis)).", "nn"),
    P("log_softmax_backward", ("dx",), ("dy", "y"), ("axis",), "dx = dy - exp(y) * sum(dy, axis); y is the log-softmax.",
      "nn"),
    P("softmax_cross_entropy", ("loss",), ("x", "target"), (),
      "Per-row loss of softmax(x) for x (N, C): target int32/int64 labels (N,) or x-dtype distributions (N, C). "
      "loss is (N,). Labels are in [0, C): the core checks them (ops.check_labels) before any call.", "loss"),
    P("softmax_cross_entropy_backward", ("dx",), ("dloss", "x", "target"), (),
      "dx = (softmax(x) * sum(t, 1) - t) * dloss[:, None] with t = onehot(target) or the target rows (the exact "
      "gradient, also for rows that do not sum to 1); dloss is (N,).", "loss"),
    # -- indexing ---------------------------------------------------------------------------------------------------
    P("gather", ("out",), ("x", "indices"), ("axis",),
      "ONNX Gather: out = take(x, indices, axis); indices int32/int64, negative counts from the end; out.shape = "
      "x.shape[:axis] + indices.shape + x.shape[axis+1:]. An index out of range raises IndexError.", "indexing"),
    P("scatter_add", ("out",), ("indices", "updates"), ("axis",),
      "The adjoint of gather: out[..., indices[j], ...] += updates[..., j, ...] along `axis` (out is read: "
      "accumulate).", "indexing", inplace=("out",)),
    P("pad", ("out",), ("x",), ("pads", "mode", "value"),
      "ONNX Pad: pads is (begin_0, ..., begin_n, end_0, ..., end_n), non-negative; mode 'constant', 'reflect' or "
      "'edge'.", "indexing"),
    # -- optimizer updates -----------------------------------------------------------------------------------------
    P("sgd_momentum", ("w", "buf"), ("g",), ("lr", "momentum"),
      "SGD's momentum rule in place, in one call: buf = momentum * buf + g, then w = w - lr * buf. w, buf and g "
      "share one float dtype and shape and are contiguous, no two overlapping. A buffer value below the dtype's "
      "smallest normal number may be stored as 0 (a backend may keep it off the CPU's slow subnormal path). "
      "Optional (see COMPOSED): without it, the core runs two axpby of the same backend.", "optimizer",
      inplace=("w", "buf")),
    # -- random numbers ---------------------------------------------------------------------------------------------
    P("random_uniform", ("out",), (), ("low", "high", "seed", "offset"),
      "Uniform floats in [low, high). Element i uses draw u_i = philox_float(seed, offset + i), see `philox`.",
      "random"),
    P("random_normal", ("out",), (), ("mean", "std", "seed", "offset"),
      "Normal floats: element i is mean + std * sqrt(-2 ln(1 - u_{2i})) * cos(2 pi u_{2i+1}) with u_j drawn at "
      "offset + j (Box-Muller): the caller reserves 2 * n draws.", "random"),
    P("random_bernoulli", ("out",), (), ("p", "seed", "offset"), "1 where u_i < p else 0, in out.dtype.", "random"),
]

SPECIAL_BY_NAME = {p.name: p for p in SPECIAL}

# Primitives a backend may leave out without falling back to the host: `Device.table` builds them from the backend's
# own kernels (singa.composed). A backend provides one where it does the steps in one pass (oneDNN's post-ops, the CPU
# backend's SGD update).
COMPOSED = frozenset({"conv2d_fused", "sgd_momentum"})

PHILOX_DOC = """Counter-based random numbers, identical on every backend.

Draw j of stream `seed` at `offset`: let c = offset + j. Run Philox4x32-10 with key (seed & 0xffffffff, seed >> 32) on
the counter (c // 4 as a 64-bit value split low/high into words 0 and 1, words 2 and 3 zero) and take output word
c % 4 as the 32-bit integer r. The float draw is u = (r >> 8) * 2**-24, in [0, 1). The Philox4x32 round multipliers are
0xD2511F53 and 0xCD9E8D57 and the key increments 0x9E3779B9 and 0xBB67AE85 (Salmon et al., SC'11).
"""


def elementwise_names() -> list[str]:
    return list(expressions.TABLE)


def names() -> list[str]:
    """Every primitive name: the element-wise table, then the hand-written kernels."""
    return elementwise_names() + list(SPECIAL_BY_NAME)


def group(name: str) -> str:
    e = expressions.TABLE.get(name)
    if e is not None:
        return "unary" if e.arity == 1 else "binary"
    return SPECIAL_BY_NAME[name].group
