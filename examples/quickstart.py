"""Quick start: fit a linear model y = X w + b by gradient descent, entirely with singa tensors on the default device.

    python examples/quickstart.py                    # on the default device (cpu)
    SINGA_DEVICE=hostmem python examples/quickstart.py

The data are synthetic with known weights; the script prints the loss as it falls, then the fitted weights next to the
exact least-squares solution computed by numpy, and fails if they disagree.
"""

from __future__ import annotations

import numpy as np

from singa import device, tensor

N, D = 2000, 4
STEPS, LR = 150, 0.1


def to_float(t) -> float:
    return float(np.asarray(tensor.to_numpy(t)).reshape(()))


def main() -> int:
    dev = device.get_default_device()
    print(f"device: {dev.description()}")

    rng = np.random.default_rng(0)
    w_true = np.array([[2.0], [-3.0], [0.5], [1.25]], np.float32)
    X = rng.standard_normal((N, D)).astype(np.float32)
    y = (X @ w_true + 0.7 + 0.05 * rng.standard_normal((N, 1))).astype(np.float32)

    tx, ty = tensor.from_numpy(X, dev), tensor.from_numpy(y, dev)
    txt = tensor.from_numpy(np.ascontiguousarray(X.T), dev)
    w = tensor.from_numpy(np.zeros((D, 1), np.float32), dev)
    b = tensor.from_numpy(np.zeros((1,), np.float32), dev)

    for step in range(STEPS + 1):
        err = tensor.mult(tx, w) + b - ty  # (N, 1) residuals; b broadcasts
        if step % 30 == 0:
            print(f"step {step:4d}  mse {to_float(tensor.sum(err * err, axis=0)) / N:.5f}")
        # gradient of the mean squared error
        w -= tensor.mult(txt, err) * (2.0 * LR / N)
        b -= tensor.sum(err, axis=0) * (2.0 * LR / N)

    w_fit, b_fit = tensor.to_numpy(w).reshape(-1), float(tensor.to_numpy(b)[0])
    A = np.hstack([X, np.ones((N, 1), np.float32)]).astype(np.float64)
    exact = np.linalg.lstsq(A, y.astype(np.float64), rcond=None)[0].reshape(-1)
    print("          " + "  ".join(f"{f'w{i}':>8}" for i in range(D)) + f"  {'b':>8}")
    print("singa     " + "  ".join(f"{v:8.4f}" for v in w_fit) + f"  {b_fit:8.4f}")
    print("lstsq     " + "  ".join(f"{v:8.4f}" for v in exact[:D]) + f"  {exact[D]:8.4f}")
    print("true      " + "  ".join(f"{v:8.4f}" for v in w_true.reshape(-1)) + f"  {0.7:8.4f}")
    if not np.allclose(np.append(w_fit, b_fit), exact, atol=1e-3):
        print("FAILED: gradient descent did not reach the least-squares solution")
        return 1
    print("ok: gradient descent on singa tensors matches numpy's least squares")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
