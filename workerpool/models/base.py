"""What every model module shares: its errors, how a shape is written, and the built-in models' base."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..burnpack import FileIdentity

INPUT_NAME = "input"
Shape = tuple[int | None, ...]  # None: an axis of any size, the batch axis when first
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


def format_shape(shape: Sequence[int | str | None], *, batch_axis: bool = True) -> str:
    """``[B, 16]``: how every message shows a shape, declared or given. An axis is its size or
    name; None is ``B`` first (the batch axis, unless not ``batch_axis``: a row's shape) and
    ``any`` elsewhere (an axis of any size)."""
    sizes = [str(d) if d is not None else "B" if i == 0 and batch_axis else "any"
             for i, d in enumerate(shape)]
    return "[" + ", ".join(sizes) + "]"


class Model:
    """A built-in model: it declares its signature, and computes on what the contract admits.

    :class:`~.contract.Contract` reads the declaration and checks every request against it
    before the model runs: ``input_shape`` and ``output_shape`` have ``None`` for the batch
    axis; ``input_dtype`` and the ``also_accepted`` dtypes are admitted, and converted here to
    ``input_dtype``. The model is handed a batch, bare or as ``{"input": batch}`` (a bare row
    has been given its batch axis), so it checks nothing itself.
    """

    name: str
    input_shape: Shape
    output_shape: Shape
    input_dtype: np.dtype | None = np.dtype(np.float32)  # None: not declared, the model checks
    output_dtype: np.dtype | None = np.dtype(np.float32)
    # Dtypes accepted besides ``input_dtype`` and converted to it.
    also_accepted: tuple[np.dtype, ...] = ()
    # Every tensor the model reads: recognition requires a file to hold exactly these.
    tensor_names: frozenset[str]
    # Rows are independent: inputs stacked along the batch axis give the stacked outputs.
    batching = True

    def __call__(self, inputs: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
        batch = inputs[INPUT_NAME] if isinstance(inputs, Mapping) else inputs
        return self.forward(batch.astype(self.input_dtype, copy=False))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Compute outputs for a batch of ``input_dtype``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name} {format_shape(self.input_shape)} -> "
            f"{format_shape(self.output_shape)}>"
        )
