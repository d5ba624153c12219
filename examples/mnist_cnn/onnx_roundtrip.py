"""The ONNX part of the demo: export the trained CNN, check it with onnx and onnxruntime, and import it back.

`train.py` calls `run(model, dev, x_test, y_test, out_dir)` after training; it also runs on its own, on a checkpoint
written by train.py:

    python examples/mnist_cnn/onnx_roundtrip.py out/checkpoint.zip --out out

1. `sonnx.to_onnx([x], [y])` on a forward pass recorded in training mode (SINGA's way; the model's parameters and
   running statistics are saved before and restored after it, so recording changes nothing), then
   `onnx.checker.check_model(full_check=True)` and `onnx.save` to `<out>/mnist_cnn.onnx`.
2. onnxruntime runs the file on every held-out image (its batch axis is symbolic: any batch size); its logits are
   compared with SINGA's and its accuracy printed.
3. `sonnx.SONNXModel` (the Model API) and `sonnx.prepare(...).run(...)` (the earlier API) import the file again; their
   held-out accuracy is printed next to the trained model's.

Needs `pip install singa-onnx onnxruntime` (onnxruntime only for step 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

from singa import autograd, data, device, sonnx, tensor

# SINGA's and onnxruntime's float32 convolutions sum in different orders: logits agree to about 1e-5 of their scale.
LOGIT_TOLERANCE = 1e-3


def record_and_export(m, x: tensor.Tensor, model_name: str = "mnist_cnn"):
    """The ONNX model of m.forward, recorded on x.

    Autograd records operators only while `autograd.training` is True, and in training mode layers such as
    BatchNorm2d update their running statistics: the states are copied before and written back after."""
    saved = {k: v.to_numpy().copy() for k, v in m.get_states().items()}
    was_training, prev = m.training, autograd.training
    autograd.training = True
    try:
        y = m.forward(x)
        onnx_model = sonnx.to_onnx([x], [y], model_name=model_name)
    finally:
        autograd.training = prev
        m.set_states(saved)
        m.train(was_training)
    return onnx_model


def singa_logits(m, dev, x: np.ndarray, batch_size: int = 128) -> np.ndarray:
    was = m.training
    m.eval()
    try:
        return np.concatenate([tensor.to_numpy(m.forward(tensor.from_numpy(xb, dev)))
                               for xb, _ in data.batches(x, np.zeros(len(x)), batch_size)])
    finally:
        m.train(was)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == y).mean()) if len(y) else 0.0


def run(m, dev, x_test: np.ndarray, y_test: np.ndarray, out_dir: str | Path, batch_size: int = 128) -> dict:
    """Export, check, compare and re-import; prints one line per step and returns what it measured.

    `ok` is False when onnxruntime's or a re-imported model's logits differ from SINGA's beyond LOGIT_TOLERANCE
    (relative to the largest logit); accuracies may then differ as well."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "mnist_cnn.onnx"
    x_test = np.asarray(x_test, np.float32)
    ref = singa_logits(m, dev, x_test, batch_size)
    scale = max(float(np.abs(ref).max()), 1.0)
    res = {"path": str(path), "accuracy": {"singa": accuracy(ref, y_test)}, "max_abs_diff": {}, "ok": True}

    onnx_model = record_and_export(m, tensor.from_numpy(x_test[:min(batch_size, len(x_test))], dev))
    onnx.checker.check_model(onnx_model, full_check=True)
    onnx.save(onnx_model, str(path))
    dims = [d.dim_param or d.dim_value for d in onnx_model.graph.input[0].type.tensor_type.shape.dim]
    print(f"onnx: {path} ({len(onnx_model.graph.node)} nodes, {len(onnx_model.graph.initializer)} initializers, "
          f"opset {onnx_model.opset_import[0].version}, input {dims}); onnx.checker (full check): ok")

    def report(what: str, logits: np.ndarray) -> None:
        diff = float(np.abs(logits - ref).max())
        acc = accuracy(logits, y_test)
        res["accuracy"][what] = acc
        res["max_abs_diff"][what] = diff
        ok = diff <= LOGIT_TOLERANCE * scale
        res["ok"] &= ok
        print(f"{what}: held-out accuracy {acc:.4f} (singa {res['accuracy']['singa']:.4f}), "
              f"max |logit difference| {diff:.2e}{'' if ok else '  <-- beyond tolerance'}")

    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed, so the exported file is not run there (pip install onnxruntime)")
    else:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        report(f"onnxruntime {ort.__version__}",
               np.concatenate([sess.run(None, {name: xb})[0] for xb, _ in
                               data.batches(x_test, np.zeros(len(x_test)), batch_size)]))

    reloaded = onnx.load(str(path))
    imported = sonnx.SONNXModel(reloaded)
    imported.compile([tensor.from_numpy(x_test[:batch_size], dev)], is_train=False, use_graph=False,
                     sequential=True)
    report("sonnx.SONNXModel", np.concatenate([tensor.to_numpy(imported.forward(tensor.from_numpy(xb, dev))[0])
                                               for xb, _ in data.batches(x_test, np.zeros(len(x_test)), batch_size)]))
    rep = sonnx.prepare(reloaded, device=dev)
    report("sonnx.prepare", np.concatenate([tensor.to_numpy(rep.run([tensor.from_numpy(xb, dev)])[0])
                                            for xb, _ in data.batches(x_test, np.zeros(len(x_test)), batch_size)]))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, help="checkpoint.zip written by train.py")
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for mnist_cnn.onnx (default ./out)")
    p.add_argument("--device", default=None, help="device spec (default: $SINGA_DEVICE, else cpu)")
    p.add_argument("--mnist", type=Path, default=None, help="MNIST IDX folder, as for train.py")
    p.add_argument("--seed", type=int, default=0, help="the seed train.py split the digits with")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model import create_model

    dev = device.get_device(args.device) if args.device else device.get_default_device()
    arrays = data.load_mnist(args.mnist) if args.mnist else data.load_digits_28x28(test_fraction=0.2, seed=args.seed)
    _, _, x_test, y_test = arrays
    m = create_model(num_classes=10, num_channels=1)
    m.compile([tensor.from_numpy(np.asarray(x_test[:2], np.float32), dev)], is_train=False)
    m.load_states(str(args.checkpoint))
    return 0 if run(m, dev, x_test, y_test, args.out)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
