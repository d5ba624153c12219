"""Loading and validating models: onnx.checker's verdict, external data confined to the model's folder.

External data is read in one place, `load_external`, for every tensor the model holds wherever it sits (graph and
sparse initializers, node attributes, subgraphs, model-local functions): only regular files inside the model's folder,
at offsets and lengths that lie inside the file. A model given as bytes or a ModelProto has no folder, so its external
data is refused unless a base folder is given. Everything else turns tensors into arrays through `to_array`, which
refuses a tensor still marked external instead of letting onnx read it from the working directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import ModelProto, TensorProto, numpy_helper

from singa_onnx.errors import InvalidModelError

# bytes per element of the ONNX types whose raw data has a fixed size (strings have none)
_RAW_ITEMSIZE = {
    TensorProto.FLOAT: 4, TensorProto.UINT8: 1, TensorProto.INT8: 1, TensorProto.UINT16: 2, TensorProto.INT16: 2,
    TensorProto.INT32: 4, TensorProto.INT64: 8, TensorProto.BOOL: 1, TensorProto.FLOAT16: 2, TensorProto.DOUBLE: 8,
    TensorProto.UINT32: 4, TensorProto.UINT64: 8, TensorProto.COMPLEX64: 8, TensorProto.COMPLEX128: 16,
    TensorProto.BFLOAT16: 2, TensorProto.FLOAT8E4M3FN: 1, TensorProto.FLOAT8E4M3FNUZ: 1, TensorProto.FLOAT8E5M2: 1,
    TensorProto.FLOAT8E5M2FNUZ: 1, TensorProto.UINT4: 1, TensorProto.INT4: 1,
}
_HALF_BYTE_TYPES = frozenset({TensorProto.UINT4, TensorProto.INT4})


def load_model(model: Any, base_dir: str | None = None) -> tuple[ModelProto, str | None]:
    """(ModelProto, folder for external data) from a ModelProto, serialized bytes or a path."""
    if isinstance(model, ModelProto):
        return model, base_dir
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(model)), base_dir
        except Exception as exc:  # noqa: BLE001 - protobuf raises assorted errors for garbage input
            raise InvalidModelError(f"cannot parse the ONNX model bytes: {exc}") from None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise InvalidModelError(f"ONNX model file {path!r} does not exist")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - protobuf raises assorted errors for garbage input
            raise InvalidModelError(f"cannot parse ONNX model file {path!r}: {exc}") from None
        return proto, base_dir if base_dir is not None else os.path.dirname(os.path.abspath(path))
    raise TypeError(f"expected an onnx.ModelProto, bytes or a path, got {type(model).__name__}")


def check(model: ModelProto) -> None:
    """onnx.checker.check_model, its message re-raised as InvalidModelError (no traceback from deep inside)."""
    if not isinstance(model, ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    if model.ByteSize() > 2**31 - 1:
        return  # the checker needs a file path beyond protobuf's 2 GiB limit; such models are checked while loaded
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise InvalidModelError(f"invalid ONNX model (onnx.checker): {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the checker's C++ side raises other errors for broken protos
        raise InvalidModelError(f"invalid ONNX model (onnx.checker): {exc}") from None


def _tensors(message: Message) -> Iterator[TensorProto]:
    """Every TensorProto inside a protobuf message: graph and sparse initializers, node attributes (tensors, sparse
    tensors, subgraphs of If/Loop/Scan), model-local functions, training info, and whatever field a later ONNX adds.
    A tensor's own fields are not walked (its raw data is never copied)."""
    stack = [message]
    while stack:
        m = stack.pop()
        if isinstance(m, TensorProto):
            yield m
            continue
        for fd, value in m.ListFields():
            if fd.type != fd.TYPE_MESSAGE:
                continue
            if isinstance(value, Message):
                stack.append(value)
            else:  # a repeated message field
                stack.extend(value)


def is_external(tensor: TensorProto) -> bool:
    """Whether a tensor keeps (or claims to keep) its data in a file."""
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def has_external_data(model: Message) -> bool:
    return any(is_external(t) for t in _tensors(model))


def _expected_bytes(tensor: TensorProto) -> int | None:
    """The raw byte size a tensor of its dims and type must have, when the type has a fixed size."""
    size = _RAW_ITEMSIZE.get(tensor.data_type)
    if size is None:
        return None
    n = 1
    for d in tensor.dims:
        n *= d
    return (n * size + 1) // 2 if tensor.data_type in _HALF_BYTE_TYPES else n * size


def _offset(tensor: TensorProto, path: str, info: dict, key: str) -> int | None:
    raw = info.get(key)
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise InvalidModelError(f"tensor {tensor.name!r}: external data {key} {raw!r} for file {path!r} is not a "
                                "non-negative integer")
    return int(raw)


def resolve_external(tensor: TensorProto, base_dir: str | None) -> bytes:
    """The raw bytes of an externally stored tensor, read from a regular file that must lie inside base_dir (symbolic
    links resolved); every problem is an InvalidModelError naming the tensor and the file."""
    info = {e.key: e.value for e in tensor.external_data}
    loc = info.get("location")
    if not loc:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data without a location")
    if base_dir is None:
        raise InvalidModelError(f"tensor {tensor.name!r} keeps its data in {loc!r}, and a model given as bytes or a "
                                "ModelProto has no folder: pass the model as a path, or base_dir=<model folder>")
    if "\0" in loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or os.path.splitdrive(loc)[0]:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data location {loc!r} is absolute; only files "
                                "inside the model's folder are read")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, loc))
    if os.path.commonpath([root, path]) != root or path == root:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data location {loc!r} leaves the model's folder "
                                f"{root!r}")
    try:
        st = os.stat(path)
    except OSError:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {path!r} does not exist") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block, a device would never end
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {path!r} is not a regular file")
    offset = _offset(tensor, path, info, "offset") or 0
    length = _offset(tensor, path, info, "length")
    if offset > st.st_size:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data offset {offset} is past the end of {path!r} "
                                f"({st.st_size} bytes)")
    if length is None:
        length = st.st_size - offset
    elif offset + length > st.st_size:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data offset {offset} + length {length} is past "
                                f"the end of {path!r} ({st.st_size} bytes)")
    want = _expected_bytes(tensor)
    if want is not None and want != length:
        raise InvalidModelError(f"tensor {tensor.name!r}: {length} bytes of external data in {path!r}, its dims "
                                f"{list(tensor.dims)} and type need {want}")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {path!r} changed while it was read")
    return data


def load_external(model: ModelProto, base_dir: str | None) -> ModelProto:
    """A copy of model with every externally stored tensor's bytes read in (confined to base_dir): the one place
    where external data is resolved, for every tensor the model holds."""
    if not has_external_data(model):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    for t in list(_tensors(out)):
        if is_external(t):
            raw = resolve_external(t, base_dir)
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = raw
    return out


def to_array(tensor: TensorProto) -> np.ndarray:
    """A TensorProto's values (numpy_helper.to_array), refusing external data that load_external did not resolve (it
    would be read from the working directory) and turning a malformed tensor into an InvalidModelError."""
    if is_external(tensor):
        raise InvalidModelError(f"tensor {tensor.name!r}: external data was not resolved (only load_external reads "
                                "external files)")
    want = _expected_bytes(tensor)
    if tensor.HasField("raw_data") and want is not None and len(tensor.raw_data) != want:
        raise InvalidModelError(f"tensor {tensor.name!r}: {len(tensor.raw_data)} bytes of data, its dims "
                                f"{list(tensor.dims)} and type need {want}")
    if any(d < 0 for d in tensor.dims):
        raise InvalidModelError(f"tensor {tensor.name!r}: negative dims {list(tensor.dims)}")
    try:
        return numpy_helper.to_array(tensor)
    except Exception as exc:  # noqa: BLE001 - numpy/onnx raise assorted errors for malformed tensors
        raise InvalidModelError(f"tensor {tensor.name!r} (type {tensor.data_type}, dims {list(tensor.dims)}) is "
                                f"malformed: {type(exc).__name__}: {exc}") from None
