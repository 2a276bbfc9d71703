"""The built-in ``mlp``: a chain of Burn Linear layers, and a generator of such files at any size."""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .. import burnpack
from . import ops
from .base import MODEL_KEY, Model, ModelError
from .tensors import require_tensor

NAME = "mlp"
ACTIVATION_KEY = "workerpool.activation"
ACTIVATIONS = {"relu": ops.relu_, "gelu": ops.gelu}

_LAYER_TENSOR = re.compile(r"layers\.(\d+)\.(weight|bias)")


class Mlp(Model):
    """``layers.{i}.weight`` ``[d_in, d_out]`` and ``layers.{i}.bias`` ``[d_out]``, i = 0..L-1.

    Forward is ``x @ W + b`` per layer (Burn's Row layout), with the activation named by the
    metadata key ``workerpool.activation`` (``relu``, the default, or exact ``gelu``) between
    layers and none after the last. Input is float32 ``[B, d_in]`` or ``[d_in]``; the output
    is float32 ``[B, d_out]``, with B = 1 for a 1-D input.
    """

    name = NAME

    def __init__(self, weights: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
        activation = metadata.get(ACTIVATION_KEY, "relu")
        if activation not in ACTIVATIONS:
            raise ModelError(
                f"{NAME}: metadata {ACTIVATION_KEY} is {activation!r}, expected one of "
                f"{', '.join(ACTIVATIONS)}"
            )
        self.activation = activation
        self._activate = ACTIVATIONS[activation]
        self.layers = _layers(weights)
        self.tensor_names = frozenset(
            f"layers.{i}.{part}" for i in range(len(self.layers)) for part in ("weight", "bias")
        )
        self.input_shape = (None, self.layers[0][0].shape[0])
        self.output_shape = (None, self.layers[-1][0].shape[1])

    def forward(self, x: np.ndarray) -> np.ndarray:
        last = len(self.layers) - 1
        for i, (weight, bias) in enumerate(self.layers):
            x = ops.linear(x, weight, bias)
            if i < last:
                x = self._activate(x)
        return x


def _layers(weights: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    indices = {int(m[1]) for m in map(_LAYER_TENSOR.fullmatch, weights) if m}
    if not indices:
        raise ModelError(f"{NAME}: no layers.0.weight among the weights")
    count = max(indices) + 1
    layers = []
    d_in: int | str = "d_in"
    for i in range(count):
        weight = require_tensor(NAME, weights, f"layers.{i}.weight", (d_in, "d_out"))
        d_in = weight.shape[1]
        bias = require_tensor(NAME, weights, f"layers.{i}.bias", (d_in,))
        layers.append((weight, bias))
    return layers


@dataclass(frozen=True)
class GeneratedMlp:
    """What :func:`generate_mlp` wrote: ``dims`` are the layer widths, input first."""

    path: str
    dims: tuple[int, ...]
    activation: str
    size_bytes: int

    @property
    def layers(self) -> int:
        return len(self.dims) - 1


_OUTPUT_DIM = 10
_MAX_WIDTH = 4096
_MIN_WIDTH = 16
_BIAS_STD = 0.3
# Header, CBOR metadata (about 70 bytes per tensor) and its padding, for sizing only.
_OVERHEAD = 512
_PER_TENSOR_OVERHEAD = 70


def generate_mlp(
    path: str | os.PathLike,
    size_bytes: int,
    *,
    width: int | None = None,
    seed: int = 0,
    activation: str = "relu",
    progress: Callable[[int, int], None] | None = None,
) -> GeneratedMlp:
    """Write a deterministic ``mlp`` of about ``size_bytes`` bytes to ``path``.

    The layers are ``width -> width`` (as many as fit), then ``width -> h -> 10`` with ``h``
    (at least ``width / 2`` when the size allows) chosen to land on the requested size:
    within a fraction of a percent from 1 MiB up. At least two layers are written, so a size
    below that minimum for the width gives a bigger file. Without ``width`` it is
    ``sqrt(size / 16)`` rounded down to a multiple of 8 and clamped to 16..4096, so there are
    about four square layers and none is over 64 MiB. The input dimension is ``width``.

    Weights are ``normal * sqrt(2 / d_in)`` and biases ``normal * 0.3``, which keeps outputs of
    order one through hundreds of relu or gelu layers. Tensor k draws from
    ``default_rng([seed, k])``, and each is generated only when the writer reaches it, so
    memory holds one tensor at a time whatever the size. ``progress(done, total)`` is called
    as each layer is written.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}")
    if size_bytes <= 0:
        raise ValueError(f"size_bytes must be positive, not {size_bytes}")
    if width is None:
        width = min(_MAX_WIDTH, max(_MIN_WIDTH, math.isqrt(size_bytes // 16) // 8 * 8))
    elif width < 1:
        raise ValueError(f"width must be positive, not {width}")
    dims = _plan_dims(size_bytes, width)
    tensors = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        weight = _normal(seed, 2 * i, (d_in, d_out), math.sqrt(2 / d_in))
        if progress is not None:
            weight = _reporting(weight, progress, i, len(dims) - 1)
        tensors.append((f"layers.{i}.weight", weight))
        tensors.append((f"layers.{i}.bias", _normal(seed, 2 * i + 1, (d_out,), _BIAS_STD)))
    metadata = {MODEL_KEY: NAME, ACTIVATION_KEY: activation}
    burnpack.write(path, tensors, metadata=metadata)
    return GeneratedMlp(os.fspath(path), dims, activation, os.path.getsize(path))


def _plan_dims(size_bytes: int, width: int) -> tuple[int, ...]:
    def padded(count: int) -> int:
        return -(-count * 4 // 256) * 256

    square = padded(width * width) + padded(width) + 2 * _PER_TENSOR_OVERHEAD
    # The last two layers, width -> h -> 10, cost this much per unit of h, plus fixed padding.
    per_h = 4 * (width + 1 + _OUTPUT_DIM)
    tail_fixed = 2 * 255 + padded(_OUTPUT_DIM) + 4 * _PER_TENSOR_OVERHEAD
    budget = size_bytes - _OVERHEAD - tail_fixed
    # Keeping h >= width / 2 avoids a narrow bottleneck just before the output.
    squares = max(0, (budget - per_h * max(1, width // 2)) // square)
    h = max(1, round((budget - squares * square) / per_h))
    return (width,) * (squares + 1) + (h, _OUTPUT_DIM)


def _reporting(tensor: burnpack.Deferred, progress: Callable[[int, int], None], index: int,
               total: int) -> burnpack.Deferred:
    """``tensor``, telling ``progress`` once it is made."""
    def load() -> np.ndarray:
        values = tensor.load()
        progress(index + 1, total)
        return values
    return burnpack.Deferred(tensor.dtype, tensor.shape, load)


def _normal(seed: int, stream: int, shape: tuple[int, ...], std: float) -> burnpack.Deferred:
    def load() -> np.ndarray:
        values = np.random.default_rng([seed, stream]).standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        return values

    return burnpack.Deferred(np.float32, shape, load)
