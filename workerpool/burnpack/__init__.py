"""Burnpack, the weight-file format of the Burn framework: zero-copy reading, compatible writing.

``read`` maps a file once and hands out read-only numpy views; ``write`` produces files that
are byte-for-byte what Burn's own writer produces for the same tensors.
"""

from .dtypes import DType, bf16_to_float32, qfloat
from .layout import BurnpackError
from .reader import Burnpack, FileIdentity, TensorInfo, folder_hint, read, resolve
from .writer import Deferred, write

__all__ = [
    "Burnpack",
    "BurnpackError",
    "DType",
    "Deferred",
    "FileIdentity",
    "TensorInfo",
    "bf16_to_float32",
    "folder_hint",
    "qfloat",
    "read",
    "resolve",
    "write",
]
