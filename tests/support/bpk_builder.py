"""Hand-build raw Burnpack bytes, including malformed ones, without going through the writer.

The writer only produces valid files; the reader tests need files with every kind of defect
(bad header fields, hostile CBOR, broken descriptors, legacy layout), so they are assembled
here from their parts.
"""

from __future__ import annotations

from typing import Any

import cbor2

from workerpool.burnpack.layout import FORMAT_VERSION, HEADER, MAGIC, align_up


def descriptor(
    dtype: Any = "F32",
    shape: Any = (1,),
    offsets: Any = None,
    start: int = 0,
    param_id: int | None = None,
) -> dict[str, Any]:
    """A tensor descriptor in Burn's key order; offsets default to an F32 tensor at ``start``.

    Tuples become CBOR arrays; anything else (an int, a string) is encoded as given.
    """
    if offsets is None:
        count = 1
        for dim in shape:
            count *= dim
        offsets = (start, start + 4 * count)
    entry: dict[str, Any] = {
        "dtype": dtype,
        "shape": _array(shape),
        "data_offsets": _array(offsets),
    }
    if param_id is not None:
        entry["param_id"] = param_id
    return entry


def _array(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def header(metadata_size: int, *, magic: int = MAGIC, version: int = FORMAT_VERSION) -> bytes:
    return HEADER.pack(magic, version, metadata_size)


def build(
    metadata: Any = None,
    data: bytes = b"",
    *,
    magic: int = MAGIC,
    version: int = FORMAT_VERSION,
    metadata_size: int | None = None,
    legacy: bool = False,
) -> bytes:
    """Header + metadata + padding + data.

    ``metadata`` is a Python value encoded with ``cbor2.dumps`` (dict order kept, like Burn),
    or raw ``bytes`` used verbatim; None means an empty pack. ``metadata_size`` overrides the
    header field (the padding still follows the real blob). ``legacy`` omits the padding, as
    Burn 0.19 did.
    """
    if metadata is None:
        metadata = {"tensors": {}}
    blob = metadata if isinstance(metadata, (bytes, bytearray)) else cbor2.dumps(metadata)
    size = len(blob) if metadata_size is None else metadata_size
    head = header(size, magic=magic, version=version) + bytes(blob)
    if not legacy:
        head += bytes(align_up(len(head)) - len(head))
    return head + data


def pack_f32(tensors: dict[str, list[float]], **kwargs: Any) -> bytes:
    """A valid aligned file of 1-D F32 tensors, laid out like Burn's writer (256-aligned)."""
    import numpy as np

    descriptors, data = {}, b""
    for name, values in tensors.items():
        payload = np.asarray(values, dtype="<f4").tobytes()
        start = align_up(len(data))
        data += bytes(start - len(data)) + payload
        descriptors[name] = descriptor("F32", [len(values)], (start, start + len(payload)))
    return build({"tensors": dict(sorted(descriptors.items()))}, data, **kwargs)


# CBOR heads, for writing hostile items without building them in memory.
def cbor_head(major: int, argument: int) -> bytes:
    """The head of a CBOR item: major type 0-7 and its argument, in the shortest form."""
    if argument < 24:
        return bytes([major << 5 | argument])
    for code, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if argument < 1 << (8 * width):
            return bytes([major << 5 | code]) + argument.to_bytes(width, "big")
    raise ValueError(f"CBOR argument {argument} does not fit in 64 bits")


def cbor_text(text: str) -> bytes:
    raw = text.encode()
    return cbor_head(3, len(raw)) + raw
