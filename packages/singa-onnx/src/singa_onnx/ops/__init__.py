"""Operator handlers, one module per family; importing this package fills the operator table (singa_onnx.registry)."""

from singa_onnx.ops import (  # noqa: F401 - imported for their registrations
    cast,
    control,
    elementwise,
    indexing,
    logic,
    math,
    nn,
    norm,
    quant,
    reduce,
    resize,
    rnn,
    shape,
    signal,
    text,
    vision,
)
