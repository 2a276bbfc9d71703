"""Human-readable byte sizes, as users type them on the command line and read them in logs."""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
MS_PER_SECOND = 1000
MAX_SIZE = 1 << 62  # far beyond any machine; keeps every size a C long

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """``"512MiB"`` -> 536870912. Binary (KiB, MiB, GiB) and decimal (KB, MB, GB) units."""
    match = _SIZE.fullmatch(text)
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}: use a number with B, KiB, MiB, GiB, KB, MB or GB")
    value = float(match.group(1)) * _UNITS[unit]
    if not value <= MAX_SIZE:
        raise ValueError(f"size {text!r} is too large (at most {MAX_SIZE // GiB} GiB)")
    return int(value)


def format_size(nbytes: int) -> str:
    """``536870912`` -> ``"512.0 MiB"``."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = nbytes / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
