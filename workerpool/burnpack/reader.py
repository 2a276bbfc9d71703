"""Read a Burnpack file into zero-copy numpy views of one read-only mapping.

Validation is at least as strict as Burn's own reader (burn-pack ``Reader``), plus a
size-versus-shape check for every tensor whose size is fixed by its dtype. Every problem,
whatever the input, surfaces as one :class:`BurnpackError` naming the file.
"""

from __future__ import annotations

import logging
import math
import mmap as _mmap
import os
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import cbor2
import numpy as np

from ..errors import exception_text
from . import dtypes
from .layout import (
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    I64_MAX,
    I64_MIN,
    MAGIC,
    MAX_CBOR_DEPTH,
    MAX_FILE_SIZE,
    MAX_METADATA_SIZE,
    MAX_TENSOR_COUNT,
    MAX_TENSOR_SIZE,
    TENSOR_ALIGNMENT,
    U64_MAX,
    BurnpackError,
    aligned_data_start,
    legacy_data_start,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileIdentity:
    """What tells one version of a file from the next: a rename gives a new inode."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def as_list(self) -> list[int]:
        """The four numbers, as passed between processes (JSON)."""
        return [self.device, self.inode, self.size, self.mtime_ns]


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's descriptor, with its offsets resolved to absolute file positions."""

    name: str
    dtype: dtypes.DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    param_id: int | None

    @property
    def aligned(self) -> bool:
        return self.offset % TENSOR_ALIGNMENT == 0


class Burnpack:
    """A validated Burnpack file and read-only views of its tensors.

    ``tensors`` maps names (in sorted order, as Burn returns them) to numpy arrays that view
    the file's mapping: no tensor byte is copied unless the file was read with ``mmap=False``
    or could not be mapped. The mapping lives as long as any view of it.
    """

    def __init__(
        self,
        path: str,
        identity: FileIdentity,
        version: int,
        layout: str,
        data_start: int,
        infos: dict[str, TensorInfo],
        metadata: dict[str, str],
        scalars: dict[str, int | float | bool],
        buffer: Any,
    ) -> None:
        self.path = path
        self.identity = identity
        self.version = version
        self.layout = layout
        self.data_start = data_start
        self.infos: Mapping[str, TensorInfo] = MappingProxyType(infos)
        self.metadata: Mapping[str, str] = MappingProxyType(metadata)
        self.scalars: Mapping[str, int | float | bool] = MappingProxyType(scalars)
        self.mapped = isinstance(buffer, _mmap.mmap)
        self.tensors: Mapping[str, np.ndarray] = MappingProxyType(
            {name: _view(buffer, info) for name, info in infos.items()}
        )

    @property
    def total_bytes(self) -> int:
        return sum(info.nbytes for info in self.infos.values())

    def disk_order(self) -> list[TensorInfo]:
        """Descriptors in the order their bytes appear in the file (Burn's write order)."""
        return sorted(self.infos.values(), key=lambda info: (info.offset, info.nbytes > 0))

    def __repr__(self) -> str:
        return f"<Burnpack {self.path!r} {len(self.infos)} tensors {self.layout}>"


def read(path: str | os.PathLike, *, mmap: bool = True, source: str | None = None) -> Burnpack:
    """Validate a Burnpack file and return views of its tensors.

    With ``mmap=True`` the file is mapped read-only and shared with every other process that
    maps it; if mapping fails the file is read into memory and a warning is logged.
    ``mmap=False`` always reads a private copy. ``source``, when given, is opened instead of
    ``path``, which still names the file in messages: a descriptor's ``/proc`` path reaches the
    version of the file a supervisor validated after ``path`` was replaced.
    """
    path = resolve(os.fsdecode(path))
    try:
        # Non-blocking, so that a FIFO under this name is refused below instead of hanging here.
        fd = os.open(source or path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (OSError, ValueError) as exc:
        raise BurnpackError(f"{path}: cannot open: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BurnpackError(f"{path}: a folder, not a Burnpack file; {folder_hint(path)}")
        if not stat.S_ISREG(st.st_mode):
            raise BurnpackError(f"{path}: not a regular file")
        identity = FileIdentity.of(st)
        parsed = _Parser(path, fd, st.st_size).parse()
        buffer = _load(path, fd, st.st_size, mmap)
    except OSError as exc:
        raise BurnpackError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    version, layout, data_start, infos, metadata, scalars = parsed
    return Burnpack(path, identity, version, layout, data_start, infos, metadata, scalars, buffer)


def resolve(path: str) -> str:
    """The file ``path`` names, as Burn's reader finds it: an extensionless path that does not
    exist gets the extension. Whatever checks the file again later checks this name."""
    if not os.path.splitext(path)[1] and not os.path.exists(path):
        return path + ".bpk"
    return path


def _load(path: str, fd: int, size: int, use_mmap: bool) -> Any:
    if use_mmap:
        try:
            return _mmap.mmap(fd, 0, access=_mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot memory-map (%s); reading a private copy instead", path, exc)
    buffer = bytearray(size)
    view = memoryview(buffer)
    done = 0
    while done < size:
        count = os.preadv(fd, [view[done:]], done)
        if count == 0:
            raise BurnpackError(f"{path}: file shrank while being read")
        done += count
    return view.toreadonly()


def _view(buffer: Any, info: TensorInfo) -> np.ndarray:
    if info.dtype.itemsize is None:
        return _frombuffer(buffer, np.dtype("u1"), info.nbytes, info.offset)
    count = math.prod(info.shape)
    return _frombuffer(buffer, info.dtype.numpy, count, info.offset).reshape(info.shape)


def _frombuffer(buffer: Any, dtype: np.dtype, count: int, offset: int) -> np.ndarray:
    array = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
    array.flags.writeable = False
    return array


SNIFF_SIZE = 512  # bytes read to tell what another kind of file is: a zip's first member name


def _what_else(path: str, head: bytes) -> str:
    """What a file that is not Burnpack looks like, and how to make a Burnpack file of it: every
    command that reads weights (serve, inspect, publish) meets this message first."""
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100 * 1024**2:
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isfile(os.path.join(folder, "config.json")):  # a Hugging Face model folder
            return (f"it is a safetensors file in a model folder: {_folder_command(folder)} makes "
                    "a Burnpack file of the folder, its config and tokenizer included")
        return f"it is a safetensors file: {_convert_command(path)} makes a Burnpack file of it"
    if head.startswith(b"PK\x03\x04"):
        first = head[30:30 + int.from_bytes(head[26:28], "little")]
        if first.endswith(b".npy"):
            return f"it is an .npz archive: {_convert_command(path)} makes a Burnpack file of it"
        if first.endswith(b"data.pkl"):
            return f"it is a PyTorch file (torch.save), {_NOT_CONVERTED}"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return f"it is a Python pickle (a PyTorch file?), {_NOT_CONVERTED}"
    if path.endswith(".onnx"):
        return f"it is an ONNX model: {_convert_command(path)} makes a Burnpack file of it"
    return ("workerpool convert makes one from a .safetensors file, an .npz archive, an .onnx model "
            "or a model folder")


_NOT_CONVERTED = ("which workerpool convert does not read: save its state dict with "
                  "safetensors.torch.save_file and convert that")


def folder_hint(folder: str) -> str:
    """What to do with a folder given where a weights file belongs: convert it, when it holds
    what convert reads (a config.json, and .safetensors weights or a model.onnx)."""
    try:
        names = os.listdir(folder)
    except OSError:  # not ours to list: nothing to say of it
        names = []
    weights = "model.onnx" in names or any(name.endswith(".safetensors") for name in names)
    if weights and "config.json" in names:
        return (f"it looks like a model folder: {_folder_command(folder)} makes a Burnpack file of "
                "it, its config and tokenizer included")
    return "give the path of a .bpk file (workerpool convert makes one from a model folder)"


def _folder_command(folder: str) -> str:
    folder = folder.rstrip(os.sep) or folder
    return f"'workerpool convert {shlex.quote(folder)} {shlex.quote(folder + '.bpk')}'"


def _convert_command(path: str) -> str:
    """``'workerpool convert tiny.safetensors tiny.bpk'``, never with the source as destination."""
    stem = os.path.splitext(path)[0]
    destination = stem + ".bpk" if stem + ".bpk" != path else stem + "-converted.bpk"
    return f"'workerpool convert {shlex.quote(path)} {shlex.quote(destination)}'"


class _Parser:
    """Checks a file's header and metadata in Burn's order, reading only those bytes."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size

    def fail(self, problem: str) -> BurnpackError:
        return BurnpackError(f"{self.path}: {problem}")

    def parse(self) -> tuple:
        if self.size > MAX_FILE_SIZE:
            raise self.fail(f"file is {self.size} bytes, over the {MAX_FILE_SIZE}-byte limit")
        if self.size < HEADER_SIZE:
            raise self.fail(f"file is {self.size} bytes, too short for the {HEADER_SIZE}-byte header")
        magic, version, metadata_size = HEADER.unpack(self._pread(HEADER_SIZE, 0))
        if magic != MAGIC:
            raise self.fail(f"not a Burnpack file (magic {magic:#010x}, expected {MAGIC:#010x}); "
                            + _what_else(self.path, self._pread(min(self.size, SNIFF_SIZE), 0)))
        if version > FORMAT_VERSION:
            raise self.fail(f"unsupported format version {version} (this reader knows {FORMAT_VERSION})")
        if metadata_size > MAX_METADATA_SIZE:
            raise self.fail(f"metadata size {metadata_size} exceeds the {MAX_METADATA_SIZE}-byte limit")
        if HEADER_SIZE + metadata_size > self.size:
            raise self.fail(
                f"metadata ({metadata_size} bytes) runs past the end of the file ({self.size} bytes)"
            )
        document = self._decode(self._pread(metadata_size, HEADER_SIZE))
        tensors, metadata, scalars = self._split(document)
        descriptors = {name: self._descriptor(name, value) for name, value in tensors.items()}
        layout, data_start = self._layout(metadata_size, descriptors)
        infos = {
            name: TensorInfo(name, dtype, shape, data_start + start, end - start, param_id)
            for name, (dtype, shape, start, end, param_id) in sorted(descriptors.items())
        }
        return version, layout, data_start, infos, metadata, scalars

    def _pread(self, count: int, offset: int) -> bytes:
        data = os.pread(self.fd, count, offset)
        if len(data) != count:
            raise self.fail("file shrank while being read")
        return data

    def _decode(self, blob: bytes) -> Any:
        try:
            return cbor2.loads(blob, max_depth=MAX_CBOR_DEPTH, allow_duplicate_keys=False)
        except (cbor2.CBORError, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
            raise self.fail(f"metadata is not valid CBOR: {exception_text(exc)}") from exc

    def _split(self, document: Any) -> tuple[dict, dict[str, str], dict[str, int | float | bool]]:
        if not isinstance(document, dict):
            raise self.fail(f"metadata is a CBOR {type(document).__name__}, not a map")
        if "tensors" not in document:
            raise self.fail("metadata has no 'tensors' map")
        tensors = document["tensors"]
        if not isinstance(tensors, dict) or not all(isinstance(k, str) for k in tensors):
            raise self.fail("metadata 'tensors' is not a map of names to descriptors")
        if len(tensors) > MAX_TENSOR_COUNT:
            raise self.fail(f"{len(tensors)} tensors exceed the limit of {MAX_TENSOR_COUNT}")
        metadata = document.get("metadata", {})
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise self.fail("metadata 'metadata' is not a map of text to text")
        raw_scalars = document.get("scalars", {})
        if not isinstance(raw_scalars, dict):
            raise self.fail("metadata 'scalars' is not a map")
        scalars = {self._name(name, "scalar"): self._scalar(name, value) for name, value in raw_scalars.items()}
        return tensors, dict(metadata), scalars

    def _name(self, name: Any, what: str) -> str:
        if not isinstance(name, str):
            raise self.fail(f"a {what} name is a {type(name).__name__}, not text")
        return name

    def _scalar(self, name: str, value: Any) -> int | float | bool:
        if isinstance(value, dict) and len(value) == 1:
            ((kind, inner),) = value.items()
            is_int = isinstance(inner, int) and not isinstance(inner, bool)
            if kind == "Int" and is_int and I64_MIN <= inner <= I64_MAX:
                return inner
            if kind == "UInt" and is_int and 0 <= inner <= U64_MAX:
                return inner
            if kind == "Float" and isinstance(inner, float):
                return inner
            if kind == "Bool" and isinstance(inner, bool):
                return inner
        raise self.fail(f"scalar {name!r} is not a valid Int, UInt, Float or Bool")

    def _descriptor(self, name: str, value: Any) -> tuple:
        if not isinstance(value, dict):
            raise self.fail(f"tensor {name!r}: descriptor is not a map")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in value:
                raise self.fail(f"tensor {name!r}: descriptor has no {key!r}")
        try:
            dtype = dtypes.from_cbor(value["dtype"])
        except ValueError as exc:
            raise self.fail(f"tensor {name!r}: {exc}") from None
        shape = value["shape"]
        if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
            raise self.fail(f"tensor {name!r}: shape is not a list of unsigned integers")
        offsets = value["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_u64(o) for o in offsets)):
            raise self.fail(f"tensor {name!r}: data_offsets is not a pair of unsigned integers")
        param_id = value.get("param_id")
        if param_id is not None and not _is_u64(param_id):
            raise self.fail(f"tensor {name!r}: param_id is not an unsigned 64-bit integer")
        start, end = offsets
        if end < start:
            raise self.fail(f"tensor {name!r}: data_offsets end {end} is before start {start}")
        nbytes = end - start
        if nbytes > MAX_TENSOR_SIZE:
            raise self.fail(f"tensor {name!r}: {nbytes} bytes exceed the {MAX_TENSOR_SIZE}-byte limit")
        shape = tuple(shape)
        self._check_shape(name, dtype, shape, nbytes)
        return dtype, shape, start, end, param_id

    def _check_shape(self, name: str, dtype: dtypes.DType, shape: tuple[int, ...], nbytes: int) -> None:
        # numpy indexes with int64; a dimension or a product past it cannot be viewed.
        if any(d > I64_MAX for d in shape) or math.prod(d for d in shape if d) > I64_MAX:
            raise self.fail(f"tensor {name!r}: shape {list(shape)} overflows 64 bits")
        if dtype.itemsize is None:
            return
        expected = math.prod(shape) * dtype.itemsize
        if expected != nbytes:
            raise self.fail(
                f"tensor {name!r}: {nbytes} bytes on disk, but shape {list(shape)} of {dtype.name} "
                f"needs {expected}"
            )

    def _layout(self, metadata_size: int, descriptors: dict) -> tuple[str, int]:
        aligned = aligned_data_start(metadata_size)
        if not descriptors:
            return "aligned", aligned
        max_end = max(end for _, _, _, end, _ in descriptors.values())
        legacy = legacy_data_start(metadata_size)
        if self.size >= aligned + max_end:
            return "aligned", aligned
        if legacy != aligned and self.size == legacy + max_end:
            return "legacy", legacy
        worst = max(descriptors, key=lambda n: descriptors[n][3])
        raise self.fail(
            f"file truncated: tensor {worst!r} ends at byte {aligned + max_end}, "
            f"but the file has {self.size}"
        )


def _is_u64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX

