"""SINGA's `tensor` module: the Tensor class and its module functions, over any device plugin.

A Tensor is a *view* in the sense of `singa.backend`: `buffer` (opaque device memory), `dtype`, `shape`, `strides`
(elements), `offset` (elements) and `device`, plus autograd's `requires_grad`, `stores_grad`, `creator` and `name`.
Computation is delegated to `singa.ops`, which calls the device's kernels; this module never touches device memory.

Behaviour worth knowing (see `singa.ops` for the full dtype rule):

* No implicit dtype promotion: `a + b` with float32 and int32 tensors raises TypeError naming both; a Python scalar
  takes the tensor's dtype. `Tensor(data=...)` keeps the data's dtype, except that float64 becomes float32 (numpy's
  default float is not a SINGA type); an explicit `dtype=` converts the data.
* Comparison operators (`<`, `<=`, `>`, `>=`, `==`, `!=`) follow SINGA: a tensor of 0/1 in the operands' dtype. `ops.lt`
  and friends return bool tensors instead.
* Transposes, basic slicing (`t[1:, ::2]`), `reshape` of contiguous tensors and broadcasting are views sharing memory;
  in-place operators (`+=` ...) write into the tensor's own memory (and through views into their base).
* `to_device` / `to_host` move the tensor in place and return it.
* `l1()` / `l2()` are SINGA's *average* norms: sum(|x|) / size and sqrt(sum(x^2)) / size.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from singa import device as _device_mod
from singa import dtypes as _dt
from singa.backend import Device, View

# SINGA's dtype codes (float32=0, float16=1, int32=2), plus what ONNX needs.
float32: int = _dt.float32
float16: int = _dt.float16
int32: int = _dt.int32
int64: int = _dt.int64
bool_: int = _dt.bool_
bool = _dt.bool_  # `tensor.bool` is API; the builtin is builtins.bool here


class _DefaultDtype(int):
    """float32, marking that the caller did not choose a dtype (then `data` keeps its own)."""

    def __repr__(self) -> str:
        return "float32"


_FLOAT32_DEFAULT = _DefaultDtype(_dt.float32)

_STR_DTYPES = {
    "float": _dt.float32, "float32": _dt.float32, "float16": _dt.float16, "half": _dt.float16,
    "int": _dt.int32, "int32": _dt.int32, "int64": _dt.int64, "bool": _dt.bool_,
    "float64": _dt.float64, "double": _dt.float64, "kFloat32": _dt.float32, "kFloat16": _dt.float16, "kInt": _dt.int32,
}


def _as_dtype(dtype: Any) -> int:
    """A SINGA dtype code from a code, a name ('float32', SINGA's 'int'/'float') or a numpy dtype."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, (builtins.bool, np.bool_)):
        if int(dtype) in _dt.ALL or int(dtype) in _dt.OPTIONAL:
            return int(dtype)
        raise TypeError(f"unknown SINGA dtype code {dtype!r}; use one of tensor.float32, float16, int32, int64, bool")
    if isinstance(dtype, str) and dtype in _STR_DTYPES:
        return _STR_DTYPES[dtype]
    try:
        code = _dt.from_numpy_dtype(dtype)
    except TypeError:
        raise
    except Exception:  # noqa: BLE001 - anything numpy cannot read as a dtype
        raise TypeError(f"{dtype!r} is not a dtype") from None
    return code


def _as_shape(shape: Any) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(operator.index(d) for d in shape)  # 2.5 is refused, not truncated (as numpy does)
    except TypeError:
        raise TypeError(f"shape must be a sequence of integers, got {shape!r}") from None
    if any(d < 0 for d in out):
        raise ValueError(f"negative dimension in shape {out}")
    return out


def _as_device(device: Any) -> Device:
    if device is None:
        return _device_mod.get_default_device()
    if isinstance(device, str):
        return _device_mod.get_device(device)
    if not isinstance(device, Device):
        raise TypeError(f"expected a singa Device (or a spec such as 'cpu'), got {type(device).__name__}")
    return device


def _host_array(data: Any, dtype: Any) -> tuple[np.ndarray, int]:
    """numpy data and its SINGA dtype: `dtype` wins when chosen, otherwise the data's own, float64 narrowed."""
    arr = np.asarray(data)
    if dtype is _FLOAT32_DEFAULT:
        if arr.dtype == np.float64:
            return arr.astype(np.float32), _dt.float32
        if arr.dtype.kind in "iu" and arr.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            arr = arr.astype(np.int64)  # uint8 images, int16 ... widen losslessly
        code = _dt.from_numpy_dtype(arr.dtype)
        return arr, code
    code = _as_dtype(dtype)
    return arr.astype(_dt.to_numpy_dtype(code), copy=False), code


class Tensor:
    """An n-dimensional array on a device (SINGA's `tensor.Tensor`).

    `Tensor(shape, device, dtype)` allocates zero-filled memory; `Tensor(data=array_or_list)` copies host data (its
    shape, and its dtype unless `dtype` is given; float64 becomes float32).
    """

    __slots__ = ("buffer", "dtype", "shape", "strides", "offset", "device",
                 "requires_grad", "stores_grad", "creator", "name", "__dict__", "__weakref__")

    # Operators return tensors for ==, so hashing stays identity-based (tensors are used as dict keys by autograd).
    __hash__ = object.__hash__
    # Make numpy defer to our reflected operators (`ndarray + Tensor` -> Tensor.__radd__) instead of converting us.
    __array_ufunc__ = None

    def __init__(self, shape: Sequence[int] = (), device: Device | str | None = None, dtype: int = _FLOAT32_DEFAULT,
                 data: Any = None, requires_grad: builtins.bool = True, stores_grad: builtins.bool = False,
                 creator: Any = None, name: str | None = None) -> None:
        dev = _as_device(device)
        arr = None
        if data is not None:
            if isinstance(data, Tensor):
                data = data.to_numpy()
            arr, code = _host_array(data, dtype)
            if arr.dtype == object:
                raise TypeError("Tensor data must be numeric")
            if shape not in ((), None) and _as_shape(shape) != arr.shape:
                want = _as_shape(shape)
                if math.prod(want) != arr.size:
                    raise ValueError(f"Tensor: data of shape {arr.shape} does not fit shape {want}")
                arr = arr.reshape(want)
            shp = tuple(int(d) for d in arr.shape)
        else:
            shp = _as_shape(shape if shape is not None else ())
            code = _as_dtype(dtype)
        strides, n = _ops._meta(shp)
        self.buffer = _ops.alloc_for("Tensor", shp, code, dev)
        self.dtype = code
        self.shape = shp
        self.strides = strides
        self.offset = 0
        self.device = dev
        self.requires_grad = requires_grad
        self.stores_grad = stores_grad
        self.creator = creator
        self.name = name
        if arr is not None:
            dev.write(self, arr)
        elif n:
            dev.table["fill"](self, value=0)

    # -- properties in SINGA's (method) spelling ---------------------------------------------------------------------
    @property
    def data(self) -> Tensor:
        """SINGA's raw tensor handle (a CTensor there); here a Tensor is its own raw tensor. Assigning another
        tensor makes this one share its memory, shape and dtype (SINGA replaces the raw tensor); `W.data += d.data`
        adds in place."""
        return self

    @data.setter
    def data(self, value: Tensor) -> None:
        if value is self:
            return  # `t.data += x` (the in-place operator already wrote into t)
        if not isinstance(value, Tensor):
            raise TypeError(f"Tensor.data: expected a Tensor (SINGA's raw tensor), got {type(value).__name__}")
        self._adopt(value)

    def is_dummy(self) -> builtins.bool:
        """True for a tensor that no operator produced (no creator, or autograd's Dummy placeholder)."""
        c = self.creator
        return c is None or type(c).__name__ == "Dummy"

    def ndim(self) -> int:
        return len(self.shape)

    def is_empty(self) -> builtins.bool:
        """SINGA's definition (a tensor of shape ()), extended to shapes with a zero-sized axis."""
        return not self.shape or 0 in self.shape

    def is_transpose(self) -> builtins.bool:
        """True when the memory layout is not row-major (a transposed view), as SINGA's transpose flag."""
        last = None
        for d, s in zip(self.shape, self.strides):
            if d == 1:
                continue
            if last is not None and s > last:
                return True
            last = s
        return False

    def size(self) -> int:
        return math.prod(self.shape)

    def memsize(self) -> int:
        return math.prod(self.shape) * _dt.itemsize(self.dtype)

    def is_contiguous(self) -> builtins.bool:
        return _ops.is_contiguous(self)

    # -- layout ------------------------------------------------------------------------------------------------------
    def transpose(self, axes: Sequence[int] | None = None) -> Tensor:
        """A transposed view (axes reversed by default)."""
        return _ops.transpose(self, axes)

    def T(self) -> Tensor:
        """The transpose (a view), SINGA's method spelling."""
        return _ops.transpose(self)

    def contiguous(self) -> Tensor:
        """This tensor if it is row-major contiguous, else a contiguous copy."""
        return _ops.contiguous(self)

    def reshape(self, shape: Sequence[int] | int, *more: int) -> Tensor:
        """A tensor of the new shape (-1 infers one dimension): a view when contiguous, else a copy."""
        if more:
            shape = (shape,) + more
        return _ops.reshape(self, shape)

    def repeat(self, repeats: int | Sequence[int], axis: int | None) -> Tensor:
        return _ops.repeat(self, repeats, axis)

    # -- dtype and device --------------------------------------------------------------------------------------------
    def as_type(self, dtype: Any) -> Tensor:
        """A new tensor converted to `dtype` (float to int truncates toward zero)."""
        return _ops.cast(self, _as_dtype(dtype))

    def to_type(self, dtype: Any) -> Tensor:
        """Convert in place (the tensor gets new, contiguous memory); returns self."""
        r = _ops.cast(self, _as_dtype(dtype))
        self._adopt(r)
        return self

    def to_device(self, device: Device | str) -> Tensor:
        """Move the data to `device` in place; returns self."""
        dev = _as_device(device)
        if dev is not self.device:
            strides, n = _ops._meta(self.shape)
            buf = dev.alloc(n * _dt.itemsize(self.dtype))
            dst = View(buf, self.dtype, self.shape, strides, 0)
            dev.write(dst, self.device.read(self))
            self.buffer, self.strides, self.offset, self.device = buf, strides, 0, dev
        return self

    def to_host(self) -> Tensor:
        """Move the data to the host (CPU backend) device in place; returns self."""
        return self.to_device(_host_device())

    def reset_like(self, t: Tensor) -> None:
        """Give this tensor t's shape, dtype and device, with new zero-filled memory."""
        strides, n = _ops._meta(t.shape)
        self.buffer = t.device.alloc(n * _dt.itemsize(t.dtype))
        self.dtype, self.shape, self.strides, self.offset, self.device = t.dtype, t.shape, strides, 0, t.device
        if n:
            t.device.table["fill"](self, value=0)

    def _adopt(self, r: Tensor) -> None:
        self.buffer, self.dtype, self.shape = r.buffer, r.dtype, r.shape
        self.strides, self.offset, self.device = r.strides, r.offset, r.device

    # -- norms -------------------------------------------------------------------------------------------------------
    def l1(self) -> float:
        """SINGA's average L1 norm: sum(|x|) / size."""
        n = self.size()
        if n == 0:
            return float("nan")
        return float(_ops.to_numpy(_ops.sum(_ops.abs(_as_f32(self))))) / n

    def l2(self) -> float:
        """SINGA's average L2 norm: sqrt(sum(x^2)) / size."""
        n = self.size()
        if n == 0:
            return float("nan")
        return math.sqrt(float(_ops.to_numpy(_ops.sum(_ops.square(_as_f32(self)))))) / n

    # -- writing data ------------------------------------------------------------------------------------------------
    def set_value(self, x: Any, inplace: builtins.bool = True) -> Tensor:
        """Set every element to x (in place unless inplace=False, which returns a new tensor). x is a number, or an
        array / Tensor whose shape broadcasts to this tensor's (numpy's rule; anything else is an error)."""
        t = self if inplace else _ops.empty(self.shape, self.dtype, self.device)
        if isinstance(x, (np.ndarray, list, tuple, Tensor)):
            shape = tuple(x.shape if isinstance(x, Tensor) else np.shape(x))
            try:
                fits = np.broadcast_shapes(shape, self.shape) == self.shape
            except ValueError:
                fits = False
            if not fits:
                raise ValueError(f"set_value: values of shape {shape} do not broadcast to the tensor's shape "
                                 f"{self.shape}")
            _ops.assign(t, x)
        else:
            _ops.fill(t, x)
        return t

    def copy_from_numpy(self, np_array: Any, offset: int = 0) -> Tensor:
        """Copy host data into this tensor's elements (row-major order): as many values as the tensor holds, or,
        from element `offset` > 0 on, any number that fits (a short batch never leaves stale rows behind)."""
        arr = np.asarray(np_array)
        offset = _copy_offset("copy_from_numpy", offset, arr.size, self)
        npdt = _dt.to_numpy_dtype(self.dtype)
        if np.can_cast(arr.dtype, npdt, "same_kind") or (
                arr.dtype.kind == "f" and npdt.kind in "ib" and np.all(np.trunc(arr) == arr)):
            # same kind, or float data holding exact integers (one-hot labels into an int placeholder)
            flat = arr.astype(npdt, copy=False).reshape(-1)
        else:
            raise TypeError(f"copy_from_numpy: cannot copy {arr.dtype} data into a {_dt.name(self.dtype)} tensor "
                            "without losing values (convert the array or the tensor first)")
        if flat.size == 0:
            return self
        dev = self.device
        if _ops.is_contiguous(self):
            dev.write(View(self.buffer, self.dtype, (flat.size,), (1,), self.offset + offset), flat)
        else:
            host = dev.read(self).reshape(-1)
            host[offset:offset + flat.size] = flat
            dev.write_strided(self, host.reshape(self.shape))
        return self

    def copy_data(self, t: Tensor) -> Tensor:
        """Copy t's elements (same number of elements and dtype, any device) into this tensor."""
        if not isinstance(t, Tensor):
            raise TypeError(f"copy_data: expected a Tensor, got {type(t).__name__}")
        if t.size() != self.size():
            raise ValueError(f"copy_data: source shape {t.shape} and destination shape {self.shape} have different "
                             "numbers of elements")
        copy_data_to_from(self, t, t.size())
        return self

    def copy_from(self, t: Tensor | np.ndarray, offset: int = 0) -> Tensor:
        """Copy from a Tensor or a numpy array into this tensor: all its elements, or from element `offset` > 0 on."""
        if isinstance(t, Tensor):
            copy_data_to_from(self, t, t.size(), _copy_offset("copy_from", offset, t.size(), self), 0)
        elif isinstance(t, np.ndarray):
            self.copy_from_numpy(t, offset)
        else:
            raise TypeError(f"copy_from: expected a Tensor or numpy array, got {type(t).__name__}")
        return self

    # -- copies --------------------------------------------------------------------------------------------------------
    def clone(self) -> Tensor:
        """A deep copy: new contiguous memory with the same values."""
        r = _ops.copy(self)
        r.requires_grad, r.stores_grad = self.requires_grad, self.stores_grad
        return r

    deepcopy = clone

    def copy(self) -> Tensor:
        """A shallow copy: a new Tensor object sharing this tensor's memory."""
        r = _ops.as_strided(self, self.shape, self.strides, self.offset)
        r.requires_grad, r.stores_grad = self.requires_grad, self.stores_grad
        return r

    def __copy__(self) -> Tensor:
        return self.copy()

    def __deepcopy__(self, memo: dict) -> Tensor:
        r = self.clone()
        r.name = self.name
        return r

    def __reduce__(self) -> tuple:
        # Pickling goes through host data (device memory is opaque); used by multiprocessing, not for checkpoints.
        return (_rebuild, (self.to_numpy(), self.dtype, self.device.name, self.requires_grad, self.stores_grad,
                           self.name))

    # -- random fills -------------------------------------------------------------------------------------------------
    def bernoulli(self, p: float, inplace: builtins.bool = True) -> Tensor:
        """Each element 1 with probability p, else 0 (device generator, see device.set_rand_seed)."""
        t = self if inplace else _ops.empty(self.shape, self.dtype, self.device)
        return _ops.random_bernoulli(t, p)

    def gaussian(self, mean: float, std: float, inplace: builtins.bool = True) -> Tensor:
        t = self if inplace else _ops.empty(self.shape, self.dtype, self.device)
        return _ops.random_normal(t, mean, std)

    def uniform(self, low: float, high: float, inplace: builtins.bool = True) -> Tensor:
        t = self if inplace else _ops.empty(self.shape, self.dtype, self.device)
        return _ops.random_uniform(t, low, high)

    # -- SINGA's row/column helpers (in place) ------------------------------------------------------------------------
    def _colrow(self, op: str, v: Tensor, column: builtins.bool) -> Tensor:
        if len(self.shape) != 2:
            raise ValueError(f"{op}: expected a 2-D tensor, got shape {self.shape}")
        if not isinstance(v, Tensor):
            raise TypeError(f"{op}: v must be a Tensor, got {type(v).__name__}")
        n = self.shape[0] if column else self.shape[1]
        if v.size() != n:
            what = "rows" if column else "columns"
            raise ValueError(f"{op}: v of shape {v.shape} does not match the {n} {what} of a tensor of shape "
                             f"{self.shape}")
        return _ops.reshape(v, (n, 1) if column else (1, n))

    def add_column(self, v: Tensor) -> Tensor:
        """Add v to every column (v has one element per row); in place."""
        return _ops.add(self, self._colrow("add_column", v, True), out=self)

    def add_row(self, v: Tensor) -> Tensor:
        """Add v to every row (v has one element per column); in place."""
        return _ops.add(self, self._colrow("add_row", v, False), out=self)

    def div_column(self, v: Tensor) -> Tensor:
        return _ops.div(self, self._colrow("div_column", v, True), out=self)

    def div_row(self, v: Tensor) -> Tensor:
        return _ops.div(self, self._colrow("div_row", v, False), out=self)

    def mult_column(self, v: Tensor) -> Tensor:
        return _ops.mul(self, self._colrow("mult_column", v, True), out=self)

    def mult_row(self, v: Tensor) -> Tensor:
        return _ops.mul(self, self._colrow("mult_row", v, False), out=self)

    # -- host access --------------------------------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        return self.device.read(self)

    def item(self) -> Any:
        """The single element as a Python number."""
        if self.size() != 1:
            raise ValueError(f"item: tensor of shape {self.shape} has {self.size()} elements, not 1")
        return self.device.read(self).reshape(()).item()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.device.read(self)
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __repr__(self) -> str:
        body = np.array2string(self.device.read(self), separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={_dt.name(self.dtype)}, device={self.device.name})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        for i in range(len(self)):
            yield _ops.getitem(self, i)

    def __bool__(self) -> builtins.bool:
        """Always True, as in SINGA, whose tensors have no truth value of their own: `if t:` tests that t exists.
        Compare values explicitly (`float(t) > 0`, `t.item()`)."""
        return True

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    # -- indexing ----------------------------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Tensor:
        """numpy's basic indexing, except that an int keeps its axis with size 1, as SINGA's (`t[0]` of a (3, 4)
        tensor is (1, 4)); an index out of range is an IndexError (also a ValueError, as SINGA raises)."""
        return _ops.getitem(self, _keep_int_axes(key, self.shape))

    def __setitem__(self, key: Any, value: Any) -> None:
        """Write value (broadcast) into the elements `key` selects. numpy's rule, except that a value with more axes
        than numpy's selection fills the selection as reading sees it (ints keeping size-1 axes): `t[0] += 1` and
        `t[0] = t[1]` work both ways."""
        kept = _keep_int_axes(key, self.shape)
        if kept is not key:
            ndim = len(value.shape) if isinstance(value, Tensor) else np.ndim(value)
            if ndim > len(_ops.getitem(self, key).shape):
                key = kept
        _ops.setitem(self, key, value)

    # -- arithmetic operators (element-wise, numpy broadcasting) -------------------------------------------------------
    # __add__, __radd__, __sub__, __mul__, __rmul__ and __truediv__ are the ops functions themselves, bound to this
    # class at the end of singa/ops.py (one Python call less per operator on the hot path).
    def __rsub__(self, other):
        return _ops.sub(other, self)

    def __rtruediv__(self, other):
        return _ops.div(other, self)

    def __floordiv__(self, other):
        return _ops.floor_divide(self, other)

    def __rfloordiv__(self, other):
        return _ops.floor_divide(other, self)

    def __mod__(self, other):
        return _ops.mod(self, other)

    def __rmod__(self, other):
        return _ops.mod(other, self)

    def __pow__(self, other):
        return _ops.pow(self, other)

    def __rpow__(self, other):
        return _ops.pow(other, self)

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __rmatmul__(self, other):
        return _ops.matmul(other, self)

    def __neg__(self):
        return _ops.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _ops.abs(self)

    # In place: the result is written into this tensor's memory (shape and dtype cannot change).
    def __iadd__(self, other):
        return _ops.add(self, other, self)

    def __isub__(self, other):
        return _ops.sub(self, other, self)

    def __imul__(self, other):
        return _ops.mul(self, other, self)

    def __itruediv__(self, other):
        return _ops.div(self, other, self)

    # SINGA's comparisons: 0/1 in the operands' dtype.
    def __lt__(self, other):
        return _compare("lt", self, other)

    def __le__(self, other):
        return _compare("le", self, other)

    def __gt__(self, other):
        return _compare("gt", self, other)

    def __ge__(self, other):
        return _compare("ge", self, other)

    def __eq__(self, other):
        if not isinstance(other, _OPERAND_TYPES):
            return NotImplemented  # `t == None` is False, as for any object
        return _compare("eq", self, other)

    def __ne__(self, other):
        if not isinstance(other, _OPERAND_TYPES):
            return NotImplemented
        return _compare("ne", self, other)


PlaceHolder = Tensor


def _copy_offset(op: str, offset: Any, count: int, dst: Tensor) -> int:
    """The checked element offset of a copy of `count` values into dst: from 0 they must fill dst exactly, from a
    positive offset they must fit."""
    try:
        offset = operator.index(offset)
    except TypeError:
        raise TypeError(f"{op}: offset must be an integer, got {offset!r}") from None
    n = dst.size()
    if offset == 0 and count != n:
        raise ValueError(f"{op}: {count} values for a tensor of shape {dst.shape} ({n} elements); the sizes must "
                         "match (pass offset= to write part of the tensor)")
    if offset < 0 or offset + count > n:
        raise ValueError(f"{op}: {count} values at offset {offset} do not fit in a tensor of shape {dst.shape} "
                         f"({n} elements)")
    return offset


def _rebuild(arr, dtype, device_name, requires_grad, stores_grad, name):
    return Tensor(device=device_name, dtype=dtype, data=arr, requires_grad=requires_grad, stores_grad=stores_grad,
                  name=name)


class IndexOutOfRange(IndexError, ValueError):
    """An index outside its axis: an IndexError, and a ValueError as SINGA's tensors raise."""


def _is_int(k: Any) -> builtins.bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (builtins.bool, np.bool_))


def _keep_int_axes(key: Any, shape: tuple) -> Any:
    """The key with each int i replaced by the slice i:i+1 of its axis (after checking it), so its axis stays."""
    keys = key if isinstance(key, tuple) else (key,)
    if not any(_is_int(k) for k in keys):
        return key
    consumed = builtins.sum(1 for k in keys if k is not None and k is not Ellipsis)
    out, axis = [], 0
    for k in keys:
        if k is Ellipsis:
            axis += builtins.max(len(shape) - consumed, 0)
        elif _is_int(k):
            if axis >= len(shape):
                raise IndexOutOfRange(f"too many indices for a tensor of shape {shape}")
            n, i = shape[axis], int(k)
            if not -n <= i < n:
                raise IndexOutOfRange(f"index {i} is out of bounds for axis {axis} with size {n} (shape {shape})")
            i %= n
            k = builtins.slice(i, i + 1)
            axis += 1
        elif k is not None:
            axis += 1
        out.append(k)
    return tuple(out)


def _as_f32(t: Tensor) -> Tensor:
    return t if t.dtype == _dt.float32 else _ops.cast(t, _dt.float32)


def _host_device() -> Device:
    return _device_mod.get_device("cpu")


def _compare(name: str, a: Any, b: Any) -> Tensor:
    """A comparison as SINGA gives it: 0/1 in the operands' dtype (the promoted one for two tensors of different
    kinds), bool for bool operands."""
    r = _ops.binary(name, a, b)
    like = a if isinstance(a, Tensor) else b
    if isinstance(a, Tensor) and isinstance(b, Tensor) and _ops._kind(b.dtype) > _ops._kind(a.dtype):
        like = b
    return r if like.dtype == _dt.bool_ else _ops.cast(r, like.dtype)


# -- module functions (SINGA's names) --------------------------------------------------------------------------------


def zeros_like(t: Tensor) -> Tensor:
    return _ops.full(t.shape, 0, t.dtype, t.device)


def ones_like(t: Tensor) -> Tensor:
    return _ops.full(t.shape, 1, t.dtype, t.device)


def product(shape: Sequence[int]) -> int:
    return math.prod(shape)


def sizeof(dtype: Any) -> int:
    """Bytes per element of a SINGA dtype."""
    return _dt.itemsize(_as_dtype(dtype))


def contiguous(tensor: Tensor) -> Tensor:
    return _ops.contiguous(tensor)


def reshape(tensor: Tensor, shape: Sequence[int]) -> Tensor:
    return _ops.reshape(tensor, shape)


def transpose(t: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    return _ops.transpose(t, axes)


def copy_data_to_from(dst: Tensor, src: Tensor, size: int, dst_offset: int = 0, src_offset: int = 0) -> None:
    """Copy `size` elements (row-major order) of src from src_offset into dst at dst_offset; devices may differ."""
    if dst.dtype != src.dtype:
        raise TypeError(f"copy_data_to_from: dtype mismatch {_dt.name(dst.dtype)} and {_dt.name(src.dtype)}")
    nd, ns = dst.size(), src.size()
    if min(size, dst_offset, src_offset) < 0 or dst_offset + size > nd or src_offset + size > ns:
        raise ValueError(f"copy_data_to_from: {size} elements from offset {src_offset} of src {src.shape} to offset "
                         f"{dst_offset} of dst {dst.shape} run past the end")
    if size == 0:
        return
    s = _ops.contiguous(src)
    sv = View(s.buffer, s.dtype, (size,), (1,), s.offset + src_offset)
    if _ops.is_contiguous(dst):
        dst.device.copy_view(View(dst.buffer, dst.dtype, (size,), (1,), dst.offset + dst_offset), sv)
    else:  # strided destination: read-modify-write of its elements through the host
        host = dst.device.read(dst).reshape(-1)
        host[dst_offset:dst_offset + size] = s.device.read(sv)
        dst.device.write_strided(dst, host.reshape(dst.shape))


def from_numpy(np_array: Any, dev: Device | None = None) -> Tensor:
    """A tensor with the array's shape and values on `dev` (default device). As in SINGA, float64 becomes float32 and
    int64 (numpy's default integer; other integer types too) becomes int32; values beyond int32 raise. Keep int64
    with an explicit dtype: `Tensor(data=a, dtype=tensor.int64)`."""
    arr = np.asarray(np_array)
    if arr.dtype.kind in "iu" and arr.dtype != np.int32:
        if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
            raise ValueError(f"from_numpy: {arr.dtype} values in [{arr.min()}, {arr.max()}] do not fit int32 (SINGA's "
                             "integer type, to which from_numpy converts); keep them with "
                             "Tensor(data=array, dtype=tensor.int64)")
        arr = arr.astype(np.int32)
    return Tensor(device=dev, data=arr)


def to_host(t: Tensor) -> Tensor:
    """A copy of t on the host (CPU backend) device."""
    return t.clone().to_device(_host_device())


def to_numpy(t: Tensor) -> np.ndarray:
    return t.device.read(t)


def abs(t: Tensor) -> Tensor:
    return _ops.abs(t)


def exp(t: Tensor) -> Tensor:
    return _ops.exp(t)


def ceil(t: Tensor) -> Tensor:
    return _ops.ceil(t)


def floor(t: Tensor) -> Tensor:
    return _ops.floor(t)


def log(t: Tensor) -> Tensor:
    return _ops.log(t)


def sigmoid(t: Tensor) -> Tensor:
    return _ops.sigmoid(t)


def sign(t: Tensor) -> Tensor:
    return _ops.sign(t)


def sqrt(t: Tensor) -> Tensor:
    return _ops.sqrt(t)


def square(t: Tensor) -> Tensor:
    return _ops.square(t)


def tanh(t: Tensor) -> Tensor:
    return _ops.tanh(t)


def relu(t: Tensor) -> Tensor:
    return _ops.relu(t)


def sum(t: Tensor, axis: int | Sequence[int] | None = None, out: Tensor | None = None) -> Tensor:
    """Sum over `axis` (all axes when None: a 0-d tensor); written into `out` when given."""
    r = _ops.sum(t, axis)
    if out is None:
        return r
    _ops.assign(out, r)
    return out


def pow(t: Tensor, x: Any, out: Tensor | None = None) -> Tensor:
    """t ** x element-wise (x a number or a tensor)."""
    return _ops.pow(t, x, out=out)


def average(t: Tensor, axis: int | None = None) -> Tensor | float:
    """The mean: a Python float when axis is None (SINGA), else a tensor without that axis."""
    if axis is None:
        n = t.size()
        return float(_ops.to_numpy(_ops.sum(_as_f32(t)))) / n if n else float("nan")
    return _ops.mean(t, axis)


def softmax(t: Tensor, out: Tensor | None = None) -> Tensor:
    """Softmax of each row (the last axis)."""
    r = _ops.softmax(t, -1)
    if out is None:
        return r
    _ops.assign(out, r)
    return out


def lt(t: Tensor, x: Any) -> Tensor:
    return _compare("lt", t, x)


def le(t: Tensor, x: Any) -> Tensor:
    return _compare("le", t, x)


def gt(t: Tensor, x: Any) -> Tensor:
    return _compare("gt", t, x)


def ge(t: Tensor, x: Any) -> Tensor:
    return _compare("ge", t, x)


def eq(t: Tensor, x: Any) -> Tensor:
    return _compare("eq", t, x)


def add(lhs: Any, rhs: Any, ret: Tensor | None = None) -> Tensor:
    return _ops.add(lhs, rhs, out=ret)


def sub(lhs: Any, rhs: Any, ret: Tensor | None = None) -> Tensor:
    return _ops.sub(lhs, rhs, out=ret)


def eltwise_mult(lhs: Any, rhs: Any, ret: Tensor | None = None) -> Tensor:
    return _ops.mul(lhs, rhs, out=ret)


def div(lhs: Any, rhs: Any, ret: Tensor | None = None) -> Tensor:
    return _ops.div(lhs, rhs, out=ret)


def mult(A: Tensor, B: Tensor, C: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> Tensor:
    """Matrix product alpha * A @ B (+ beta * C, written into C when C is given); numpy matmul shapes."""
    if C is None:
        return _ops.matmul(A, B, alpha=alpha)
    return _ops.matmul(A, B, out=C, alpha=alpha, beta=beta)


def matmul(A: Tensor, B: Tensor) -> Tensor:
    return _ops.matmul(A, B)


def einsum(ops: str, *args: Tensor) -> Tensor:
    """numpy.einsum over tensors (explicit or implicit output, '...', repeated indices, any number of operands)."""
    return _ops.einsum(ops, *args)


def repeat(t: Tensor, repeats: int | Sequence[int], axis: int | None = None) -> Tensor:
    return _ops.repeat(t, repeats, axis)


def tensordot(A: Tensor, B: Tensor, axes: Any = 2) -> Tensor:
    return _ops.tensordot(A, B, axes)


def axpy(alpha: float, x: Tensor, y: Tensor) -> Tensor:
    """y += alpha * x, in place; returns y."""
    return _ops.axpby(alpha, x, 1.0, y, out=y)


def bernoulli(p: float, t: Tensor) -> Tensor:
    return _ops.random_bernoulli(t, p)


def gaussian(mean: float, std: float, t: Tensor) -> Tensor:
    return _ops.random_normal(t, mean, std)


def uniform(low: float, high: float, t: Tensor) -> Tensor:
    return _ops.random_uniform(t, low, high)


def _scaled_update(op: str, alpha: float, v: Tensor, beta: float, M: Tensor, column: builtins.bool) -> Tensor:
    vv = M._colrow(op, v, column)
    if beta != 1:
        _ops.mul(M, beta, out=M)
    return _ops.add(M, vv if alpha == 1 else _ops.mul(vv, alpha), out=M)


def add_column(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """Each column m of M becomes alpha * v + beta * m; in place, returns M."""
    return _scaled_update("add_column", alpha, v, beta, M, True)


def add_row(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """Each row m of M becomes alpha * v + beta * m; in place, returns M."""
    return _scaled_update("add_row", alpha, v, beta, M, False)


def sum_columns(M: Tensor) -> Tensor:
    """Sum of the columns: shape (rows, 1)."""
    if M.ndim() != 2:
        raise ValueError(f"sum_columns: expected a 2-D tensor, got shape {M.shape}")
    return _ops.sum(M, 1, keepdims=True)


def sum_rows(M: Tensor) -> Tensor:
    """Sum of the rows: shape (1, columns)."""
    if M.ndim() != 2:
        raise ValueError(f"sum_rows: expected a 2-D tensor, got shape {M.shape}")
    return _ops.sum(M, 0, keepdims=True)


def copy_from_numpy(data: Tensor, np_array: Any) -> Tensor:
    return data.copy_from_numpy(np_array)


def concatenate(tensors: Sequence[Tensor], axis: int) -> Tensor:
    return _ops.concat(tensors, axis)


def random(shape: Sequence[int], device: Device | None = None, dtype: int = float32) -> Tensor:
    """Uniform [0, 1) values (default device when device is None)."""
    return _ops.random_uniform(_ops.empty(_as_shape(shape), _as_dtype(dtype), _as_device(device)), 0.0, 1.0)


def zeros(shape: Sequence[int], device: Device | None = None, dtype: int = float32) -> Tensor:
    return _ops.full(_as_shape(shape), 0, _as_dtype(dtype), _as_device(device))


def ones(shape: Sequence[int], device: Device | None = None, dtype: int = float32) -> Tensor:
    return _ops.full(_as_shape(shape), 1, _as_dtype(dtype), _as_device(device))


def full(shape: Sequence[int], value: Any, device: Device | None = None, dtype: int = float32) -> Tensor:
    return _ops.full(_as_shape(shape), value, _as_dtype(dtype), _as_device(device))


_OPERAND_TYPES = (Tensor, np.ndarray, int, float, np.integer, np.floating, np.bool_)

# ops imports Tensor from this module, so it comes last; the methods above look `_ops` up at call time, and ops binds
# the hot operators (__add__ ...) to Tensor when it finishes loading, whichever of the two modules is imported first.
from singa import ops as _ops  # noqa: E402
