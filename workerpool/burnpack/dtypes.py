"""Burn's element types and their numpy equivalents.

Burn serialises its ``DType`` enum with serde: unit variants are text (``"F32"``), newtype
variants are one-entry maps (``{"Bool": "Native"}``, ``{"QFloat": {...}}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .layout import BurnpackError


@dataclass(frozen=True)
class DType:
    """One Burn element type.

    ``numpy`` is the dtype of the zero-copy view handed out for it: the exact equivalent where
    numpy has one, ``<u2`` for BF16 (see :func:`bf16_to_float32`) and raw ``u1`` bytes for
    QFloat, whose byte length is not ``prod(shape) * itemsize``.
    """

    name: str
    numpy: np.dtype
    exact: bool = True
    scheme: Any = field(default=None, compare=False)

    @property
    def itemsize(self) -> int | None:
        """Bytes per element, or None for QFloat (its length comes from the quant scheme)."""
        return None if self.name == "QFloat" else self.numpy.itemsize

    def to_cbor(self) -> Any:
        """The value Burn's serde encoding writes for this dtype."""
        if self.name.startswith("Bool("):
            return {"Bool": self.name[5:-1]}
        if self.name == "QFloat":
            return {"QFloat": self.scheme}
        return self.name


_UNIT_TYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "Flex32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
}
_BOOL_STORES = {"Native": "?", "U8": "u1", "U32": "<u4"}

BY_NAME: dict[str, DType] = {
    name: DType(name, np.dtype(code), exact=name not in ("BF16", "Flex32"))
    for name, code in _UNIT_TYPES.items()
}
BY_NAME.update(
    {f"Bool({store})": DType(f"Bool({store})", np.dtype(code)) for store, code in _BOOL_STORES.items()}
)

_FROM_NUMPY = {
    np.dtype(code): BY_NAME[name]
    for name, code in _UNIT_TYPES.items()
    if name not in ("BF16", "Flex32")
}
_FROM_NUMPY[np.dtype("?")] = BY_NAME["Bool(Native)"]

_QUANT_VALUES = {"Q8F", "E5M2", "E4M3", "Q4F", "E2M1", "Q2F", "Q8S", "Q4S", "Q2S"}
_QUANT_MODES = {"Symmetric", "Lookup"}
_SCALE_DTYPES = {"F32", "F16", "BF16", "UE8M0", "UE4M3"}


def qfloat(scheme: dict) -> DType:
    """The QFloat dtype for a quantization scheme (as Burn encodes ``QuantScheme``)."""
    _check_quant_scheme(scheme)
    return DType("QFloat", np.dtype("u1"), exact=False, scheme=scheme)


def from_numpy(dtype: np.dtype) -> DType:
    """The Burn dtype a numpy array of this dtype is written as."""
    try:
        return _FROM_NUMPY[np.dtype(dtype).newbyteorder("<")]
    except KeyError:
        raise BurnpackError(f"numpy dtype {np.dtype(dtype)} has no Burnpack equivalent") from None


def from_cbor(value: Any) -> DType:
    """Decode a descriptor's ``dtype`` field; raise ValueError on anything Burn would refuse."""
    if isinstance(value, str):
        if value in BY_NAME:
            return BY_NAME[value]
        if value == "Bool":  # Burn <= 0.20 wrote Bool as a unit variant
            return BY_NAME["Bool(Native)"]
        raise ValueError(f"unknown dtype {value!r}")
    if isinstance(value, dict) and len(value) == 1:
        ((variant, inner),) = value.items()
        if variant == "Bool" and isinstance(inner, str) and inner in _BOOL_STORES:
            return BY_NAME[f"Bool({inner})"]
        if variant == "QFloat" and isinstance(inner, dict):
            return qfloat(inner)
    raise ValueError(f"unknown dtype {_short(value)}")


def _check_quant_scheme(scheme: Any) -> None:
    if not isinstance(scheme, dict):
        raise ValueError("QFloat scheme is not a map")  # noqa: TRY004 - a malformed file, not a caller's bug
    missing = {"value", "store", "mode"} - scheme.keys()
    if missing:
        raise ValueError(f"QFloat scheme lacks {', '.join(sorted(missing))}")
    if not _is_one_of(scheme["value"], _QUANT_VALUES):
        raise ValueError(f"QFloat scheme has unknown value {_short(scheme['value'])}")
    if not _is_one_of(scheme["mode"], _QUANT_MODES):
        raise ValueError(f"QFloat scheme has unknown mode {_short(scheme['mode'])}")
    store = scheme["store"]
    packed = (
        isinstance(store, dict)
        and len(store) == 1
        and next(iter(store)) in ("PackedNative", "PackedU32")
        and _is_uint(next(iter(store.values())))
    )
    if store != "Native" and not packed:
        raise ValueError(f"QFloat scheme has unknown store {_short(store)}")
    tensor_scale = scheme.get("tensor")
    if tensor_scale is not None and not _is_one_of(tensor_scale, _SCALE_DTYPES):
        raise ValueError(f"QFloat scheme has unknown scale dtype {_short(tensor_scale)}")


def _is_one_of(value: Any, names: set[str]) -> bool:
    # Decoded CBOR may be a list or dict here, which a set lookup would refuse with TypeError.
    return isinstance(value, str) and value in names


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def bf16_to_float32(values: np.ndarray) -> np.ndarray:
    """Widen a BF16 tensor (its ``uint16`` view) to float32.

    This copies: the result is a new array of twice the size, not a view of the mapping.
    """
    widened = np.asarray(values, dtype="<u2").astype("<u4") << 16
    return widened.view("<f4")
