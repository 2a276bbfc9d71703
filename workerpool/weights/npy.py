"""Reading an ``.npy`` header without reading its data.

A header can claim any shape, and numpy allocates what it claims before reading; callers
compare :attr:`NpyHeader.nbytes` with what the file really holds first. Object arrays are
never read (that would unpickle).
"""

from __future__ import annotations

import math
from typing import IO, NamedTuple

import numpy as np

SUPPORTED_VERSIONS = ((1, 0), (2, 0))  # np.save writes 3.0 only for non-Latin-1 field names


class NpyHeader(NamedTuple):
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool

    @property
    def nbytes(self) -> int:
        """The bytes of data the header declares."""
        return math.prod(self.shape) * self.dtype.itemsize


def read_header(stream: IO[bytes]) -> NpyHeader:
    """The header at ``stream``'s position, which is left at the start of the data;
    ValueError when it is not an ``.npy`` header of a supported version."""
    npy = np.lib.format
    version = npy.read_magic(stream)
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f".npy format version {version} is not supported")
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, fortran_order, dtype = read(stream)
    return NpyHeader(np.dtype(dtype), tuple(shape), fortran_order)
