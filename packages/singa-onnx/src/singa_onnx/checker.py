"""Loading and validating models: onnx.checker's verdict, external data confined to the model's folder."""

from __future__ import annotations

import os
from typing import Any

import onnx
from onnx import ModelProto, TensorProto, external_data_helper

from singa_onnx.errors import InvalidModelError


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


def _iter_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _iter_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _iter_tensors(g)


def has_external_data(model: ModelProto) -> bool:
    return any(external_data_helper.uses_external_data(t) for t in _iter_tensors(model.graph))


def resolve_external(tensor: TensorProto, base_dir: str | None) -> bytes:
    """The raw bytes of an externally stored tensor, read from a file that must lie inside base_dir."""
    info = {e.key: e.value for e in tensor.external_data}
    loc = info.get("location")
    if not loc:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data without a location")
    if base_dir is None:
        raise InvalidModelError(f"tensor {tensor.name!r} keeps its data in {loc!r}; pass the model as a path or "
                                "give prepare(..., base_dir=<model folder>) so the file can be found")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")):
        raise InvalidModelError(f"tensor {tensor.name!r}: external data location {loc!r} is absolute; only paths "
                                "inside the model's folder are read")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, loc))
    if os.path.commonpath([root, path]) != root:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data location {loc!r} leaves the model's folder "
                                f"{root!r}")
    if not os.path.isfile(path):
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {path!r} does not exist")
    offset = int(info.get("offset", 0) or 0)
    length = info.get("length")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(int(length)) if length not in (None, "") else f.read()
    if length not in (None, "") and len(data) != int(length):
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {path!r} is shorter than offset "
                                f"{offset} + length {length}")
    return data


def load_external(model: ModelProto, base_dir: str | None) -> ModelProto:
    """A copy of model with every external tensor's bytes read in (confined to base_dir)."""
    if not has_external_data(model):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    for t in _iter_tensors(out.graph):
        if external_data_helper.uses_external_data(t):
            raw = resolve_external(t, base_dir)
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = raw
    return out
