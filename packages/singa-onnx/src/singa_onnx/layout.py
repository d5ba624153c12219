"""Which values of an inference program stay in channel blocks between convolutions.

A device whose conv2d_fused reads and writes channel blocks (`Device.channel_block` B > 0: oneDNN on the CPU) runs
convolutions fastest on activations laid out (N, C/B, H, W, B). Converting every convolution's input and output from
and to NCHW costs a pass over each activation (ResNet-50 at batch 1: ~100 conversions, 9% of the run). The plan
instead keeps a value blocked when everything that touches it can take it so:

* FusedConv nodes (the folded program's float 2-D convolutions, ungrouped or depthwise) write it, read it as
  input x or as the residual (which shares the output's layout);
* Relu, same-shape Add / Sum and channel Concat give the same elements in either layout when all their operands
  share it (a concatenation of whole channel blocks copies the same byte ranges as an NCHW one), and 2-D MaxPool /
  AveragePool run in it (pool2d's `blocks`), so each such node joins its inputs and output into one group that is
  blocked or not as a whole;
* GlobalAveragePool and poolings down to one pixel read it (their (N, C, 1, 1) output is the same in both layouts,
  and left NCHW).

A value is never blocked if it is a graph output, is not a 4-D float32 tensor whose channels divide into blocks,
comes from any other node or from outside, or is read by any other node (or a subgraph). The shapes come from an
earlier run with the same input signature (the plan's first run of it).
"""

from __future__ import annotations

from typing import Any

from singa import dtypes
from singa.graph_fuse import Groups

_ELEMENTWISE = ("Relu", "Add", "Sum")
_POOLS = ("MaxPool", "AveragePool")


def blocked_values(program: Any, shapes: dict[str, tuple], block: int) -> frozenset[str]:
    """The names of the values to keep in channel blocks of `block`; `shapes`: {name: (shape, dtype)} of the
    tensor values of a run."""
    if block <= 0:
        return frozenset()
    groups = Groups()

    def fits(name: str) -> bool:
        got = shapes.get(name)
        return got is not None and got[1] == dtypes.float32 and len(got[0]) == 4 and got[0][1] % block == 0

    # which node may produce each value blocked, and which (node, input position) may read it so
    producers: set[str] = set()
    readers: set[tuple[int, int]] = set()
    for node in program.nodes:
        ins, outs = node.inputs, node.outputs
        if node.op_type == "FusedConv" and node.domain == "com.microsoft" and _plain_conv(node, shapes):
            producers.add(outs[0])
            readers.add((id(node), 0))
            if len(ins) > 3 and ins[3]:
                readers.add((id(node), 3))
                groups.join([outs[0], ins[3]])
        elif _to_one_pixel(node, shapes):
            readers.add((id(node), 0))
        elif _layout_free(node, shapes):
            group = [n for n in ins if n] + [outs[0]]
            producers.add(outs[0])
            readers.update((id(node), k) for k, n in enumerate(ins) if n)
            groups.join(group)
    bad: set[str] = set(program.outputs) | set(program.inputs) | set(program.initializers)
    for name in shapes:
        if not fits(name) or name not in producers:
            bad.add(name)
    for node in program.nodes:
        read = set()
        for k, n in enumerate(node.inputs):
            if n:
                read.add(n)
                if (id(node), k) not in readers:
                    bad.add(n)
        bad.update(n for n in node.uses if n not in read)  # read by a subgraph
    spoiled = {groups.root(n) for n in bad}
    return frozenset(n for n in producers if groups.root(n) not in spoiled)


def _plain_conv(node: Any, shapes: dict) -> bool:
    """A FusedConv the handler runs as one conv2d_fused call (ReLU or no activation, a residual of the output's
    shape: see ops/nn.py fused_conv), ungrouped or depthwise."""
    if (node.attr("activation", "") or "") not in ("", "Relu") or len(node.inputs) < 2:
        return False
    x, y = shapes.get(node.inputs[0]), shapes.get(node.outputs[0])
    if x is None or y is None or len(x[0]) != 4:
        return False
    groups = node.attr("group", 1)
    cg = x[0][1] // groups
    if groups > 1 and cg != 1:
        # grouped, not depthwise: oneDNN has blocked kernels only for groups of whole blocks, and those are its
        # generic direct ones (AVX2, ShuffleNet's 4 groups of 136 channels at 7x7: 26 GFLOP/s, 0.28 ms, against 0.15
        # on NCHW with its per-group GEMM); on NCHW the device picks the fastest provider per shape
        return False
    z = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    return z is None or shapes.get(z) == y


def _to_one_pixel(node: Any, shapes: dict) -> bool:
    """GlobalAveragePool, or a pooling down to 1x1: its (N, C, 1, 1) output is the same in both layouts (left
    NCHW), so it reads a blocked input without joining its group."""
    if node.domain or not node.inputs or node.inputs[0] not in shapes:
        return False
    if node.op_type == "GlobalAveragePool":
        return True
    y = shapes.get(node.outputs[0]) if node.outputs and node.outputs[0] else None
    return _layout_free(node, shapes) and node.op_type in _POOLS and y is not None and tuple(y[0][2:]) == (1, 1)


def _layout_free(node: Any, shapes: dict) -> bool:
    """A node that computes the same elements in either layout: Relu; Add / Sum of two operands of the output's
    shape (no broadcasting); Concat along the channels; 2-D pooling."""
    if node.domain or not node.outputs or not node.outputs[0]:
        return False
    y = shapes.get(node.outputs[0])
    ins = [n for n in node.inputs if n]
    if y is None or len(y[0]) != 4 or not ins or any(shapes.get(n) is None for n in ins):
        return False
    if node.op_type == "Relu":
        return len(ins) == 1
    if node.op_type in _ELEMENTWISE:
        return len(ins) == 2 and all(shapes[n] == y for n in ins)
    if node.op_type in _POOLS:  # 2-D, without MaxPool's indices: channels pooled alike
        return len(ins) == 1 and len(node.attr("kernel_shape") or ()) == 2 and not any(node.outputs[1:])
    if node.op_type == "Concat":
        axis = node.attr("axis", 1 if node.opset < 4 else 0)
        return axis in (1, -3) and all(shapes[n][1] == y[1] and len(shapes[n][0]) == 4 for n in ins)
    return False
