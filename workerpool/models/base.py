"""What every built-in model shares: its errors, its declared signature and input checking."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..burnpack import FileIdentity

INPUT_NAME = "input"
# The metadata key that names a file's model: a built-in name or package.module:factory.
MODEL_KEY = "workerpool.model"


@dataclass(frozen=True)
class BuildOptions:
    """What the built-in models that tune themselves to their worker are told: its CPU budget
    (None: their libraries' default), and a folder for what a model prepares once per machine
    and weight file (None: it prepares nothing), with that file's path and identity."""

    threads: int | None = None
    cache_dir: str | None = None
    path: str | None = None
    identity: FileIdentity | None = None


class ModelError(Exception):
    """A model cannot be chosen or built for these weights; the message says what to change."""


class ModelInputError(ValueError):
    """A request's input does not fit the model; the message is meant for the client."""


def format_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("B" if d is None else str(d) for d in shape) + "]"


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
        expected = "[" + ", ".join(map(str, shape)) + "]"
        raise ModelError(
            f"{model}: tensor {name} has shape {list(value.shape)}, expected {expected}"
        )
    return value


class Model:
    """A built-in model: a callable from one float32 array (batched or not) to float32 outputs.

    Serving code reads the declared signature: ``input_shape`` and ``output_shape`` have
    ``None`` for the batch axis. An input may also be passed as ``{"input": array}``. An
    input without the batch axis is treated as a batch of one, so the output always has it.
    """

    name: str
    input_shape: tuple[int | None, ...]
    output_shape: tuple[int | None, ...]
    input_dtype: np.dtype | None = np.dtype(np.float32)  # None: not declared, the model checks
    output_dtype: np.dtype | None = np.dtype(np.float32)
    # Dtypes accepted besides ``input_dtype`` and converted to it.
    also_accepted: tuple[np.dtype, ...] = ()
    # Every tensor the model reads: recognition requires a file to hold exactly these.
    tensor_names: frozenset[str]
    # Rows are independent: inputs stacked along the batch axis give the stacked outputs.
    batching = True

    @property
    def input_description(self) -> str:
        dtypes = " or ".join(str(d) for d in (self.input_dtype, *self.also_accepted))
        return (
            f"{dtypes} input of shape {format_shape(self.input_shape)} "
            f"or {format_shape(self.input_shape[1:])}"
        )

    def __call__(self, inputs: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
        return self.forward(self.check_input(inputs))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Compute outputs for a checked batch of ``input_dtype``."""
        raise NotImplementedError

    def check_input(self, inputs: Any) -> np.ndarray:
        """Return the input as a batch of ``input_dtype``, or raise :class:`ModelInputError`."""
        if isinstance(inputs, Mapping):
            if set(inputs) != {INPUT_NAME}:
                keys = sorted(map(str, inputs))
                raise self._refuse(f"a mapping with keys {keys} (only {INPUT_NAME!r} is known)")
            inputs = inputs[INPUT_NAME]
        if not isinstance(inputs, np.ndarray):
            raise self._refuse(f"a {type(inputs).__name__}")
        if inputs.dtype != self.input_dtype and inputs.dtype not in self.also_accepted:
            raise self._refuse(f"{inputs.dtype} {list(inputs.shape)}")
        fixed = self.input_shape[1:]
        if inputs.shape == fixed:
            inputs = inputs[np.newaxis]
        elif inputs.ndim != len(self.input_shape) or inputs.shape[1:] != fixed:
            raise self._refuse(f"{inputs.dtype} {list(inputs.shape)}")
        return inputs.astype(self.input_dtype, copy=False)

    def _refuse(self, got: str) -> ModelInputError:
        return ModelInputError(f"{self.name}: expected {self.input_description}, got {got}")

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name} {format_shape(self.input_shape)} -> "
            f"{format_shape(self.output_shape)}>"
        )
