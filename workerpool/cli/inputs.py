"""The input of ``infer``: an .npy array or an .npz archive of named arrays, never a pickle."""

from __future__ import annotations

import os
import stat
from typing import Any, BinaryIO

from ..weights import npy
from .failures import CommandError, reported

READ_CHUNK = 1 << 20  # bytes read at a time from an .npy input


def load_input(path: str) -> Any:
    """An .npy file's array, or an .npz archive's arrays by name (named inputs); never a pickle.
    The file is opened once and read front to back, so a pipe works too."""
    import zipfile

    import numpy as np

    with (
        reported(OSError, saying=lambda exc: f"{path}: cannot read it: {exc.strerror or exc}"),
        reported(ValueError, EOFError, MemoryError, zipfile.BadZipFile,
                 saying=lambda exc: f"{path}: cannot load it: {exc or type(exc).__name__}"),
        open(path, "rb") as f,
    ):
        start = f.peek(len(np.lib.format.MAGIC_PREFIX))[:len(np.lib.format.MAGIC_PREFIX)]
        if start == np.lib.format.MAGIC_PREFIX:
            return _read_npy(f, path)
        if start.startswith(b"PK\x03\x04"):  # a zip archive's first local file header
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CommandError(f"{path}: an .npz archive is read from a file, not a pipe")
            with np.load(f, allow_pickle=False) as archive:
                inputs = {name: archive[name] for name in archive.files}
            if not all(isinstance(x, np.ndarray) for x in inputs.values()):
                raise CommandError(f"{path}: a zip archive but not an .npz of arrays")
            return inputs
    raise CommandError(f"{path}: not a .npy file (np.save writes one) nor an .npz archive")


def _read_npy(f: BinaryIO, path: str) -> Any:
    """The array, its data taken as it comes and never more than the header declares, so a
    header that claims more than the file holds allocates nothing (a pipe works too)."""
    import numpy as np

    header = npy.read_header(f)
    if header.dtype.hasobject:
        raise CommandError(f"{path}: holds Python objects, which are never unpickled")
    data = bytearray()
    while len(data) < header.nbytes and (chunk := f.read(min(header.nbytes - len(data), READ_CHUNK))):
        data += chunk
    if len(data) < header.nbytes:
        raise CommandError(f"{path}: its header declares {header.nbytes} bytes of data, the file "
                           f"holds {len(data)}")
    return np.frombuffer(data, header.dtype).reshape(header.shape,
                                                     order="F" if header.fortran_order else "C")

