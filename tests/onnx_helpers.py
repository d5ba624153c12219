"""Models of the ONNX seeds shared by the ONNX test modules; importing this module needs singa-onnx (those modules
skip without it, before they import this one)."""

from __future__ import annotations

from singa import autograd, opt, sonnx

# -- seeds/onnx-earlier-api.md: the MNIST CNN trained with raw autograd ------------------------------------------------


class EarlierOnnxCNN:
    """The earlier ONNX docs' MNIST model, as written there."""

    def __init__(self):
        self.conv1 = autograd.Conv2d(1, 20, 5, padding=0)
        self.conv2 = autograd.Conv2d(20, 50, 5, padding=0)
        self.linear1 = autograd.Linear(4 * 4 * 50, 500, bias=False)
        self.linear2 = autograd.Linear(500, 10, bias=False)
        self.pooling1 = autograd.MaxPool2d(2, 2, padding=0)
        self.pooling2 = autograd.MaxPool2d(2, 2, padding=0)

    def forward(self, x):
        y = self.conv1(x)
        y = autograd.relu(y)
        y = self.pooling1(y)
        y = self.conv2(y)
        y = autograd.relu(y)
        y = self.pooling2(y)
        y = autograd.flatten(y)
        y = self.linear1(y)
        y = autograd.relu(y)
        y = self.linear2(y)
        return y  # noqa: RET504 - the seed's code as written


def sgd_step(out, target, lr):
    """One update of the earlier ONNX docs' raw-autograd training: softmax cross-entropy of `out` against `target`, a
    fresh opt.SGD(lr) applied to every gradient, then its step. Returns how many tensors it updated."""
    loss = autograd.softmax_cross_entropy(out, target)
    sgd = opt.SGD(lr=lr)
    n = 0
    for p, gp in autograd.backward(loss):
        sgd.update(p, gp)
        n += 1
    sgd.step()
    return n


# -- seeds/onnx.md: re-training and transfer learning -----------------------------------------------------------------


class SeedSONNXModel(sonnx.SONNXModel):
    """`train_one_batch` and `set_optimizer` of the seed's re-training and transfer-learning models, as written
    there (the 'fp32' dist_option only)."""

    def train_one_batch(self, x, y, dist_option, spars):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        if dist_option == "fp32":
            self.optimizer.backward_and_update(loss)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer
