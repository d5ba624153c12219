"""Functional operations on Tensors, device-agnostic and without autograd (autograd calls these both ways).

Each operation validates its inputs, works out the result's shape and dtype, allocates the result on the inputs'
device (`device.alloc`) and calls the device's kernel, `device.table[name](*views, **params)`, per the contract in
`singa.primitives`. The core never touches device memory: transposes, slices, broadcasting and `expand` are views that
only change shape/strides/offset; everything else is a kernel call.

Dtype rule of the element-wise binary operations (SINGA's, made explicit):

* operands of different kinds (bool < integer < float) compute in the dtype of the higher kind, the other operand
  converted first, as SINGA casts: int32 + float32 is float32, bool * int32 is int32;
* operands of the same kind and different widths are not promoted (float16 + float32, int32 + int64): TypeError
  naming both, so that a half-precision or int64 index path never widens silently;
* a Python or numpy scalar adopts the tensor's dtype, except that a float scalar with an integer or bool tensor makes
  the result float32 (SINGA converts the scalar with float(); `int_tensor * 0.5` is float32, `int_tensor * 2` stays
  integer); an integer scalar out of an integer tensor's range is an error;
* a numpy array operand becomes a tensor of the other operand's dtype when it is of the same kind (float/int/bool),
  else a tensor of its own dtype (float64 as float32), and the rule above applies;
* integer `div` truncates toward zero (C, as the kernels do); `floor_divide` and `mod` follow Python.

Errors name the operation and both operands' shapes, dtypes or devices: `add: cannot broadcast shapes (2, 3) and (4,)`.
"""

from __future__ import annotations

import builtins
import math
import operator
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import graph as _graph
from singa.backend import Device, View, make_view
from singa.expressions import TABLE as _TABLE
from singa.kernel_checks import FUSED_ACTIVATIONS as _FUSED_ACTIVATIONS
from singa.tensor import Tensor

float32, float16, int32, int64, bool_ = _dt.float32, _dt.float16, _dt.int32, _dt.int64, _dt.bool_

_ITEMSIZE = tuple(_dt.itemsize(d) for d in range(6))  # indexed by dtype code
# float64 passes the dtype checks wherever float32 does; whether a device computes it is `Device.dtypes`' business,
# checked when a tensor is created (`empty`, `cast`), so that no float64 tensor reaches a device without its kernels.
_FLOATS = frozenset(_dt.FLOATS + (_dt.float64,))
_INTS = frozenset(_dt.INTS)
_NUMERIC = frozenset(_dt.NUMERIC + (_dt.float64,))
_ALL = frozenset(_dt.ALL + (_dt.float64,))
SCALAR_TYPES = (int, float, np.integer, np.floating, np.bool_)  # Python bool is an int
_NOPARAMS: dict = {}
_name = _dt.name

# -- tensor construction ------------------------------------------------------------------------------------------

_META: dict = {}  # shape -> (contiguous strides, number of elements); shapes repeat, so this saves a loop per op
_new = object.__new__
# device -> its kernel table. `Device.table` is a property that builds the dict once and always returns that same
# dict, so holding it here skips the property call on the hot path and still sees entries replaced later.
_TABLES: dict = {}


def _table(dev: Device) -> dict:
    t = _TABLES.get(dev)
    if t is None:
        t = _TABLES[dev] = dev.table
    return t


def _meta(shape: tuple) -> tuple:
    m = _META.get(shape)
    if m is None:
        if len(_META) >= 4096:
            _META.clear()
        strides = []
        n = 1
        for d in reversed(shape):
            strides.append(n)
            n *= d
        m = _META[shape] = (tuple(reversed(strides)), n)
    return m


def _wrap(buffer, dtype: int, shape: tuple, strides: tuple, offset: int, device: Device) -> Tensor:
    """A Tensor around existing memory, bypassing the public constructor's argument parsing."""
    t = _new(Tensor)
    t.buffer = buffer
    t.dtype = dtype
    t.shape = shape
    t.strides = strides
    t.offset = offset
    t.device = device
    t.requires_grad = True
    t.stores_grad = False
    t.creator = None
    t.name = None
    return t


def _empty(shape: tuple, dtype: int, device: Device) -> Tensor:
    strides, n = _META.get(shape) or _meta(shape)
    return _wrap(device.alloc(n * _ITEMSIZE[dtype]), dtype, shape, strides, 0, device)


def _as_strided(x: Tensor, shape: tuple, strides: tuple, offset: int) -> Tensor:
    return _wrap(x.buffer, x.dtype, shape, strides, offset, x.device)


def view_of(x: Tensor) -> Tensor:
    """A new Tensor object over x's elements (same shape, strides and memory), with no creator and no name."""
    return _wrap(x.buffer, x.dtype, x.shape, x.strides, x.offset, x.device)


def as_strided(x: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int = 0) -> Tensor:
    """A view of x's memory with the given layout (elements); the caller keeps it inside x's buffer."""
    return _as_strided(x, tuple(int(d) for d in shape), tuple(int(s) for s in strides), int(offset))


def _shape_arg(op: str, shape: Any) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(operator.index(d) for d in shape)  # 2.5 is refused, not truncated (as numpy does)
    except TypeError:
        raise TypeError(f"{op}: shape must be a sequence of integers, got {shape!r}") from None
    return out


MAX_BYTES = 2**63 - 1  # the largest byte count a device allocation can be asked for (a signed 64-bit size)


def alloc_for(op: str, shape: tuple, dtype: int, device: Device):
    """Device memory for a new contiguous tensor of `shape` (validated dims): a byte size that overflows, or memory
    the device cannot give, is an error naming the shape."""
    nbytes = math.prod(shape) * _dt.itemsize(dtype)
    if nbytes > MAX_BYTES:
        raise ValueError(f"{op}: shape {shape} of {_name(dtype)} needs {nbytes} bytes, more than any device can "
                         f"allocate ({MAX_BYTES})")
    try:
        return device.alloc(nbytes)
    except (MemoryError, OverflowError) as exc:
        raise MemoryError(f"{op}: cannot allocate a {_name(dtype)} tensor of shape {shape} ({nbytes} bytes) on "
                          f"{device.name}: {exc}") from None


def _entry_dtypes(entry) -> frozenset:
    return frozenset(entry.kernel_dtypes)


def _device_dtype(op: str, dtype: int, device: Device) -> None:
    if dtype not in _ALL:
        raise TypeError(f"{op}: unknown dtype {dtype!r}")
    if dtype not in device.dtypes:
        raise TypeError(f"{op}: device {device.name} does not support dtype {_name(dtype)} "
                        f"(supported: {', '.join(_name(d) for d in device.dtypes)})")


def empty(shape: Sequence[int], dtype: int = float32, device: Device | None = None) -> Tensor:
    """An uninitialised contiguous tensor."""
    if shape.__class__ is tuple and device is not None and dtype.__class__ is int:  # a shape seen before
        m = _META.get(shape)
        if m is not None and m[1] <= 1 << 24 and dtype in device.dtypes and all(d.__class__ is int for d in shape):
            # (larger tensors take alloc_for, which names the shape when the device cannot give the memory)
            return _wrap(device.alloc(m[1] * _ITEMSIZE[dtype]), dtype, shape, m[0], 0, device)
    shape = _shape_arg("empty", shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"empty: negative dimension in shape {shape}")
    device = _default_device() if device is None else device
    _device_dtype("empty", dtype, device)
    return _wrap(alloc_for("empty", shape, dtype, device), dtype, shape, _meta(shape)[0], 0, device)


def full(shape: Sequence[int], value: Any, dtype: int = float32, device: Device | None = None) -> Tensor:
    return fill(empty(shape, dtype, device), value)


def _default_device() -> Device:
    from singa import device as device_module  # only reached when no device is given

    return device_module.get_default_device()


def from_numpy(array: Any, device: Device | None = None, dtype: int | None = None) -> Tensor:
    """A tensor holding a copy of host data (float64 becomes float32 unless dtype says otherwise)."""
    arr = np.asarray(array)
    if dtype is None:
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        dtype = _dt.from_numpy_dtype(arr.dtype)
    else:
        arr = arr.astype(_dt.to_numpy_dtype(dtype), copy=False)
    t = empty(arr.shape, dtype, device)
    t.device.write(t, arr)
    return t


def to_numpy(x: Tensor) -> np.ndarray:
    return x.device.read(x)


# -- validation helpers -------------------------------------------------------------------------------------------


def _tensor(op: str, x: Any, what: str = "input") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {what} must be a Tensor, got {type(x).__name__}")


def _same_device(op: str, a, b) -> None:
    if a.device is not b.device:
        raise ValueError(f"{op}: tensors on different devices: {a.device.name} and {b.device.name} (use to_device)")


def _same_dtype(op: str, a, b) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: dtype mismatch {_name(a.dtype)} and {_name(b.dtype)} "
                        "(no implicit promotion; convert one with as_type)")


def _kind(dtype: int) -> int:
    """0 bool, 1 integer, 2 float: the order in which mixed binary operands are promoted."""
    return 2 if dtype in _FLOATS else (0 if dtype == bool_ else 1)


def _promote(op: str, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Operands of different kinds in the dtype of the higher kind (SINGA casts int to float); same kind, other
    width: TypeError naming both."""
    ka, kb = _kind(a.dtype), _kind(b.dtype)
    if ka == kb:
        if a.dtype != b.dtype:
            raise TypeError(f"{op}: dtype mismatch {_name(a.dtype)} and {_name(b.dtype)} (operands of one kind are "
                            "not widened implicitly; convert one with as_type)")
        return a, b
    if ka < kb:
        return cast(a, b.dtype), b
    return a, cast(b, a.dtype)


def _supported(op: str, dtype: int, allowed) -> None:
    if dtype not in allowed:
        names = ", ".join(_name(d) for d in sorted(allowed))
        raise TypeError(f"{op}: dtype {_name(dtype)} is not supported (supported: {names})")


def _axis(op: str, axis: Any, ndim: int, shape: tuple) -> int:
    try:
        a = int(axis)
    except TypeError:
        raise TypeError(f"{op}: axis must be an int, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise ValueError(f"{op}: axis {a} is out of range for shape {shape}")
    return a % ndim


def _axes(op: str, axis: Any, shape: tuple) -> tuple:
    """Sorted, de-duplicated non-negative axes; None means all."""
    nd = len(shape)
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    out = []
    for a in axis:
        a = _axis(op, a, nd, shape)
        if a in out:
            raise ValueError(f"{op}: repeated axis {a} for shape {shape}")
        out.append(a)
    return tuple(sorted(out))


def broadcast_shapes(op: str, s1: tuple, s2: tuple) -> tuple:
    """numpy's broadcast of two shapes; ValueError naming both when they are incompatible."""
    n1, n2 = len(s1), len(s2)
    n = builtins.max(n1, n2)
    out = []
    for i in range(n):
        d1 = s1[i - n + n1] if i >= n - n1 else 1
        d2 = s2[i - n + n2] if i >= n - n2 else 1
        if d1 == d2 or d2 == 1:
            out.append(d1)
        elif d1 == 1:
            out.append(d2)
        else:
            raise ValueError(f"{op}: cannot broadcast shapes {s1} and {s2}")
    return tuple(out)


def _bview(t, shape: tuple):
    """t as a view of `shape` (t's shape broadcasts to it): broadcast axes get stride 0."""
    if t.shape == shape:
        return t
    pad = len(shape) - len(t.shape)
    strides = [0] * pad
    for d, s, big in zip(t.shape, t.strides, shape[pad:]):
        strides.append(s if d == big else 0)
    return View(t.buffer, t.dtype, shape, tuple(strides), t.offset)


def _contig(shape: tuple, strides: tuple) -> bool:
    s = 1
    for d, st in zip(reversed(shape), reversed(strides)):
        if d != 1 and st != s:
            return False
        s *= d
    return True


def is_contiguous(x) -> bool:
    """Row-major contiguous (strides of size-1 axes do not matter)."""
    return _contig(x.shape, x.strides)


def _hazard(out, ins) -> bool:
    """Does writing `out` element by element clobber an input before it is read? Only an identical view is safe."""
    buf = out.buffer
    for v in ins:
        if v is not None and v.buffer is buf and v is not out and (
                v.offset != out.offset or v.strides != out.strides or v.shape != out.shape):
            return True
    return False


def _check_out(op: str, out: Any, shape: tuple, dtype: int, device: Device) -> None:
    _tensor(op, out, "out")
    if out.shape != shape:
        raise ValueError(f"{op}: output shape {out.shape} does not match the result shape {shape}")
    if out.dtype != dtype:
        raise TypeError(f"{op}: output dtype {_name(out.dtype)} does not match the result dtype {_name(dtype)}")
    if out.device is not device:
        raise ValueError(f"{op}: output on {out.device.name} but inputs on {device.name} (use to_device)")


def _run(op: str, kname: str, dtype: int, shape: tuple, dev: Device, ins: tuple, params: dict, out) -> Tensor:
    """Allocate (or check) the output and call one kernel whose first argument is the only output."""
    kernel = _table(dev)[kname]
    if out is None:
        r = _empty(shape, dtype, dev)
        if (_META.get(shape) or _meta(shape))[1]:
            kernel(r, *ins, **params)
        return r
    _check_out(op, out, shape, dtype, dev)
    if not (_META.get(shape) or _meta(shape))[1]:
        return out
    if is_contiguous(out) and not _hazard(out, ins):
        kernel(out, *ins, **params)
    else:  # kernels write contiguous outputs: compute aside, then copy into the strided / aliased target
        tmp = _empty(shape, dtype, dev)
        kernel(tmp, *ins, **params)
        _table(dev)["copy"](out, tmp)
    return out


def _contiguous_input(x: Tensor) -> Tensor:
    return x if _contig(x.shape, x.strides) else copy(x)


# -- scalars ------------------------------------------------------------------------------------------------------


def _scalar(op: str, v: Any, dtype: int) -> Any:
    """A Python scalar adopting `dtype`; refuses values the dtype cannot hold exactly (no silent truncation)."""
    if dtype in _FLOATS:
        return float(v)
    if dtype == bool_:
        if v in (0, 1) and not (isinstance(v, float) and math.isnan(v)):
            return bool(v)
        raise TypeError(f"{op}: scalar {v!r} cannot be used with a bool tensor")
    if isinstance(v, (float, np.floating)) and not float(v).is_integer():
        raise TypeError(f"{op}: float scalar {v!r} with an {_name(dtype)} tensor (no implicit promotion; "
                        "convert the tensor to a float dtype with as_type)")
    iv = int(v)
    info = np.iinfo(_dt.to_numpy_dtype(dtype))
    if not info.min <= iv <= info.max:
        raise ValueError(f"{op}: scalar {iv} is out of range for {_name(dtype)}")
    return iv


def _const(op: str, v: Any, dtype: int, dev: Device) -> Tensor:
    t = _empty((), dtype, dev)
    _table(dev)["fill"](t, value=_scalar(op, v, dtype))
    return t


def _array_operand(op: str, arr: np.ndarray, like: Tensor, promote: bool = False) -> Tensor:
    """A numpy operand becomes a tensor of the other operand's dtype if it is of the same kind; otherwise, where
    `promote` (binary operations), a tensor of its own dtype (float64 as float32, other integers as int32/int64)."""
    kind = "f" if like.dtype in _FLOATS else ("b" if like.dtype == bool_ else "i")
    akind = "i" if arr.dtype.kind == "u" else arr.dtype.kind
    if akind == kind:
        return from_numpy(arr, like.device, like.dtype)
    if not promote or akind not in "fib":
        raise TypeError(f"{op}: dtype mismatch {_name(like.dtype)} and numpy {arr.dtype} "
                        "(no implicit promotion; convert one first)")
    if akind == "f":
        code = float32
    elif akind == "b":
        code = bool_
    else:
        code = int64 if arr.dtype.itemsize > 4 else int32
    return from_numpy(arr, like.device, code)


# tensor OP scalar -> (scalar kernel, negate the scalar); scalar OP tensor -> scalar kernel. Floats only: integer
# tensors take the exact path through a 0-d constant (kernel parameters are floating point).
_RIGHT_SCALAR = {
    "add": ("add_scalar", False), "sub": ("add_scalar", True), "mul": ("mul_scalar", False),
    "div": ("div_scalar", False), "pow": ("pow_scalar", False), "lt": ("lt_scalar", False),
    "le": ("le_scalar", False), "gt": ("gt_scalar", False), "ge": ("ge_scalar", False), "eq": ("eq_scalar", False),
}
_LEFT_SCALAR = {
    "add": "add_scalar", "sub": "rsub_scalar", "mul": "mul_scalar", "div": "rdiv_scalar", "pow": "rpow_scalar",
    "lt": "gt_scalar", "le": "ge_scalar", "gt": "lt_scalar", "ge": "le_scalar", "eq": "eq_scalar",
}


# -- element-wise -------------------------------------------------------------------------------------------------


def binary(name: str, a: Any, b: Any, out: Tensor | None = None, alpha: float = 0.0, beta: float = 0.0) -> Tensor:
    """A binary entry of the expression table with numpy broadcasting; either operand may be a scalar or array.
    `alpha`/`beta` are its float parameters, if any (axpby)."""
    entry = _TABLE.get(name)
    if entry is None or entry.arity != 2:
        raise ValueError(f"unknown binary element-wise operation {name!r}")
    at, bt = isinstance(a, Tensor), isinstance(b, Tensor)
    if not (at and bt):
        if not (at or bt):
            raise TypeError(f"{name}: needs a Tensor operand, got {type(a).__name__} and {type(b).__name__}")
        t, s = (a, b) if at else (b, a)
        if isinstance(s, np.ndarray):
            s = _array_operand(name, s, t, promote=True)
        elif isinstance(s, SCALAR_TYPES):
            if isinstance(s, (float, np.floating)) and t.dtype not in _FLOATS:
                t = cast(t, float32)  # SINGA: a float scalar makes an integer (or bool) operation float
            elif t.dtype == bool_ and not isinstance(s, (bool, np.bool_)) and s not in (0, 1):
                t = cast(t, int32)  # bool * 2 counts: an integer result
            _supported(name, t.dtype, _entry_dtypes(entry))
            v = _scalar(name, s, t.dtype)
            odt = bool_ if entry.out_bool else t.dtype
            if t.dtype in _FLOATS:
                if at:
                    k = _RIGHT_SCALAR.get(name)
                    if k is not None:
                        return _run(name, k[0], odt, t.shape, t.device, (t,), {"alpha": -v if k[1] else v}, out)
                else:
                    k = _LEFT_SCALAR.get(name)
                    if k is not None:
                        return _run(name, k, odt, t.shape, t.device, (t,), {"alpha": v}, out)
            s = _const(name, v, t.dtype, t.device)
        else:
            raise TypeError(f"{name}: unsupported operand type {type(s).__name__} "
                            "(expected a Tensor, a number or a numpy array)")
        a, b = (t, s) if at else (s, t)
    _same_device(name, a, b)
    if a.dtype != b.dtype:
        a, b = _promote(name, a, b)
    _supported(name, a.dtype, _entry_dtypes(entry))
    shape = a.shape if a.shape == b.shape else broadcast_shapes(name, a.shape, b.shape)
    odt = bool_ if entry.out_bool else a.dtype
    params = {"alpha": float(alpha), "beta": float(beta)} if entry.params else _NOPARAMS
    return _run(name, name, odt, shape, a.device, (_bview(a, shape), _bview(b, shape)), params, out)


def _make_binary(name: str):
    entry = _TABLE[name]
    ok = _entry_dtypes(entry)
    out_bool = entry.out_bool
    right = _RIGHT_SCALAR.get(name)
    sname, negate = right if right is not None else (None, False)

    def op(a: Any, b: Any, out: Tensor | None = None) -> Tensor:
        # Fast paths for the shapes of training loops; anything unusual falls through to `binary`, which is the
        # reference behaviour (these only skip checks that cannot fail for the cases they accept).
        if a.__class__ is Tensor:
            shape = a.shape
            dt = a.dtype
            dev = a.device
            bc = b.__class__
            if bc is Tensor:
                if b.dtype != dt or b.device is not dev or dt not in ok:
                    return binary(name, a, b, out)
                if b.shape != shape:
                    nb = len(b.shape)
                    if not nb or nb > len(shape) or b.shape != shape[-nb:] or (out is not None and out is not a):
                        return binary(name, a, b, out)
                    if out is a and (out_bool or b.buffer is a.buffer
                                     or a.strides != (_META.get(shape) or _meta(shape))[0]):
                        return binary(name, a, b, out)
                    b = _bview(b, shape)  # b repeated over a's leading axes (a bias added to every row)
                alpha = None
            elif (bc is float or bc is int) and sname is not None and dt in _FLOATS:
                alpha = -float(b) if negate else float(b)  # tensor OP python scalar: the scalar kernel
            else:
                return binary(name, a, b, out)
            strides, n = _META.get(shape) or _meta(shape)
            if out is None:
                odt = bool_ if out_bool else dt
                r = _new(Tensor)
                r.buffer = dev.alloc(n * _ITEMSIZE[odt])
                r.dtype = odt
                r.shape = shape
                r.strides = strides
                r.offset = 0
                r.device = dev
                r.requires_grad = True
                r.stores_grad = False
                r.creator = None
                r.name = None
            elif out is a and not out_bool and a.strides == strides and (alpha is not None or b.buffer is not a.buffer):
                r = a  # in place (`a += b`): a is plainly contiguous and b does not overlap it
            else:
                return binary(name, a, b, out)
            if n:  # direct calls: a star-args call costs more than the checks above
                if alpha is None:
                    (_TABLES.get(dev) or _table(dev))[name](r, a, b)
                else:
                    (_TABLES.get(dev) or _table(dev))[sname](r, a, alpha=alpha)
            return r
        return binary(name, a, b, out)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise `{entry.expr}` with numpy broadcasting (expressions table entry {name!r})."
    return op


def unary(name: str, x: Tensor, alpha: float = 0.0, beta: float = 0.0, out: Tensor | None = None) -> Tensor:
    """A unary entry of the expression table; `alpha`/`beta` are its float parameters, if any."""
    entry = _TABLE.get(name)
    if entry is None or entry.arity != 1:
        raise ValueError(f"unknown unary element-wise operation {name!r}")
    _tensor(name, x)
    _supported(name, x.dtype, _entry_dtypes(entry))
    params = {"alpha": float(alpha), "beta": float(beta)} if entry.params else _NOPARAMS
    return _run(name, name, bool_ if entry.out_bool else x.dtype, x.shape, x.device, (x,), params, out)


def _make_unary(name: str):
    entry = _TABLE[name]
    ok = _entry_dtypes(entry)
    out_bool = entry.out_bool

    def op(x: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None and x.__class__ is Tensor and x.dtype in ok:
            dev = x.device
            r = _empty(x.shape, bool_ if out_bool else x.dtype, dev)
            if _META[x.shape][1]:
                (_TABLES.get(dev) or _table(dev))[name](r, x)
            return r
        return unary(name, x, out=out)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise `{entry.expr}` (expressions table entry {name!r})."
    return op


add = _make_binary("add")
sub = _make_binary("sub")
mul = _make_binary("mul")
div = _make_binary("div")
pow = _make_binary("pow")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
fmod = _make_binary("fmod")
mod = _make_binary("mod")
prelu = _make_binary("prelu")
logical_and = _make_binary("logical_and")
logical_or = _make_binary("logical_or")
logical_xor = _make_binary("logical_xor")
lt = _make_binary("lt")
le = _make_binary("le")
gt = _make_binary("gt")
ge = _make_binary("ge")
eq = _make_binary("eq")
ne = _make_binary("ne")
relu_grad = _make_binary("relu_grad")
sigmoid_grad = _make_binary("sigmoid_grad")
tanh_grad = _make_binary("tanh_grad")

abs = _make_unary("abs")
neg = _make_unary("neg")
sign = _make_unary("sign")
relu = _make_unary("relu")
exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
square = _make_unary("square")
reciprocal = _make_unary("reciprocal")
sigmoid = _make_unary("sigmoid")
tanh = _make_unary("tanh")
sin = _make_unary("sin")
cos = _make_unary("cos")
tan = _make_unary("tan")
asin = _make_unary("asin")
acos = _make_unary("acos")
atan = _make_unary("atan")
sinh = _make_unary("sinh")
cosh = _make_unary("cosh")
asinh = _make_unary("asinh")
acosh = _make_unary("acosh")
atanh = _make_unary("atanh")
erf = _make_unary("erf")
floor = _make_unary("floor")
ceil = _make_unary("ceil")
round = _make_unary("round")
softplus = _make_unary("softplus")
softsign = _make_unary("softsign")
gelu = _make_unary("gelu")
gelu_tanh = _make_unary("gelu_tanh")
isnan = _make_unary("isnan")
isinf = _make_unary("isinf")
logical_not = _make_unary("logical_not")


def axpby(alpha: float, a: Tensor, beta: float, b: Tensor, out: Tensor | None = None) -> Tensor:
    """alpha * a + beta * b in one pass over memory (numpy broadcasting; float dtypes). `out` may be `a` or `b`
    itself: `axpby(m, buf, 1.0, g, out=buf)` is an in-place momentum update."""
    if a.__class__ is Tensor and b.__class__ is Tensor:  # an optimizer's update: same-shape float operands
        shape, dt, dev = a.shape, a.dtype, a.device
        if b.shape == shape and b.dtype == dt and b.device is dev and dt in _FLOATS:
            strides, n = _META.get(shape) or _meta(shape)
            if out is None:
                r = _empty(shape, dt, dev)
            elif (out is a or out is b) and out.strides == strides and (a is b or a.buffer is not b.buffer):
                r = out  # in place: the other operand is the same view or lies in another buffer
            else:
                r = None
            if r is not None:
                if n:
                    (_TABLES.get(dev) or _table(dev))["axpby"](r, a, b, alpha=float(alpha), beta=float(beta))
                return r
    _tensor("axpby", a)
    _tensor("axpby", b)
    return binary("axpby", a, b, out, alpha, beta)


def sgd_momentum(w: Tensor, buf: Tensor, g: Tensor, lr: float, momentum: float) -> None:
    """SGD's momentum rule in place, one pass where the backend fuses it: buf = momentum * buf + g, then
    w = w - lr * buf. w, buf and g: one float dtype and shape on one device, contiguous, w and buf distinct."""
    for name, t in (("w", w), ("buf", buf), ("g", g)):
        _tensor("sgd_momentum", t, name)
    _same_device("sgd_momentum", w, buf)
    _same_device("sgd_momentum", w, g)
    (_TABLES.get(w.device) or _table(w.device))["sgd_momentum"](w, buf, g, lr=float(lr), momentum=float(momentum))


def leakyrelu(x: Tensor, alpha: float = 0.01, out: Tensor | None = None) -> Tensor:
    return unary("leakyrelu", x, alpha, out=out)


def elu(x: Tensor, alpha: float = 1.0, out: Tensor | None = None) -> Tensor:
    return unary("elu", x, alpha, out=out)


def selu(x: Tensor, alpha: float = 1.67326, gamma: float = 1.0507, out: Tensor | None = None) -> Tensor:
    return unary("selu", x, alpha, gamma, out=out)


def hardsigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5, out: Tensor | None = None) -> Tensor:
    return unary("hardsigmoid", x, alpha, beta, out=out)


def clip(x: Tensor, min: float | None = None, max: float | None = None, out: Tensor | None = None) -> Tensor:
    """Clamp to [min, max]; None leaves that side open."""
    lo = -math.inf if min is None else min
    hi = math.inf if max is None else max
    if x.dtype in _INTS:  # bounds must stay exact for integers
        info = np.iinfo(_dt.to_numpy_dtype(x.dtype))
        lo, hi = builtins.max(lo, info.min), builtins.min(hi, info.max)
        lo, hi = math.ceil(lo), math.floor(hi)
    return unary("clip", x, lo, hi, out=out)


def floor_divide(a: Any, b: Any, out: Tensor | None = None) -> Tensor:
    """Python's `//` (numpy's floor_divide): floor(a / b) without rounding the quotient first; integers exact, x // 0
    gives 0."""
    return binary("floor_divide", a, b, out)


def where(cond: Tensor, a: Any, b: Any, out: Tensor | None = None) -> Tensor:
    """cond ? a : b with broadcasting; cond is bool (other dtypes mean cond != 0); a or b may be scalars."""
    op = "where"
    _tensor(op, cond, "cond")
    if cond.dtype != bool_:
        cond = cast(cond, bool_)
    at, bt = isinstance(a, Tensor), isinstance(b, Tensor)
    if not (at or bt):
        raise TypeError(f"{op}: needs a Tensor for a or b (their dtype fixes the result's), got "
                        f"{type(a).__name__} and {type(b).__name__}")
    like = a if at else b
    a = a if at else (_array_operand(op, a, like) if isinstance(a, np.ndarray) else _const(op, a, like.dtype,
                                                                                             like.device))
    b = b if bt else (_array_operand(op, b, like) if isinstance(b, np.ndarray) else _const(op, b, like.dtype,
                                                                                             like.device))
    _same_device(op, cond, a)
    _same_device(op, a, b)
    _same_dtype(op, a, b)
    shape = broadcast_shapes(op, broadcast_shapes(op, cond.shape, a.shape), b.shape)
    ins = (_bview(cond, shape), _bview(a, shape), _bview(b, shape))
    return _run(op, "where", a.dtype, shape, a.device, ins, _NOPARAMS, out)


# -- memory and dtype ---------------------------------------------------------------------------------------------


def cast(x: Tensor, dtype: int, out: Tensor | None = None) -> Tensor:
    """A new tensor of `dtype` (float to int truncates toward zero, to bool is x != 0); same dtype copies."""
    _tensor("cast", x)
    _device_dtype("cast", dtype, x.device)
    kname = "copy" if dtype == x.dtype else "cast"
    return _run("cast", kname, dtype, x.shape, x.device, (x,), _NOPARAMS, out)


def copy(x: Tensor) -> Tensor:
    """A contiguous copy."""
    _tensor("copy", x)
    return _run("copy", "copy", x.dtype, x.shape, x.device, (x,), _NOPARAMS, None)


def contiguous(x: Tensor) -> Tensor:
    """x itself when row-major contiguous, else a contiguous copy."""
    _tensor("contiguous", x)
    return x if _contig(x.shape, x.strides) else copy(x)


def fill(x: Tensor, value: Any) -> Tensor:
    """Set every element of x (any layout) to value, in place; returns x."""
    if x.__class__ is Tensor and x.dtype in _FLOATS and value.__class__ in (float, int):
        if (_META.get(x.shape) or _meta(x.shape))[1]:
            (_TABLES.get(x.device) or _table(x.device))["fill"](x, value=float(value))
        return x
    _tensor("fill", x)
    if (_META.get(x.shape) or _meta(x.shape))[1]:
        _table(x.device)["fill"](x, value=_scalar("fill", value, x.dtype))
    return x


def assign(dst: Tensor, src: Any) -> Tensor:
    """Write src (a tensor broadcastable to dst, a scalar or a numpy array) into dst's elements, in place."""
    op = "assign"
    _tensor(op, dst, "dst")
    if isinstance(src, SCALAR_TYPES):
        return fill(dst, src)
    if isinstance(src, np.ndarray):
        src = _array_operand(op, src, dst)
    elif isinstance(src, (list, tuple)):
        src = _array_operand(op, np.asarray(src), dst)
    _tensor(op, src, "src")
    _same_device(op, dst, src)
    _same_dtype(op, dst, src)
    if broadcast_shapes(op, dst.shape, src.shape) != dst.shape:
        raise ValueError(f"{op}: cannot broadcast source shape {src.shape} to destination shape {dst.shape}")
    if not math.prod(dst.shape):
        return dst
    if src.buffer is dst.buffer:
        if src.offset == dst.offset and src.strides == dst.strides and src.shape == dst.shape:
            return dst  # `t[i] += 1` assigns a view to itself
        src = copy(src)
    _table(dst.device)["copy"](dst, _bview(src, dst.shape))
    return dst


# -- views --------------------------------------------------------------------------------------------------------


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """A view with permuted axes (reversed when None)."""
    _tensor("transpose", x)
    nd = len(x.shape)
    if axes is None:
        perm = tuple(range(nd - 1, -1, -1))
    else:
        try:
            perm = tuple(int(a) + nd if int(a) < 0 else int(a) for a in axes)
        except TypeError:
            raise TypeError(f"transpose: axes must be a sequence of ints, got {axes!r}") from None
        if sorted(perm) != list(range(nd)):
            raise ValueError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of shape "
                             f"{x.shape}")
    return _as_strided(x, tuple(x.shape[a] for a in perm), tuple(x.strides[a] for a in perm), x.offset)


def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    if x.__class__ is Tensor and len(x.shape) == 2 and a in (-1, 1, -2, 0) and b in (-1, 1, -2, 0) and a % 2 != b % 2:
        (r, c), (sr, sc) = x.shape, x.strides  # a matrix transposed (every matrix product's gradient)
        return _wrap(x.buffer, x.dtype, (c, r), (sc, sr), x.offset, x.device)
    nd = len(x.shape)
    a, b = _axis("swapaxes", a, nd, x.shape), _axis("swapaxes", b, nd, x.shape)
    perm = list(range(nd))
    perm[a], perm[b] = b, a
    return transpose(x, perm)


def _infer_shape(op: str, shape: Any, n: int, old: tuple) -> tuple:
    shape = _shape_arg(op, shape)
    if shape.count(-1) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {shape}")
    if any(d < -1 for d in shape):
        raise ValueError(f"{op}: negative dimension in {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or n % known:
            raise ValueError(f"{op}: cannot reshape {old} ({n} elements) to {shape}")
        shape = tuple(n // known if d == -1 else d for d in shape)
    if math.prod(shape) != n:
        raise ValueError(f"{op}: cannot reshape {old} ({n} elements) to {shape} ({math.prod(shape)} elements)")
    return shape


def _reshape_strides(old: tuple, ostrides: tuple, new: tuple) -> tuple | None:
    """Strides that give `new` over the same elements without a copy, or None (numpy's no-copy reshape rule)."""
    o = [(d, s) for d, s in zip(old, ostrides) if d != 1]
    nn = list(new)
    out = [0] * len(nn)
    i = j = 0  # i walks o, j walks nn
    while j < len(nn) and nn[j] == 1:
        j += 1
    while i < len(o) and j < len(nn):
        # gather one group of old axes and new axes with the same number of elements
        i0, j0 = i, j
        po, pn = o[i][0], nn[j]
        while po != pn:
            if po < pn:
                i += 1
                po *= o[i][0]
            else:
                j += 1
                pn *= nn[j]
        for k in range(i0, i):  # the old group must be one strided run
            if o[k][1] != o[k + 1][0] * o[k + 1][1]:
                return None
        s = o[i][1]
        for k in range(j, j0 - 1, -1):
            if nn[k] == 1:
                continue
            out[k] = s
            s *= nn[k]
        i += 1
        j += 1
        while j < len(nn) and nn[j] == 1:
            j += 1
    # size-1 axes of the new shape: any stride works; use the row-major one so contiguous stays contiguous
    s = 1
    for k in range(len(nn) - 1, -1, -1):
        if nn[k] == 1:
            out[k] = s
        else:
            s = out[k] * nn[k]
    return tuple(out)


def reshape(x: Tensor, shape: Sequence[int] | int) -> Tensor:
    """A view of the new shape when the layout allows it (always for contiguous x), else a reshaped copy."""
    if x.__class__ is Tensor and shape.__class__ is tuple:  # a shape of ints seen before, over contiguous x
        new = _META.get(shape)
        if new is not None:
            old = _META.get(x.shape) or _meta(x.shape)
            if new[1] == old[1] and x.strides == old[0] and all(d.__class__ is int for d in shape):
                return _wrap(x.buffer, x.dtype, shape, new[0], x.offset, x.device)
    _tensor("reshape", x)
    n = math.prod(x.shape)
    shape = _infer_shape("reshape", shape, n, x.shape)
    if shape == x.shape:
        return _as_strided(x, shape, x.strides, x.offset)
    if _contig(x.shape, x.strides):
        return _as_strided(x, shape, (_META.get(shape) or _meta(shape))[0], x.offset)
    if n:
        strides = _reshape_strides(x.shape, x.strides, shape)
        if strides is not None:
            return _as_strided(x, shape, strides, x.offset)
    c = copy(x)
    return _as_strided(c, shape, _meta(shape)[0], 0)


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    """2-D: (prod(shape[:axis]), prod(shape[axis:])) (ONNX Flatten)."""
    nd = len(x.shape)
    if not -nd <= axis <= nd:
        raise ValueError(f"flatten: axis {axis} is out of range for shape {x.shape}")
    if axis < 0:  # ONNX: a negative axis counts from the end, so -1 keeps the last axis apart
        axis += nd
    return reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def squeeze(x: Tensor, axis: int | Sequence[int] | None = None) -> Tensor:
    """Drop size-1 axes (all of them when axis is None): a view."""
    _tensor("squeeze", x)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = _axes("squeeze", axis, x.shape)
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(f"squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    keep = [i for i in range(len(x.shape)) if i not in axes]
    return _as_strided(x, tuple(x.shape[i] for i in keep), tuple(x.strides[i] for i in keep), x.offset)


def unsqueeze(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    """Insert size-1 axes at the given positions of the result: a view."""
    _tensor("unsqueeze", x)
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    nd = len(x.shape) + len(axes)
    pos = sorted(_axis("unsqueeze", a, nd, x.shape) for a in axes)
    if len(set(pos)) != len(pos):
        raise ValueError(f"unsqueeze: repeated axis in {axes}")
    shape, strides = list(x.shape), list(x.strides)
    for p in pos:
        inner = strides[p] * shape[p] if p < len(shape) else 1
        shape.insert(p, 1)
        strides.insert(p, inner)
    return _as_strided(x, tuple(shape), tuple(strides), x.offset)


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """numpy.broadcast_to: a stride-0 view of the given shape."""
    _tensor("broadcast_to", x)
    shape = _shape_arg("broadcast_to", shape)
    if len(shape) < len(x.shape) or broadcast_shapes("broadcast_to", x.shape, shape) != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    v = _bview(x, shape)
    return _as_strided(x, shape, v.strides, x.offset)


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    """ONNX Expand: broadcast x and `shape` together (either may have the 1s); a stride-0 view."""
    _tensor("expand", x)
    shape = broadcast_shapes("expand", x.shape, _shape_arg("expand", shape))
    return _as_strided(x, shape, _bview(x, shape).strides, x.offset)


def slice(x: Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
          steps: Sequence[int] | None = None) -> Tensor:
    """ONNX Slice (ends clamp, negative steps allowed): a view."""
    nd = len(x.shape)
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"slice: starts {list(starts)}, ends {list(ends)}, axes {axes} and steps {steps} "
                         "differ in length")
    key = [builtins.slice(None)] * nd
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("slice: step cannot be 0")
        key[_axis("slice", a, nd, x.shape)] = builtins.slice(int(s), int(e), int(st))
    return getitem(x, tuple(key))


def _index_array(op: str, idx: Any, dev: Device) -> Tensor:
    if isinstance(idx, Tensor):
        if idx.dtype not in _INTS:
            raise TypeError(f"{op}: indices must be int32 or int64, got {_name(idx.dtype)}")
        return idx
    arr = np.asarray(idx)
    if arr.dtype == np.bool_:
        raise TypeError(f"{op}: boolean mask indices are not supported (use where)")
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got {arr.dtype}")
    return from_numpy(arr.astype(np.int64), dev, int64)


def getitem(x: Tensor, key: Any) -> Tensor:
    """Indexing: ints, slices, None and ... give a view; an integer array (list, ndarray, Tensor) gathers axis 0."""
    if not isinstance(key, tuple):
        if isinstance(key, (list, np.ndarray, Tensor)):
            return gather(x, _index_array("getitem", key, x.device), 0)
        key = (key,)
    nd = len(x.shape)
    used = 0
    for k in key:
        if isinstance(k, (list, np.ndarray, Tensor)):
            raise TypeError("getitem: array indices inside a tuple are not supported; use gather")
        if isinstance(k, (bool, np.bool_)):
            raise TypeError("getitem: boolean indices are not supported")
        if k is not None and k is not Ellipsis:
            used += 1
    if used > nd:
        raise IndexError(f"too many indices for a tensor of shape {x.shape}: {used} indices")
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    shape, strides = [], []
    offset = x.offset
    ax = 0
    for k in key:
        if k is None:
            shape.append(1)
            strides.append(0)
        elif k is Ellipsis:
            for _ in range(nd - used):
                shape.append(x.shape[ax])
                strides.append(x.strides[ax])
                ax += 1
        elif isinstance(k, (int, np.integer)):
            d = x.shape[ax]
            i = int(k)
            if not -d <= i < d:
                raise IndexError(f"index {i} is out of bounds for axis {ax} with size {d} (shape {x.shape})")
            offset += (i % d) * x.strides[ax]
            ax += 1
        elif isinstance(k, builtins.slice):
            d = x.shape[ax]
            start, stop, step = k.indices(d)
            n = len(range(start, stop, step))
            if n:
                offset += start * x.strides[ax]
            shape.append(n)
            strides.append(x.strides[ax] * step)
            ax += 1
        else:
            raise TypeError(f"getitem: unsupported index {k!r} of type {type(k).__name__}")
    shape.extend(x.shape[ax:])
    strides.extend(x.strides[ax:])
    return _as_strided(x, tuple(shape), tuple(strides), offset)


def setitem(x: Tensor, key: Any, value: Any) -> None:
    """x[key] = value for basic indices (value broadcast, scalar or numpy array)."""
    if isinstance(key, (list, np.ndarray, Tensor)):
        raise TypeError("setitem: assignment through array indices is not supported; use scatter_add")
    assign(getitem(x, key), value)


# -- reductions ---------------------------------------------------------------------------------------------------


def _reduce(op: str, kname: str, x: Tensor, axis: Any, keepdims: bool, allowed, empty_value: Any) -> Tensor:
    if not keepdims and x.__class__ is Tensor and x.dtype in allowed and (axis is None or axis.__class__ is int):
        shape = x.shape
        nd = len(shape)
        strides, n = _META.get(shape) or _meta(shape)
        if n and nd and x.strides == strides and (axis is None or -nd <= axis < nd):  # a bias gradient, a mean
            if axis is None:
                axes, oshape = tuple(range(nd)), ()
            else:
                axis %= nd
                axes, oshape = (axis,), shape[:axis] + shape[axis + 1:]
            dev = x.device
            r = _empty(oshape, x.dtype, dev)
            (_TABLES.get(dev) or _table(dev))[kname](r, x, axes=axes)
            return r
    _tensor(op, x)
    _supported(op, x.dtype, allowed)
    axes = _axes(op, axis, x.shape)
    shape = x.shape
    oshape = tuple(d for i, d in enumerate(shape) if i not in axes)
    dev = x.device
    if not axes:
        r = copy(x)
    else:
        r = _empty(oshape, x.dtype, dev)
        if math.prod(oshape):
            if math.prod(shape[i] for i in axes) == 0:
                if empty_value is None:
                    raise ValueError(f"{op}: zero-size reduction over axes {axes} of shape {shape}")
                _table(dev)["fill"](r, value=empty_value)
            else:
                _table(dev)[kname](r, _contiguous_input(x), axes=axes)
    if keepdims:
        kshape = tuple(1 if i in axes else d for i, d in enumerate(shape))
        r = _as_strided(r, kshape, _meta(kshape)[0], 0)
    return r


def sum(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Sum over axes (all when None); bool sums count as int64, float16 accumulates in float32."""
    if isinstance(x, Tensor) and x.dtype == bool_:
        x = cast(x, int64)
    return _reduce("sum", "reduce_sum", x, axis, keepdims, _NUMERIC, 0)


def mean(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Mean over axes (float dtypes; an empty reduction gives NaN)."""
    return _reduce("mean", "reduce_mean", x, axis, keepdims, _FLOATS, math.nan)


def max(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return _reduce("max", "reduce_max", x, axis, keepdims, _NUMERIC, None)


def min(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return _reduce("min", "reduce_min", x, axis, keepdims, _NUMERIC, None)


def prod(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return _reduce("prod", "reduce_prod", x, axis, keepdims, _NUMERIC, 1)


def _arg(op: str, x: Tensor, axis: int | None, keepdims: bool) -> Tensor:
    _tensor(op, x)
    _supported(op, x.dtype, _NUMERIC)
    shape = x.shape
    if axis is None:
        xx = reshape(x, (math.prod(shape),))
        a = 0
        oshape = ()
        kshape = (1,) * len(shape)
    else:
        a = _axis(op, axis, len(shape), shape)
        xx = x
        oshape = shape[:a] + shape[a + 1:]
        kshape = shape[:a] + (1,) + shape[a + 1:]
    if xx.shape[a] == 0:
        raise ValueError(f"{op}: zero-size reduction over axis {a} of shape {xx.shape}")
    r = _empty(oshape, int64, x.device)
    if math.prod(oshape):
        _table(x.device)[op](r, _contiguous_input(xx), axis=a)
    return _as_strided(r, kshape, _meta(kshape)[0], 0) if keepdims else r


def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the first maximum (over the flattened tensor when axis is None)."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    return _arg("argmin", x, axis, keepdims)


# -- matrix products ----------------------------------------------------------------------------------------------


def _mat_operand(X: Tensor, S: tuple, B: int) -> tuple:
    """X of shape Sx + (r, c) as a (Bx, r, c) view (trans False) or a (Bx, c, r) view (trans True), Bx in {1, B}.

    Row-major and transposed layouts pass without a copy; only other layouts and partial batch broadcasts copy.
    """
    r, c = X.shape[-2:]
    Sx = X.shape[:-2]
    dt = X.dtype
    if math.prod(Sx) == 1:
        mshape, mstrides = (r, c), X.strides[-2:]
        if _contig(mshape, mstrides):
            return View(X.buffer, dt, (1, r, c), None, X.offset), False
        if _contig((c, r), mstrides[::-1]):
            return View(X.buffer, dt, (1, c, r), None, X.offset), True
        Xc = copy(_as_strided(X, mshape, mstrides, X.offset))
        return View(Xc.buffer, dt, (1, r, c), None, 0), False
    if (1,) * (len(S) - len(Sx)) + Sx == S:
        if _contig(X.shape, X.strides):
            return View(X.buffer, dt, (B, r, c), None, X.offset), False
        if _contig(Sx + (c, r), X.strides[:-2] + X.strides[-2:][::-1]):
            return View(X.buffer, dt, (B, c, r), None, X.offset), True
        Xc = copy(X)
    else:  # a partial broadcast of the batch axes: materialise the full batch
        Xc = copy(_as_strided(X, S + (r, c), _bview(X, S + (r, c)).strides, X.offset))
    return View(Xc.buffer, dt, (B, r, c), None, 0), False


def _plain_matrix(t: Tensor, r: int, c: int) -> tuple[View, bool] | None:
    """A 2-D t (r, c) as the kernel's (1, r, c) view when row-major, (1, c, r) with trans when it is a transposed
    row-major matrix; None for any other layout."""
    if t.strides == (c, 1):
        return make_view(t.buffer, t.dtype, (1, r, c), (r * c, c, 1), t.offset), False
    if t.strides == (1, r):
        return make_view(t.buffer, t.dtype, (1, c, r), (r * c, r, 1), t.offset), True
    return None


def _matrix_product(a: Tensor, b: Tensor, alpha: Any) -> Tensor | None:
    """The product of two float matrices, each row-major or a transposed row-major one, into a new tensor: the case of
    every fully connected layer and its gradients, without the general path's checks that cannot fail for it. None
    for anything else (matmul then takes the general path, which also names what is wrong)."""
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None
    dt, dev = a.dtype, a.device
    (m, k), (k2, n) = a.shape, b.shape
    if b.dtype != dt or dt not in _FLOATS or b.device is not dev or k != k2 or not (m and n and k):
        return None
    pa, pb = _plain_matrix(a, m, k), _plain_matrix(b, k, n)
    if pa is None or pb is None:
        return None
    target = _empty((m, n), dt, dev)
    (_TABLES.get(dev) or _table(dev))["matmul"](make_view(target.buffer, dt, (1, m, n), (m * n, n, 1), 0), pa[0],
                                                 pb[0], trans_a=pa[1], trans_b=pb[1], alpha=float(alpha), beta=0.0)
    return target


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> Tensor:
    """numpy.matmul (1-D operands, broadcast batch axes), scaled: alpha * a @ b (+ beta * out when out is given)."""
    if out is None and a.__class__ is Tensor and b.__class__ is Tensor:
        r = _matrix_product(a, b, alpha)
        if r is not None:
            return r
    op = "matmul"
    _tensor(op, a, "a")
    _tensor(op, b, "b")
    _same_device(op, a, b)
    _same_dtype(op, a, b)
    _supported(op, a.dtype, _NUMERIC)
    if not a.shape or not b.shape:
        raise ValueError(f"matmul: 0-d operand: a {a.shape} @ b {b.shape} (use mul for scalars)")
    A = a if len(a.shape) > 1 else _as_strided(a, (1,) + a.shape, (0,) + a.strides, a.offset)
    Bm = b if len(b.shape) > 1 else _as_strided(b, b.shape + (1,), b.strides + (0,), b.offset)
    m, k = A.shape[-2:]
    k2, n = Bm.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: inner dimensions differ: a {a.shape} @ b {b.shape}")
    try:
        S = broadcast_shapes(op, A.shape[:-2], Bm.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: cannot broadcast batch dimensions: a {a.shape} @ b {b.shape}") from None
    oshape = S + (m, n)
    if len(a.shape) == 1:
        oshape = oshape[:-2] + oshape[-1:]
    if len(b.shape) == 1:
        oshape = oshape[:-1]
    dev, dt = a.device, a.dtype
    if out is None:
        target = _empty(oshape, dt, dev)
        beta = 0.0
    else:
        _check_out(op, out, oshape, dt, dev)
        target = out
        if not is_contiguous(out) or out.buffer is a.buffer or out.buffer is b.buffer:
            target = copy(out) if beta != 0 else _empty(oshape, dt, dev)
    if math.prod(oshape):
        if k == 0:  # no products to sum: only the beta term remains
            if beta == 0:
                fill(target, 0)
            elif beta != 1:
                mul(target, beta, out=target)
        else:
            Bn = math.prod(S)
            if math.prod(Bm.shape[:-2]) == 1 and _contig(A.shape, A.strides):
                # b has no batch: fold a's batch into its rows, one large product instead of Bn small ones
                a3, ta = View(A.buffer, dt, (1, Bn * m, k), None, A.offset), False
                b3, tb = _mat_operand(Bm, (), 1)
                o3 = View(target.buffer, dt, (1, Bn * m, n), None, target.offset)
            else:
                a3, ta = _mat_operand(A, S, Bn)
                b3, tb = _mat_operand(Bm, S, Bn)
                o3 = View(target.buffer, dt, (Bn, m, n), None, target.offset)
            _table(dev)["matmul"](o3, a3, b3, trans_a=ta, trans_b=tb, alpha=float(alpha), beta=float(beta))
    if out is not None and target is not out:
        assign(out, target)
        return out
    return target


def tensordot(a: Tensor, b: Tensor, axes: Any = 2) -> Tensor:
    """numpy.tensordot: sum products over `axes` (an int n: last n of a with first n of b; or two axis lists)."""
    op = "tensordot"
    _tensor(op, a, "a")
    _tensor(op, b, "b")
    na, nb = len(a.shape), len(b.shape)
    if isinstance(axes, (int, np.integer)):
        if not 0 <= axes <= builtins.min(na, nb):
            raise ValueError(f"tensordot: axes={axes} is out of range for a {a.shape} and b {b.shape}")
        ax_a, ax_b = list(range(na - axes, na)), list(range(int(axes)))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, (int, np.integer)) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, (int, np.integer)) else list(ax_b)
        ax_a = [_axis(op, x, na, a.shape) for x in ax_a]
        ax_b = [_axis(op, x, nb, b.shape) for x in ax_b]
    if len(ax_a) != len(ax_b) or any(a.shape[i] != b.shape[j] for i, j in zip(ax_a, ax_b)):
        raise ValueError(f"tensordot: shape mismatch: a {a.shape} axes {tuple(ax_a)} and b {b.shape} axes "
                         f"{tuple(ax_b)}")
    free_a = [i for i in range(na) if i not in ax_a]
    free_b = [i for i in range(nb) if i not in ax_b]
    K = math.prod(a.shape[i] for i in ax_a)
    A2 = reshape(transpose(a, free_a + ax_a), (math.prod(a.shape[i] for i in free_a), K))
    B2 = reshape(transpose(b, ax_b + free_b), (K, math.prod(b.shape[i] for i in free_b)))
    return reshape(matmul(A2, B2), tuple(a.shape[i] for i in free_a) + tuple(b.shape[i] for i in free_b))


def einsum(subscripts: str, *operands: Tensor) -> Tensor:
    """numpy.einsum: explicit ('ij,jk->ik') or implicit output, '...', repeated indices (diagonals), size-1
    broadcasting, any number of operands (contracted left to right with matrix products)."""
    op = "einsum"
    if not operands:
        raise ValueError("einsum: no operands")
    for t in operands:
        _tensor(op, t, "operand")
        _same_device(op, operands[0], t)
        _same_dtype(op, operands[0], t)
    spec = subscripts.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} operand subscripts in {subscripts!r} for {len(operands)} operands")
    letters = set(spec) - set(",->.")
    if any(c not in string.ascii_letters for c in letters):
        raise ValueError(f"einsum: subscripts {subscripts!r} may use only letters, ',', '->' and '...'")
    spare = [c for c in string.ascii_letters if c not in letters]
    ell_nd = 0
    for term, t in zip(terms, operands):
        if "..." in term:
            ell_nd = builtins.max(ell_nd, len(t.shape) - (len(term) - 3))
    ell = "".join(spare[:ell_nd])
    expanded = []
    for i, (term, t) in enumerate(zip(terms, operands)):
        if "..." in term:
            k = len(t.shape) - (len(term) - 3)
            if k < 0:
                raise ValueError(f"einsum: subscripts {term!r} do not match operand {i} of shape {t.shape}")
            term = term.replace("...", ell[ell_nd - k:])
        if "." in term or len(term) != len(t.shape):
            raise ValueError(f"einsum: subscripts {term!r} do not match operand {i} of shape {t.shape}")
        expanded.append(term)
    if arrow:
        out_terms = rhs.replace("...", ell)
        if "." in out_terms or len(set(out_terms)) != len(out_terms):
            raise ValueError(f"einsum: bad output subscripts {rhs!r}")
        if any(c not in "".join(expanded) for c in out_terms):
            raise ValueError(f"einsum: output subscript in {rhs!r} does not appear in the inputs")
    else:
        counts = {}
        for term in expanded:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        out_terms = ell + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell))
    sizes: dict = {}
    for term, t in zip(expanded, operands):
        for c, d in zip(term, t.shape):
            s = sizes.get(c, 1)
            if d != s and d != 1 and s != 1:
                raise ValueError(f"einsum: size mismatch for index {c!r}: {s} and {d}")
            sizes[c] = builtins.max(s, d) if d != 1 and s != 1 else (d if s == 1 else s)
    # Normalise operands: take diagonals of repeated indices, broadcast size-1 axes, sum indices used nowhere else.
    work = []
    for idx, (term, t) in enumerate(zip(expanded, operands)):
        shape, strides, labels = [], [], []
        for c, d, s in zip(term, t.shape, t.strides):
            if c in labels:
                j = labels.index(c)
                if shape[j] != d:
                    raise ValueError(f"einsum: repeated index {c!r} of operand {idx} spans sizes {shape[j]} and {d}")
                strides[j] += s
            else:
                labels.append(c)
                shape.append(d)
                strides.append(s)
        for j, c in enumerate(labels):
            if shape[j] == 1 and sizes[c] != 1:
                shape[j], strides[j] = sizes[c], 0
        work.append([_as_strided(t, tuple(shape), tuple(strides), t.offset), "".join(labels)])
    cur, cl = work[0]
    for i in range(1, len(work) + 1):
        later = out_terms + "".join(w[1] for w in work[i:])
        drop = [j for j, c in enumerate(cl) if c not in later]
        if drop:
            cur = sum(cur, drop)
            cl = "".join(c for j, c in enumerate(cl) if j not in drop)
        if i == len(work):
            break
        nxt, nl = work[i]
        later = out_terms + "".join(w[1] for w in work[i + 1:])
        drop = [j for j, c in enumerate(nl) if c not in later and c not in cl]
        if drop:
            nxt = sum(nxt, drop)
            nl = "".join(c for j, c in enumerate(nl) if j not in drop)
        batch = [c for c in cl if c in nl and c in later]
        contr = [c for c in cl if c in nl and c not in later]
        a_only = [c for c in cl if c not in nl]
        b_only = [c for c in nl if c not in cl]
        A = transpose(cur, [cl.index(c) for c in batch + a_only + contr])
        Bt = transpose(nxt, [nl.index(c) for c in batch + contr + b_only])
        size = lambda cs: math.prod(sizes[c] for c in cs)  # noqa: E731
        A = reshape(A, (size(batch), size(a_only), size(contr)))
        Bt = reshape(Bt, (size(batch), size(contr), size(b_only)))
        cl = "".join(batch + a_only + b_only)
        cur = reshape(matmul(A, Bt), tuple(sizes[c] for c in cl))
    res = transpose(cur, [cl.index(c) for c in out_terms])
    if any(res.buffer is t.buffer for t in operands):
        res = copy(res)  # never hand back a view of an input
    return res


# -- concatenation, padding, indexing -----------------------------------------------------------------------------


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an existing axis: each is copied into its slice of the result."""
    op = "concat"
    ts = list(tensors)
    if not ts:
        raise ValueError("concat: needs at least one tensor")
    first = ts[0]
    for t in ts:
        _tensor(op, t)
        _same_device(op, first, t)
        _same_dtype(op, first, t)
    nd = len(first.shape)
    if nd == 0:
        raise ValueError("concat: 0-d tensors cannot be concatenated (unsqueeze them first)")
    ax = _axis(op, axis, nd, first.shape)
    for t in ts:
        if len(t.shape) != nd or any(d != e for i, (d, e) in enumerate(zip(first.shape, t.shape)) if i != ax):
            raise ValueError(f"concat: shapes {first.shape} and {t.shape} differ outside axis {ax}")
    oshape = first.shape[:ax] + (builtins.sum(t.shape[ax] for t in ts),) + first.shape[ax + 1:]
    dev = first.device
    r = _empty(oshape, first.dtype, dev)
    kernel = _table(dev)["copy"]
    pos = 0
    for t in ts:
        if math.prod(t.shape):
            kernel(View(r.buffer, r.dtype, t.shape, r.strides, pos * r.strides[ax]), t)
        pos += t.shape[ax]
    return r


def pad(x: Tensor, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """ONNX Pad: pads = (begin_0, ..., begin_n-1, end_0, ..., end_n-1); negative pads crop. Modes: constant,
    reflect, edge."""
    op = "pad"
    _tensor(op, x)
    nd = len(x.shape)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * nd:
        raise ValueError(f"pad: expected {2 * nd} pad values for shape {x.shape}, got {len(pads)}")
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
    if any(p < 0 for p in pads):  # crop first: a view
        key = tuple(builtins.slice(builtins.max(-pads[i], 0), x.shape[i] - builtins.max(-pads[i + nd], 0))
                    for i in range(nd))
        x = getitem(x, key)
        pads = [builtins.max(p, 0) for p in pads]
    for i in range(nd):
        d, p0, p1 = x.shape[i], pads[i], pads[i + nd]
        if mode == "reflect" and builtins.max(p0, p1) >= d and (p0 or p1):
            raise ValueError(f"pad: reflect padding ({p0}, {p1}) must be smaller than the size {d} of axis {i} in "
                             f"shape {x.shape}")
        if mode == "edge" and d == 0 and (p0 or p1):
            raise ValueError(f"pad: edge padding of the empty axis {i} in shape {x.shape}")
    oshape = tuple(x.shape[i] + pads[i] + pads[i + nd] for i in range(nd))
    params = {"pads": tuple(pads), "mode": mode, "value": float(value)}
    return _run(op, "pad", x.dtype, oshape, x.device, (_contiguous_input(x),), params, None)


def gather(x: Tensor, indices: Any, axis: int = 0) -> Tensor:
    """ONNX Gather / numpy.take: out.shape = x.shape[:axis] + indices.shape + x.shape[axis+1:]."""
    op = "gather"
    _tensor(op, x)
    idx = _index_array(op, indices, x.device)
    _same_device(op, x, idx)
    if not x.shape:
        raise ValueError("gather: cannot gather from a 0-d tensor")
    ax = _axis(op, axis, len(x.shape), x.shape)
    oshape = x.shape[:ax] + idx.shape + x.shape[ax + 1:]
    if x.shape[ax] == 0 and math.prod(idx.shape):
        raise IndexError(f"gather: cannot take indices from the empty axis {ax} of shape {x.shape}")
    return _run(op, "gather", x.dtype, oshape, x.device, (_contiguous_input(x), _contiguous_input(idx)),
                {"axis": ax}, None)


def scatter_add(target: Tensor, indices: Any, updates: Tensor, axis: int = 0) -> Tensor:
    """The adjoint of gather, in place: target[..., indices[j], ...] += updates[..., j, ...]; returns target."""
    op = "scatter_add"
    _tensor(op, target, "target")
    _tensor(op, updates, "updates")
    idx = _index_array(op, indices, target.device)
    _same_device(op, target, updates)
    _same_device(op, target, idx)
    _same_dtype(op, target, updates)
    if not target.shape:
        raise ValueError("scatter_add: target cannot be 0-d")
    ax = _axis(op, axis, len(target.shape), target.shape)
    want = target.shape[:ax] + idx.shape + target.shape[ax + 1:]
    if updates.shape != want:
        raise ValueError(f"scatter_add: updates shape {updates.shape} does not match {want} (target "
                         f"{target.shape}, indices {idx.shape}, axis {ax})")
    if not math.prod(updates.shape):
        return target
    ins = (_contiguous_input(idx), _contiguous_input(updates))
    kernel = _table(target.device)["scatter_add"]
    if is_contiguous(target) and not _hazard(target, ins):
        kernel(target, *ins, axis=ax)
    else:
        tmp = copy(target)
        kernel(tmp, *ins, axis=ax)
        assign(target, tmp)
    return target


def repeat(x: Tensor, repeats: int | Sequence[int], axis: int | None = None) -> Tensor:
    """numpy.repeat: each element repeated along axis (flattened first when axis is None)."""
    op = "repeat"
    _tensor(op, x)
    if axis is None:
        x = reshape(x, (math.prod(x.shape),))
        axis = 0
    if not x.shape:
        x = reshape(x, (1,))
    ax = _axis(op, axis, len(x.shape), x.shape)
    d = x.shape[ax]
    if isinstance(repeats, (int, np.integer)):
        r = int(repeats)
        if r < 0:
            raise ValueError(f"repeat: repeats must be non-negative, got {r}")
        # view with a stride-0 axis after `ax`, copied, then merged: no index array needed
        v = _as_strided(x, x.shape[:ax + 1] + (r,) + x.shape[ax + 1:], x.strides[:ax + 1] + (0,) + x.strides[ax + 1:],
                        x.offset)
        return reshape(copy(v), x.shape[:ax] + (d * r,) + x.shape[ax + 1:])
    reps = [int(n) for n in repeats]
    if len(reps) != d or any(n < 0 for n in reps):
        raise ValueError(f"repeat: repeats {reps} must be {d} non-negative counts for axis {ax} of shape {x.shape}")
    return gather(x, np.repeat(np.arange(d, dtype=np.int64), reps), ax)


def tile(x: Tensor, repeats: Sequence[int]) -> Tensor:
    """numpy.tile / ONNX Tile, as one copy of a stride-0 view."""
    _tensor("tile", x)
    reps = [int(r) for r in ([repeats] if isinstance(repeats, (int, np.integer)) else repeats)]
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repeats must be non-negative, got {reps}")
    nd = builtins.max(len(reps), len(x.shape))
    reps = [1] * (nd - len(reps)) + reps
    shape = (1,) * (nd - len(x.shape)) + x.shape
    strides = (0,) * (nd - len(x.shape)) + x.strides
    vshape, vstrides = [], []
    for r, d, s in zip(reps, shape, strides):
        vshape += [r, d]
        vstrides += [0, s]
    v = _as_strided(x, tuple(vshape), tuple(vstrides), x.offset)
    return reshape(copy(v), tuple(r * d for r, d in zip(reps, shape)))


# -- convolution and pooling (NCHW) -------------------------------------------------------------------------------


def _pair(op: str, v: Any, what: str, minimum: int) -> tuple:
    t = (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(e) for e in v)
    if len(t) != 2 or any(e < minimum for e in t):
        raise ValueError(f"{op}: {what} must be an int or a pair of ints >= {minimum}, got {v!r}")
    return t


def _pads4(op: str, p: Any) -> tuple:
    """(top, left, bottom, right) from an int, (ph, pw) or four values."""
    t = (int(p),) * 4 if isinstance(p, (int, np.integer)) else tuple(int(e) for e in p)
    if len(t) == 2:
        t = (t[0], t[1], t[0], t[1])
    if len(t) != 4 or any(e < 0 for e in t):
        raise ValueError(f"{op}: padding must be an int, (ph, pw) or (top, left, bottom, right) >= 0, got {p!r}")
    return t


def _conv_geometry(op: str, xs: tuple, ws: tuple, stride, padding, dilation, groups: int) -> tuple:
    if len(xs) != 4:
        raise ValueError(f"{op}: input must be 4-D (N, C, H, W), got shape {xs}")
    if len(ws) != 4:
        raise ValueError(f"{op}: weight must be 4-D (K, C/groups, kh, kw), got shape {ws}")
    stride = _pair(op, stride, "stride", 1)
    dilation = _pair(op, dilation, "dilation", 1)
    padding = _pads4(op, padding)
    groups = int(groups)
    N, C, H, W = xs
    K, Cg, kh, kw = ws
    if groups < 1 or Cg * groups != C or K % groups:
        raise ValueError(f"{op}: input {xs} and weight {ws} do not match with groups={groups} (need C = "
                         f"weight.shape[1] * groups and K divisible by groups)")
    oh = (H + padding[0] + padding[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (W + padding[1] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: kernel {(kh, kw)} with dilation {dilation} does not fit input {xs} with padding "
                         f"{padding}")
    return (N, K, oh, ow), {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def _float_pair(op: str, a: Tensor, b: Tensor) -> None:
    _same_device(op, a, b)
    _same_dtype(op, a, b)
    _supported(op, a.dtype, _FLOATS)


def conv2d(x: Tensor, w: Tensor, b: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, *, residual: Tensor | None = None, activation: str = "none",
           blocks: tuple[int, int] = (0, 0)) -> Tensor:
    """2-D cross-correlation: x (N, C, H, W), w (K, C/groups, kh, kw), b (K,) -> (N, K, OH, OW).
    padding: int, (ph, pw) or (top, left, bottom, right). `residual` (the output's shape) is added and `activation`
    ('none' or 'relu') applied in the same call (the conv2d_fused kernel: one pass where the backend fuses them).
    `blocks` (bx, bout), each 0 or the device's `channel_block`: x, and the output with the residual, hold their
    elements in channel blocks (N, C/B, H, W, B) instead of NCHW (their shapes stay NCHW; for code that keeps such
    tensors to itself, as the ONNX inference plan does between convolutions).
    Not differentiable with a residual or an activation: autograd composes those steps itself."""
    op = "conv2d"
    _tensor(op, x, "x")
    _tensor(op, w, "w")
    _float_pair(op, x, w)
    oshape, params = _conv_geometry(op, x.shape, w.shape, stride, padding, dilation, groups)
    if b is not None:
        _tensor(op, b, "b")
        _float_pair(op, x, b)
        if b.shape != (w.shape[0],):
            raise ValueError(f"conv2d: bias shape {b.shape} does not match the {w.shape[0]} kernels of weight "
                             f"{w.shape}")
        b = _contiguous_input(b)
    operands = (_contiguous_input(x), _contiguous_input(w), b)
    if blocks != (0, 0):
        block = x.device.channel_block
        if block <= 0 or any(v not in (0, block) for v in blocks) or (blocks[0] and x.shape[1] % block) or (
                blocks[1] and oshape[1] % block):
            raise ValueError(f"conv2d: blocks {blocks} for x {x.shape} -> {oshape} on {x.device.name}, whose channel "
                             f"block is {block}: each must be 0 or {block}, dividing the channels")
    elif residual is None and activation == "none":
        return _run(op, "conv2d", x.dtype, oshape, x.device, operands, params, None)
    if activation not in _FUSED_ACTIVATIONS:
        raise ValueError(f"conv2d: activation {activation!r}, expected one of {_FUSED_ACTIVATIONS}")
    if residual is not None:
        _tensor(op, residual, "residual")
        _float_pair(op, x, residual)
        if residual.shape != oshape:
            raise ValueError(f"conv2d: residual shape {residual.shape} does not match the output {oshape}")
        residual = _contiguous_input(residual)
    params = {**params, "activation": activation}
    if blocks != (0, 0):
        params["blocks"] = tuple(blocks)
    return _run(op, "conv2d_fused", x.dtype, oshape, x.device, operands + (residual,), params, None)


def conv2d_backward_data(dy: Tensor, w: Tensor, x_shape: Sequence[int], stride: Any = 1, padding: Any = 0,
                         dilation: Any = 1, groups: int = 1) -> Tensor:
    """Gradient of conv2d with respect to x (of shape x_shape)."""
    op = "conv2d_backward_data"
    _tensor(op, dy, "dy")
    _tensor(op, w, "w")
    _float_pair(op, dy, w)
    xs = _shape_arg(op, x_shape)
    oshape, params = _conv_geometry(op, xs, w.shape, stride, padding, dilation, groups)
    if dy.shape != oshape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match the conv2d output {oshape} for input {xs} and "
                         f"weight {w.shape}")
    return _run(op, op, dy.dtype, xs, dy.device, (_contiguous_input(dy), _contiguous_input(w)), params, None)


def conv2d_backward_weight(dy: Tensor, x: Tensor, w_shape: Sequence[int], stride: Any = 1, padding: Any = 0,
                           dilation: Any = 1, groups: int = 1) -> Tensor:
    """Gradient of conv2d with respect to w (of shape w_shape)."""
    op = "conv2d_backward_weight"
    _tensor(op, dy, "dy")
    _tensor(op, x, "x")
    _float_pair(op, dy, x)
    ws = _shape_arg(op, w_shape)
    oshape, params = _conv_geometry(op, x.shape, ws, stride, padding, dilation, groups)
    if dy.shape != oshape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match the conv2d output {oshape} for input {x.shape} "
                         f"and weight {ws}")
    return _run(op, op, dy.dtype, ws, dy.device, (_contiguous_input(dy), _contiguous_input(x)), params, None)


def _pool_len(n: int, k: int, s: int, p0: int, p1: int, d: int, ceil_mode: bool) -> int:
    span = n + p0 + p1 - d * (k - 1) - 1
    if span < 0:
        return 0
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= n + p0:  # the last window must start inside the input or its leading padding
        o -= 1
    return o


def pool_output_shape(x_shape: Sequence[int], kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                      ceil_mode: bool = False) -> tuple:
    """(N, C, OH, OW) of pool2d (PyTorch's rule for ceil_mode)."""
    op = "pool2d"
    xs = tuple(x_shape)
    if len(xs) != 4:
        raise ValueError(f"{op}: input must be 4-D (N, C, H, W), got shape {xs}")
    k = _pair(op, kernel, "kernel", 1)
    s = k if stride is None else _pair(op, stride, "stride", 1)
    p = _pads4(op, padding)
    d = _pair(op, dilation, "dilation", 1)
    oh = _pool_len(xs[2], k[0], s[0], p[0], p[2], d[0], ceil_mode)
    ow = _pool_len(xs[3], k[1], s[1], p[1], p[3], d[1], ceil_mode)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: kernel {k} with dilation {d} does not fit input {xs} with padding {p}")
    return (xs[0], xs[1], oh, ow)


def _pool_params(op: str, kernel, stride, padding, dilation, mode, count_include_pad) -> dict:
    if mode not in ("max", "avg"):
        raise ValueError(f"{op}: mode must be 'max' or 'avg', got {mode!r}")
    k = _pair(op, kernel, "kernel", 1)
    return {"kernel": k, "stride": k if stride is None else _pair(op, stride, "stride", 1),
            "padding": _pads4(op, padding), "dilation": _pair(op, dilation, "dilation", 1), "mode": mode,
            "count_include_pad": bool(count_include_pad)}


def pool2d(x: Tensor, kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, mode: str = "max",
           ceil_mode: bool = False, count_include_pad: bool = True,
           return_indices: bool = False, blocks: int = 0) -> Tensor | tuple[Tensor, Tensor | None]:
    """2-D max or average pooling of x (N, C, H, W); stride defaults to the kernel. With return_indices (max only),
    returns (y, indices) where indices (int64) feed pool2d_backward. `blocks`: 0, or the device's `channel_block`
    with x and y in channel blocks (see conv2d; no indices then)."""
    op = "pool2d"
    _tensor(op, x)
    _supported(op, x.dtype, _FLOATS)
    params = _pool_params(op, kernel, stride, padding, dilation, mode, count_include_pad)
    if blocks:
        block = x.device.channel_block
        if blocks != block or len(x.shape) != 4 or x.shape[1] % block or return_indices:
            raise ValueError(f"pool2d: blocks {blocks} for x {x.shape} on {x.device.name}, whose channel block is "
                             f"{block}: it must be {block or 'unused'}, dividing the channels, without indices")
        params["blocks"] = blocks
    oshape = pool_output_shape(x.shape, params["kernel"], params["stride"], params["padding"], params["dilation"],
                               ceil_mode)
    dev = x.device
    y = _empty(oshape, x.dtype, dev)
    idx = _empty(oshape, int64, dev) if return_indices and mode == "max" else None
    if math.prod(oshape):
        _table(dev)["pool2d"](y, idx, _contiguous_input(x), **params)
    if return_indices:
        return y, idx
    return y


def pool2d_backward(dy: Tensor, x: Tensor, indices: Tensor | None = None, kernel: Any = 2, stride: Any = None,
                    padding: Any = 0, dilation: Any = 1, mode: str = "max", count_include_pad: bool = True) -> Tensor:
    """Gradient of pool2d with respect to x (max uses `indices` from the forward when given)."""
    op = "pool2d_backward"
    _tensor(op, dy, "dy")
    _tensor(op, x, "x")
    _float_pair(op, dy, x)
    params = _pool_params(op, kernel, stride, padding, dilation, mode, count_include_pad)
    if len(x.shape) != 4 or len(dy.shape) != 4 or dy.shape[:2] != x.shape[:2]:
        raise ValueError(f"{op}: dy {dy.shape} and x {x.shape} must be 4-D with the same (N, C)")
    if indices is not None:
        _tensor(op, indices, "indices")
        if indices.shape != dy.shape or indices.dtype != int64:
            raise ValueError(f"{op}: indices {indices.shape} {_name(indices.dtype)} must be int64 of dy's shape "
                             f"{dy.shape}")
        _same_device(op, dy, indices)
        indices = _contiguous_input(indices)
    dx = _empty(x.shape, x.dtype, x.device)
    if math.prod(x.shape):
        if math.prod(dy.shape):
            _table(x.device)["pool2d_backward"](dx, _contiguous_input(dy), _contiguous_input(x), indices, **params)
        else:
            fill(dx, 0)
    return dx


# -- normalisation, softmax, losses -------------------------------------------------------------------------------


def _bn_check(op: str, x: Tensor, **per_channel: Tensor) -> None:
    _tensor(op, x, "x")
    _supported(op, x.dtype, _FLOATS)
    if len(x.shape) not in (2, 4):
        raise ValueError(f"{op}: x must be (N, C) or (N, C, H, W), got shape {x.shape}")
    C = x.shape[1]
    for what, t in per_channel.items():
        _tensor(op, t, what)
        _same_device(op, x, t)
        _same_dtype(op, x, t)
        if t.shape != (C,):
            raise ValueError(f"{op}: {what} shape {t.shape} does not match the {C} channels of x {x.shape}")


def batchnorm_train(x: Tensor, scale: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                    momentum: float = 0.9, eps: float = 1e-5) -> tuple:
    """Batch normalisation with batch statistics over (N, H, W); updates running_mean/var in place
    (r = momentum * r + (1 - momentum) * batch). Returns (y, saved_mean, saved_invstd) for the backward."""
    op = "batchnorm_train"
    _bn_check(op, x, scale=scale, bias=bias, running_mean=running_mean, running_var=running_var)
    if math.prod(x.shape) == 0:
        raise ValueError(f"{op}: cannot compute batch statistics of an empty batch {x.shape}")
    dev = x.device
    C = x.shape[1]
    y = _empty(x.shape, x.dtype, dev)
    saved_mean = _empty((C,), x.dtype, dev)
    saved_invstd = _empty((C,), x.dtype, dev)
    rm = running_mean if is_contiguous(running_mean) else copy(running_mean)
    rv = running_var if is_contiguous(running_var) else copy(running_var)
    _table(dev)[op](y, rm, rv, saved_mean, saved_invstd, _contiguous_input(x), _contiguous_input(scale),
                  _contiguous_input(bias), momentum=float(momentum), eps=float(eps))
    if rm is not running_mean:
        assign(running_mean, rm)
    if rv is not running_var:
        assign(running_var, rv)
    return y, saved_mean, saved_invstd


def batchnorm_infer(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, eps: float = 1e-5) -> Tensor:
    """y = (x - mean) / sqrt(var + eps) * scale + bias, per channel."""
    op = "batchnorm_infer"
    _bn_check(op, x, scale=scale, bias=bias, mean=mean, var=var)
    ins = tuple(_contiguous_input(t) for t in (x, scale, bias, mean, var))
    return _run(op, op, x.dtype, x.shape, x.device, ins, {"eps": float(eps)}, None)


def batchnorm_backward(dy: Tensor, x: Tensor, scale: Tensor, saved_mean: Tensor, saved_invstd: Tensor) -> tuple:
    """Gradients (dx, dscale, dbias) of batchnorm_train."""
    op = "batchnorm_backward"
    _bn_check(op, x, scale=scale, saved_mean=saved_mean, saved_invstd=saved_invstd)
    _tensor(op, dy, "dy")
    _same_device(op, x, dy)
    _same_dtype(op, x, dy)
    if dy.shape != x.shape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match x {x.shape}")
    dev = x.device
    C = x.shape[1]
    dx = _empty(x.shape, x.dtype, dev)
    dscale = _empty((C,), x.dtype, dev)
    dbias = _empty((C,), x.dtype, dev)
    if math.prod(x.shape):
        _table(dev)[op](dx, dscale, dbias, *(_contiguous_input(t) for t in (dy, x, scale, saved_mean, saved_invstd)))
    return dx, dscale, dbias


def layer_norm(x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None, axis: int = -1,
               eps: float = 1e-5) -> tuple:
    """Layer normalisation over the axes from `axis` to the last: (y, mean, invstd), y of x's shape, mean and
    invstd = 1 / sqrt(var + eps) of shape x.shape[:axis] (the biased variance, as ONNX LayerNormalization and
    torch.nn.LayerNorm). `scale` and `bias` broadcast to x.shape[axis:] (None: 1 and 0)."""
    op = "layer_norm"
    _tensor(op, x, "x")
    _supported(op, x.dtype, _FLOATS)
    nd = len(x.shape)
    if nd == 0:
        raise ValueError(f"{op}: x must have at least one axis, got a 0-d tensor")
    ax = _axis(op, axis, nd, x.shape)
    lead, norm = x.shape[:ax], x.shape[ax:]
    rows, cols = math.prod(lead), math.prod(norm)
    vecs = []
    for what, t in (("scale", scale), ("bias", bias)):
        if t is not None:
            _tensor(op, t, what)
            _same_device(op, x, t)
            _same_dtype(op, x, t)
            if t.shape != norm:
                try:
                    t = broadcast_to(t, norm)
                except ValueError:
                    raise ValueError(f"{op}: {what} of shape {t.shape} does not broadcast to the normalised shape "
                                     f"{norm} of x {x.shape} (axis {axis})") from None
            t = _contiguous_input(t)
            t = _as_strided(t, (cols,), (1,), t.offset)
        vecs.append(t)
    dev = x.device
    y = _empty(x.shape, x.dtype, dev)
    mean, invstd = _empty(lead, x.dtype, dev), _empty(lead, x.dtype, dev)
    if rows and cols:
        xc = _contiguous_input(x)
        dt = x.dtype
        _table(dev)[op](View(y.buffer, dt, (rows, cols), (cols, 1), 0), View(mean.buffer, dt, (rows,), (1,), 0),
                        View(invstd.buffer, dt, (rows,), (1,), 0),
                        View(xc.buffer, dt, (rows, cols), (cols, 1), xc.offset), *vecs, eps=float(eps))
    elif rows:  # nothing to normalise: NaN statistics, as a mean over no elements
        fill(mean, math.nan)
        fill(invstd, math.nan)
    return y, mean, invstd


def _softmax_like(op: str, kname: str, x: Tensor, axis: int) -> Tensor:
    _tensor(op, x)
    _supported(op, x.dtype, _FLOATS)
    ax = _axis(op, axis, len(x.shape), x.shape)
    return _run(op, kname, x.dtype, x.shape, x.device, (_contiguous_input(x),), {"axis": ax}, None)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return _softmax_like("softmax", "softmax", x, axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    return _softmax_like("log_softmax", "log_softmax", x, axis)


def _softmax_grad(op: str, dy: Tensor, y: Tensor, axis: int) -> Tensor:
    _tensor(op, dy, "dy")
    _tensor(op, y, "y")
    _float_pair(op, dy, y)
    if dy.shape != y.shape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match y {y.shape}")
    ax = _axis(op, axis, len(y.shape), y.shape)
    return _run(op, op, y.dtype, y.shape, y.device, (_contiguous_input(dy), _contiguous_input(y)), {"axis": ax},
                None)


def softmax_backward(dy: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    """dx from dy and the softmax output y."""
    return _softmax_grad("softmax_backward", dy, y, axis)


def log_softmax_backward(dy: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    """dx from dy and the log-softmax output y."""
    return _softmax_grad("log_softmax_backward", dy, y, axis)


def check_labels(op: str, labels: Tensor, classes: int) -> None:
    """Class labels must be whole numbers in [0, classes): else an error naming the first bad label and its position
    (no wrapping of -1 to the last class, no truncation of 2.5). Integer labels are checked by the device
    (`Device.find_label_outside`: a copy to the host and numpy, or the backend's own scan), float ones on the host; in
    a step recorded for graph mode the check is part of the graph and runs at every replay (`graph.host_check`), before
    any kernel of the step, on every backend."""
    _tensor(op, labels, "labels")

    def check(view: Any) -> None:
        dev = view.buffer.device
        if view.dtype in _INTS:
            i = dev.find_label_outside(view, classes)
            if i >= 0:
                v = int(dev.read(view).reshape(-1)[i])
                raise IndexError(f"{op}: label {v} at position {i} is outside [0, {classes}) ({classes} classes)")
            return
        arr = dev.read(view).reshape(-1)
        if arr.dtype.kind == "f":
            whole = np.isfinite(arr) & (np.floor(arr) == arr)
            if not whole.all():
                i = int(np.argmin(whole))
                raise ValueError(f"{op}: label {arr[i].item()!r} at position {i} is not a whole number (class labels "
                                 f"are integers in [0, {classes}))")
        bad = (arr < 0) | (arr >= classes)
        if bad.any():
            i = int(np.argmax(bad))
            v = arr[i].item()
            raise IndexError(f"{op}: label {int(v) if float(v).is_integer() else v} at position {i} is outside "
                             f"[0, {classes}) ({classes} classes)")

    _graph.host_check(f"{op}:check_labels", check, labels)


def _xent_check(op: str, x: Tensor, target: Tensor, labels: bool = True) -> Tensor:
    _tensor(op, x, "x")
    _tensor(op, target, "target")
    _supported(op, x.dtype, _FLOATS)
    _same_device(op, x, target)
    if len(x.shape) != 2:
        raise ValueError(f"{op}: x must be 2-D (N, C), got shape {x.shape}")
    N, C = x.shape
    if target.dtype in _INTS:
        if target.shape == (N, 1):
            target = reshape(target, (N,))
        if target.shape != (N,):
            raise ValueError(f"{op}: label target shape {target.shape} does not match x {x.shape} (expected ({N},))")
        if labels:
            check_labels(op, target, C)
    else:
        _same_dtype(op, x, target)
        if target.shape != (N, C):
            raise ValueError(f"{op}: target shape {target.shape} does not match x {x.shape} (expected ({N},) "
                             f"int labels or ({N}, {C}) distributions)")
    return _contiguous_input(target)


def softmax_cross_entropy(x: Tensor, target: Tensor) -> Tensor:
    """Per-row loss -sum(t * log_softmax(x)) of x (N, C); target: int labels (N,) or distributions (N, C)."""
    op = "softmax_cross_entropy"
    target = _xent_check(op, x, target)
    return _run(op, op, x.dtype, (x.shape[0],), x.device, (_contiguous_input(x), target), _NOPARAMS, None)


def softmax_cross_entropy_backward(dloss: Any, x: Tensor, target: Tensor, *, labels_checked: bool = False) -> Tensor:
    """dx = (softmax(x) - t) * dloss[:, None]; dloss is (N,) or a number. `labels_checked`: the caller's forward
    checked these very labels (check_labels), unchanged since; autograd's loss passes it, which saves a host read of
    the labels per step."""
    op = "softmax_cross_entropy_backward"
    target = _xent_check(op, x, target, labels=not labels_checked)
    N = x.shape[0]
    if isinstance(dloss, SCALAR_TYPES):
        dloss = fill(_empty((N,), x.dtype, x.device), dloss)
    _tensor(op, dloss, "dloss")
    _same_device(op, x, dloss)
    _same_dtype(op, x, dloss)
    if dloss.shape != (N,):
        raise ValueError(f"{op}: dloss shape {dloss.shape} does not match the {N} rows of x {x.shape}")
    return _run(op, op, x.dtype, x.shape, x.device, (_contiguous_input(dloss), _contiguous_input(x), target),
                _NOPARAMS, None)


# -- random numbers (the device's counter-based generator: device.set_rand_seed) ----------------------------------


def _random(op: str, kname: str, x: Tensor, draws_per_element: int, params: dict, allowed) -> Tensor:
    _tensor(op, x)
    _supported(op, x.dtype, allowed)
    n = math.prod(x.shape)
    if not n:
        return x
    dev = x.device
    target = x if is_contiguous(x) else _empty(x.shape, x.dtype, dev)
    offset = dev.next_rng_offset(n * draws_per_element)
    _table(dev)[kname](target, seed=dev.seed, offset=offset, **params)
    if target is not x:
        assign(x, target)
    return x


def random_uniform(x: Tensor, low: float = 0.0, high: float = 1.0) -> Tensor:
    """Fill x in place with uniform values in [low, high); returns x."""
    return _random("random_uniform", "random_uniform", x, 1, {"low": float(low), "high": float(high)}, _FLOATS)


def random_normal(x: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill x in place with normal values; returns x."""
    return _random("random_normal", "random_normal", x, 2, {"mean": float(mean), "std": float(std)}, _FLOATS)


def random_bernoulli(x: Tensor, p: float) -> Tensor:
    """Fill x in place with 1 (probability p) or 0; returns x."""
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"random_bernoulli: p must be in [0, 1], got {p}")
    return _random("random_bernoulli", "random_bernoulli", x, 1, {"p": float(p)}, _ALL)


# The hottest operators are these functions themselves (one Python call less than a method that forwards to them).
# Element-wise add and mul commute, so the reflected forms can be the same functions.
Tensor.__add__ = Tensor.__radd__ = add
Tensor.__mul__ = Tensor.__rmul__ = mul
Tensor.__sub__ = sub
Tensor.__truediv__ = div
