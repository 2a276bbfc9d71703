"""What every converter of a source shares (``convert``'s own readers, and ``onnx_convert``):
the error a source that cannot be converted raises, the tensors handed to the writer, and
reading a tensor's raw values where no library reads them for us."""

from __future__ import annotations

import numpy as np

from .. import burnpack

Tensors = list[tuple[str, burnpack.Deferred]]  # in the order they are written


class ConvertError(Exception):
    """A source that cannot be converted; the message is one line naming the file."""


def read_values(file: str, offset: int, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A tensor's values straight from ``file`` at byte ``offset``, for bytes that no library
    reads for us (BF16 in safetensors, ONNX external data); ``where`` names the tensor."""
    count = int(np.prod(shape, dtype=np.int64))
    try:
        with open(file, "rb") as f:
            f.seek(offset)
            data = np.fromfile(f, dtype=dtype, count=count)
    except OSError as exc:
        raise ConvertError(f"{where}: cannot read {file}: {exc.strerror or exc}") from exc
    if data.size != count:
        raise ConvertError(f"{where}: its data in {file} is cut short")
    return data.reshape(shape)
