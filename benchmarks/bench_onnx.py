"""ONNX inference latency: singa (singa_onnx.prepare -> SingaRep.run) against onnxruntime, same models, same run.

Models: the nine light models shipped in the onnx wheel (onnx/backend/test/data/light) and a ResNet-18-style network,
at batch 1 and 8. The light models generate their weights with ConstantOfShape (every filter the same); here those
become random initializers of the same shapes, so both engines do a real network's work, and their hard-coded batch
of 1 becomes a free batch dimension. Outputs are compared with onnxruntime's before and after timing; times are the
best of a few runs of numpy-in / numpy-out inference, milliseconds, after two warm-up runs (singa_onnx records a
model's kernel sequence for an input shape at the second run and replays it from then on: steady state is timed).

    python benchmarks/bench_onnx.py [--quick]
"""

from __future__ import annotations

import os
import time

import numpy as np

import benchlib
from benchlib import Table, best_time, ratio

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]
QUICK_LIGHT = ["bvlc_alexnet", "squeezenet"]
PAUSE = 0.15  # seconds between turns (see run)


def _light_path(name: str) -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


def realistic(model, seed: int = 0):
    """A light model with random weights instead of ConstantOfShape ones, and a free batch dimension."""
    import onnx
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: nh.to_array(t) for t in g.initializer}
    keep = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            if fan_in:  # weights: He-scaled noise; biases and BN statistics: small noise around their role
                arr = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
            else:
                arr = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            g.initializer.append(nh.from_array(arr, node.output[0]))
            continue
        if node.op_type == "Reshape" and node.input[1] in inits:
            shape = inits[node.input[1]].copy()
            if shape.size and shape[0] == 1:
                shape[0] = -1
                for t in g.initializer:
                    if t.name == node.input[1]:
                        t.CopyFrom(nh.from_array(shape.astype(np.int64), t.name))
        keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    init_names = {t.name for t in g.initializer}
    # old-IR models list their weights as graph inputs too; as plain initializers both engines may fold them
    kept_inputs = [vi for vi in g.input if vi.name not in init_names]
    del g.input[:]
    g.input.extend(kept_inputs)
    for vi in list(g.input) + list(g.output):
        if vi.name not in init_names and vi.type.tensor_type.shape.dim:
            vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del g.value_info[:]
    m.ir_version = max(m.ir_version, 4)  # initializers that are not graph inputs need IR 4
    return m


def resnet18(classes: int = 1000, seed: int = 0):
    """A ResNet-18-style ONNX graph (basic blocks, BatchNorm, residual adds), random weights, free batch."""
    from onnx import TensorProto as TP
    from onnx import helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    counter = [0]

    def name(p):
        counter[0] += 1
        return f"{p}{counter[0]}"

    def conv_bn(x, cin, cout, k, s, relu=True):
        w = name("w")
        inits.append(nh.from_array((rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k)))
                                   .astype(np.float32), w))
        c = name("conv")
        nodes.append(helper.make_node("Conv", [x, w], [c], kernel_shape=[k, k], strides=[s, s],
                                      pads=[k // 2] * 4))
        bn = [name(p) for p in ("s", "b", "m", "v")]
        for n_, v in zip(bn, (np.ones(cout), np.zeros(cout), np.zeros(cout), np.ones(cout))):
            inits.append(nh.from_array(v.astype(np.float32), n_))
        y = name("bn")
        nodes.append(helper.make_node("BatchNormalization", [c] + bn, [y]))
        if relu:
            r = name("relu")
            nodes.append(helper.make_node("Relu", [y], [r]))
            return r
        return y

    x = conv_bn("x", 3, 64, 7, 2)
    p = name("pool")
    nodes.append(helper.make_node("MaxPool", [x], [p], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = p, 64
    for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        y = conv_bn(x, cin, cout, 3, stride)
        y = conv_bn(y, cout, cout, 3, 1, relu=False)
        short = conv_bn(x, cin, cout, 1, stride, relu=False) if (stride != 1 or cin != cout) else x
        a, r = name("add"), name("relu")
        nodes += [helper.make_node("Add", [y, short], [a]), helper.make_node("Relu", [a], [r])]
        x, cin = r, cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    inits.append(nh.from_array((rng.standard_normal((classes, 512)) * 0.05).astype(np.float32), "fc_w"))
    inits.append(nh.from_array(np.zeros(classes, np.float32), "fc_b"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1))
    graph = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 224, 224])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", classes])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def run(quick: bool = False) -> Table:
    """Latency (ms) of singa_onnx and onnxruntime on the light models and a ResNet-18-style network."""
    table = Table(
        title="ONNX inference latency, singa_onnx vs onnxruntime (ms per batch, lower is better)",
        script="bench_onnx.py",
        headers=["model", "batch", "singa_onnx", "onnxruntime", "singa/onnxruntime"],
    )
    try:
        import onnx
        import onnxruntime as ort

        import singa_onnx
    except ImportError as exc:
        table.notes.append(f"Not run: {exc} (needs singa-onnx, onnx and onnxruntime).")
        return table
    dev = benchlib.singa_device()
    models = [(n, realistic(onnx.load(_light_path(n)))) for n in (QUICK_LIGHT if quick else LIGHT)]
    models.append(("resnet18-style", resnet18()))
    transformers = _transformers(quick)
    models += transformers
    rng = np.random.default_rng(0)
    for label, m in models:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        rep = singa_onnx.prepare(m, dev)
        in_name = sess.get_inputs()[0].name
        shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape]
        for batch in (1,) if quick else (1, 8):
            if sess.get_inputs()[0].type == "tensor(int64)":  # token ids
                import _onnx_transformers

                x = _onnx_transformers.sample(batch)
            else:
                x = rng.standard_normal([batch] + shape[1:]).astype(np.float32)
            want = sess.run(None, {in_name: x})[0]
            _check(label, batch, rep.run([x])[0], want)
            # the two take turns, a few runs each per round, so that a slow spell of a shared machine hits both;
            # before each turn a pause lets the other's threads wind down (onnxruntime's keep spinning for tens of
            # milliseconds after a run, taking a core from whatever runs next), and a warm-up run
            rounds, repeat = (1, 2) if quick else ((4, 3) if batch == 1 else (3, 2))
            t_singa = t_ort = float("inf")
            for r in range(rounds):
                warm = 2 if r == 0 else 1
                time.sleep(PAUSE)
                t_singa = min(t_singa, best_time(lambda x=x, rep=rep: rep.run([x]), repeat, warmup=warm))
                time.sleep(PAUSE)
                t_ort = min(t_ort, best_time(lambda x=x, sess=sess, name=in_name: sess.run(None, {name: x}), repeat,
                                             warmup=warm))
            _check(label, batch, rep.run([x])[0], want)  # a replayed run
            table.rows.append([label, batch, t_singa * 1e3, t_ort * 1e3, ratio(t_singa, t_ort)])
    table.notes.append(
        "Light models: the onnx wheel's test models with random weights in place of their ConstantOfShape ones and "
        "a free batch dimension (see the module docstring). singa_onnx runs `prepare(model).run` with its inference "
        "optimisations (constants and BatchNormalization folded, the kernel sequence recorded per input shape and "
        "replayed; see singa_onnx.inference) on the CPU backend's default threads; onnxruntime runs with its default "
        f"CPU threads; onnxruntime {ort.__version__}, onnx {onnx.__version__}. Each time is the best run of 4 rounds "
        f"(batch 8: 3) in which the two take turns, 3 (2) timed runs each after a {PAUSE:.2f} s pause (onnxruntime's "
        "threads spin on for tens of milliseconds after a run) and a warm-up run.")
    if transformers:
        table.notes.append(
            "bert, roberta, gpt2: 4-layer encoders (hidden 256, 4 heads, feed-forward 1024, sequence 128) written in "
            "PyTorch and exported with torch.onnx.export (opset 17), int64 token ids in; see _onnx_transformers.py.")
    else:
        table.notes.append("The transformer exports need torch (not installed): not measured.")
    table.notes.append(
        "Convolutions run through oneDNN where it was faster for the shape (SINGA_ONEDNN=auto), its reordered "
        "weights kept while the inference plan lives, a following Relu and residual Add fused into them "
        "(FusedConv: oneDNN's post-ops); on the blocked activations a convolution may instead run on one of the "
        "backend's own kernels where it measured clearly faster than oneDNN with its weights kept (timed in turns "
        "when the shape is first met): Winograd F(4x4, 3x3) for 3x3 stride-1 ones (its transformed weights kept "
        "alike), or an unfolding plus one GEMM (small images: InceptionV2's 7x7 layers); "
        "between convolutions the activations stay in oneDNN's channel-blocked "
        "layout through Relu, Add, Concat and pooling (singa_onnx.layout), NCHW only at the graph's edges, "
        "around other operators and for grouped convolutions other than depthwise ones (ShuffleNet's run as whole "
        "per-group products per thread where that measured faster). Matrix products (fully connected layers, "
        "attention) run on oneDNN's sgemm, or OpenBLAS's where it measured faster for the shape; depthwise "
        "convolutions have their own direct kernels. In the transformers, GELU (erf or tanh form) "
        "is one kernel and LayerNormalization one kernel; attention's heads are read where they lie by the products "
        "(matmul's strided operands: no copies of Q, K and V) and its 1/sqrt(d) scale runs inside the product "
        "(FusedMatMul); it is not one fused kernel (each MatMul's bias is its own Add). A replayed run calls each "
        "kernel from Python; convolutions, poolings, copies and element-wise kernels as launches worked out when the "
        "run was recorded (the CPU backend's `bind`; a oneDNN plan is one C call), a few microseconds each. At batch "
        "1 the kernels that make a channel Concat's inputs write into it (no copies); Identity and inference Dropout "
        "nodes are left out (SqueezeNet's Dropout no longer keeps its last convolution's operands out of channel "
        "blocks).")
    table.notes.append(benchlib.openmp_note())
    return table


def _transformers(quick: bool) -> list:
    """(label, model) of the PyTorch transformer exports, or none without torch."""
    if benchlib.torch is None:
        return []
    import warnings

    import _onnx_transformers

    with warnings.catch_warnings():  # torch's notice that the TorchScript-based exporter is the legacy one
        warnings.simplefilter("ignore")
        return [(k, _onnx_transformers.export(k)) for k in (["bert"] if quick else _onnx_transformers.KINDS)]


def _check(label: str, batch: int, got: np.ndarray, want: np.ndarray) -> None:
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    if not err < 1e-3:
        raise AssertionError(f"{label} batch {batch}: relative error {err:.2e} against onnxruntime")


if __name__ == "__main__":
    benchlib.main(run)
