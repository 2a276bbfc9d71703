"""The built-in ``burn-mnist``: the network of Burn's ``examples/mnist-inference-web``.

Implemented from that example's code (model.rs, web.rs), which disagrees with its README: the
conv blocks use ReLU, fc1 and fc2 use exact GELU, and conv2 has 64 output channels.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import ops
from .base import Model
from .tensors import require_tensor

NAME = "burn-mnist"

_MNIST_MEAN = np.float32(0.1307)
_MNIST_STD = np.float32(0.3081)
_BATCH_NORM_EPS = 1e-5

SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.conv.weight": (64, 1, 3, 3),
    "conv1.conv.bias": (64,),
    "conv2.conv.weight": (64, 64, 3, 3),
    "conv2.conv.bias": (64,),
    **{
        f"conv{i}.norm.{part}": (64,)
        for i in (1, 2)
        for part in ("gamma", "beta", "running_mean", "running_var")
    },
    "fc1.weight": (1600, 128),
    "fc1.bias": (128,),
    "fc2.weight": (128, 128),
    "fc2.bias": (128,),
    "fc3.weight": (128, 10),
    "fc3.bias": (10,),
}


class BurnMnist(Model):
    """Digit logits from 28x28 grayscale images, as the Burn example's web page sends them.

    Input: raw pixel values, 0 for background and about 255 for ink, as float32 (what the
    example's browser code sends) or uint8, shaped ``[B, 28, 28]`` or ``[28, 28]``. The model
    normalises them itself, ``((x / 255) - 0.1307) / 0.3081`` as web.rs does. Output: float32
    logits ``[B, 10]`` (the example applies softmax after the model; this model does not).
    """

    name = NAME
    input_shape = (None, 28, 28)
    output_shape = (None, 10)
    also_accepted = (np.dtype(np.uint8),)
    tensor_names = frozenset(SHAPES)

    def __init__(self, weights: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
        self.tensors = {
            name: require_tensor(NAME, weights, name, shape) for name, shape in SHAPES.items()
        }

    def forward(self, x: np.ndarray) -> np.ndarray:
        t = self.tensors
        x = ((x / np.float32(255)) - _MNIST_MEAN) / _MNIST_STD
        x = x[..., np.newaxis]  # channels-last [B, 28, 28, 1]
        x = self._conv_block(x, "conv1")  # [B, 13, 13, 64]
        x = self._conv_block(x, "conv2")  # [B, 5, 5, 64]
        x = x.transpose(0, 3, 1, 2).reshape(len(x), 1600)  # Burn flattens (C, H, W)
        x = ops.gelu(ops.linear(x, t["fc1.weight"], t["fc1.bias"]))
        x = ops.gelu(ops.linear(x, t["fc2.weight"], t["fc2.bias"]))
        return ops.linear(x, t["fc3.weight"], t["fc3.bias"])

    def _conv_block(self, x: np.ndarray, block: str) -> np.ndarray:
        """Conv2d 3x3 valid, BatchNorm on running stats, ReLU, 2x2 max pool (floor)."""
        t = self.tensors
        x = ops.conv2d_valid(x, t[f"{block}.conv.weight"], t[f"{block}.conv.bias"])
        x = ops.batch_norm_(
            x,
            t[f"{block}.norm.gamma"],
            t[f"{block}.norm.beta"],
            t[f"{block}.norm.running_mean"],
            t[f"{block}.norm.running_var"],
            _BATCH_NORM_EPS,
        )
        return ops.max_pool_2x2(ops.relu_(x))
