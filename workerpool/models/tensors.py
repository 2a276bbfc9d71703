"""The tensors a built-in model reads from a weight file, checked when the model is built.

A file that does not hold them is not that model's: the failure is a :class:`ModelError`,
which also tells recognition to try the next model. What requests bring is the contract's
concern (:mod:`.contract`), not this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .base import ModelError, format_shape


def require_tensor(
    model: str, weights: Mapping[str, Any], name: str, shape: tuple[int | str, ...]
) -> np.ndarray:
    """Return ``weights[name]`` itself (never a copy) after checking it is float32 of ``shape``.

    A string in ``shape`` names an axis of any size, and is how the error message shows it.
    """
    if name not in weights:
        raise ModelError(f"{model}: tensor {name} is missing from the weights")
    value = weights[name]
    if not isinstance(value, np.ndarray):
        raise ModelError(f"{model}: tensor {name} is a {type(value).__name__}, not a numpy array")
    if value.dtype != np.float32:
        raise ModelError(f"{model}: tensor {name} has dtype {value.dtype}, expected float32")
    fits = value.ndim == len(shape) and all(
        isinstance(e, str) or e == d for d, e in zip(value.shape, shape)
    )
    if not fits:
        raise ModelError(
            f"{model}: tensor {name} has shape {format_shape(value.shape)}, expected {format_shape(shape)}"
        )
    return value
