"""2-D max and average pooling (forward and backward) on the shapes of common CNNs: milliseconds per call."""

from __future__ import annotations

import numpy as np

import benchlib
from benchlib import Table, torch
from singa import ops

# label, (C, H, W), kernel, stride, padding, mode, count_include_pad
CASES = [
    ("ResNet stem max 3x3 s2 p1", (64, 112, 112), 3, 2, 1, "max", False),
    ("Inception max 3x3 s1 p1", (192, 28, 28), 3, 1, 1, "max", False),
    ("Inception max 3x3 s1 p1, 7x7", (832, 7, 7), 3, 1, 1, "max", False),
    ("AlexNet max 3x3 s2", (64, 55, 55), 3, 2, 0, "max", False),
    ("VGG max 2x2 s2", (64, 224, 224), 2, 2, 0, "max", False),
    ("VGG max 2x2 s2, last", (512, 14, 14), 2, 2, 0, "max", False),
    ("Inception avg 3x3 s1 p1", (192, 28, 28), 3, 1, 1, "avg", False),
    ("ResNet-18 CIFAR avg 4x4", (512, 4, 4), 4, 4, 0, "avg", True),
]
QUICK_CASES = [0, 1, 6, 7]


def _check(got, want, what: str, other: str = "torch") -> None:
    if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise AssertionError(f"{what}: singa disagrees with {other}")


def _ort_forward(x: np.ndarray, case: tuple):
    """onnxruntime's forward pass of the layer (one MaxPool / AveragePool node), or None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    _, _, k, s, p, mode, cip = case
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4}
    if mode == "avg":
        attrs["count_include_pad"] = int(cip)
    node = helper.make_node("MaxPool" if mode == "max" else "AveragePool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": x})[0]


def _case(dev, rng, n: int, case: tuple, repeat: int) -> list[list]:
    """Rows of one layer at batch n: each pass, singa and torch."""
    label, (c, h, w), k, s, p, mode, cip = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    tx = ops.from_numpy(x, dev)
    kw = {"kernel": k, "stride": s, "padding": p, "mode": mode, "count_include_pad": cip}
    y, idx = ops.pool2d(tx, return_indices=True, **kw)  # idx is None for "avg"
    dy_np = rng.standard_normal(y.shape).astype(np.float32)
    dy = ops.from_numpy(dy_np, dev)
    singa = {"forward": lambda: ops.pool2d(tx, **kw)}
    if mode == "max":
        singa["forward, indices"] = lambda: ops.pool2d(tx, return_indices=True, **kw)
    singa["backward"] = lambda: ops.pool2d_backward(dy, tx, idx, **kw)
    tfn = {}
    if torch is not None:
        F = torch.nn.functional
        t, tdy = torch.from_numpy(x), torch.from_numpy(dy_np)
        if mode == "max":
            ty, ti = F.max_pool2d(t, k, s, p, return_indices=True)
            _check(ops.to_numpy(y), ty.numpy(), f"{label} forward")
            tfn["forward"] = lambda: F.max_pool2d(t, k, s, p)
            tfn["forward, indices"] = lambda: F.max_pool2d(t, k, s, p, return_indices=True)
            tfn["backward"] = lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                tdy, t, [k, k], [s, s], [p, p], [1, 1], False, ti)
        else:
            _check(ops.to_numpy(y), F.avg_pool2d(t, k, s, p, count_include_pad=cip).numpy(), f"{label} forward")
            tfn["forward"] = lambda: F.avg_pool2d(t, k, s, p, count_include_pad=cip)
            tfn["backward"] = lambda: torch.ops.aten.avg_pool2d_backward(
                tdy, t, [k, k], [s, s], [p, p], False, cip, None)
        _check(ops.to_numpy(singa["backward"]()), tfn["backward"]().numpy(), f"{label} backward")
    ofn = {}
    ort_forward = _ort_forward(x, case)
    if ort_forward is not None:
        _check(ops.to_numpy(y), ort_forward(), f"{label} forward", "onnxruntime")
        ofn["forward"] = ort_forward
    return benchlib.pass_rows(dev, label, (n, c, h, w), singa, tfn, repeat, ofn)


def run(quick: bool = False) -> Table:
    """Pooling forward (inference, training with indices) and backward: singa vs torch, and the forward vs
    onnxruntime (whose CPU pooling is the faster reference)."""
    table = benchlib.layer_table("2-D pooling, float32 NCHW (ms per call, lower is better)", "bench_pool.py",
                                 CASES, QUICK_CASES, quick, _case, third="onnxruntime")
    table.notes.append(
        "Best of several timed calls after two warm-ups; the singa timer stops after `dev.synchronize()`. "
        "\"forward, indices\" also returns the argmax indices (training); \"backward\" is max pooling's scatter to "
        "those indices or average pooling's spread, against `torch.ops.aten.max_pool2d_with_indices_backward` / "
        "`avg_pool2d_backward`. onnxruntime: the forward as a one-node model (`InferenceSession.run` on the same "
        "array). Ratios are of times: below 1, singa is faster.")
    return table


if __name__ == "__main__":
    benchlib.main(run)
