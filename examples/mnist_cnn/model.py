"""The MNIST CNN of SINGA's examples, written against the Model API.

Conv 20@5x5, ReLU, MaxPool 2x2, Conv 50@5x5, ReLU, MaxPool 2x2, Flatten, Linear 500, ReLU, Linear 10, with
softmax cross-entropy as the loss. Parameters are created on the first call (`model.compile`), their input sizes
inferred; `train_one_batch` runs forward, loss, backward and the optimizer's update in one step, which graph mode
records once and replays.
"""

from __future__ import annotations

from singa import layer, model


class CNN(model.Model):

    def __init__(self, num_classes: int = 10, num_channels: int = 1):
        super().__init__()
        self.num_classes = num_classes
        self.num_channels = num_channels
        self.input_size = 28
        self.conv1 = layer.Conv2d(20, 5, padding=0)
        self.relu1 = layer.ReLU()
        self.pooling1 = layer.MaxPool2d(2, 2, padding=0)
        self.conv2 = layer.Conv2d(50, 5, padding=0)
        self.relu2 = layer.ReLU()
        self.pooling2 = layer.MaxPool2d(2, 2, padding=0)
        self.flatten = layer.Flatten()
        self.linear1 = layer.Linear(500)
        self.relu3 = layer.ReLU()
        self.linear2 = layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pooling1(self.relu1(self.conv1(x)))
        y = self.pooling2(self.relu2(self.conv2(y)))
        y = self.relu3(self.linear1(self.flatten(y)))
        return self.linear2(y)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer


def create_model(num_classes: int = 10, num_channels: int = 1) -> CNN:
    return CNN(num_classes=num_classes, num_channels=num_channels)
