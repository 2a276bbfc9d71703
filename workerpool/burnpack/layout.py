"""Constants and byte-layout arithmetic of the Burnpack container (see docs: burnpack-format)."""

from __future__ import annotations

import struct


class BurnpackError(Exception):
    """A Burnpack file is missing, unreadable, malformed, or cannot be written.

    The message is one line that names the file and the problem.
    """


MAGIC = 0x4255524E
FORMAT_VERSION = 1
HEADER_SIZE = 10
HEADER = struct.Struct("<IHI")
TENSOR_ALIGNMENT = 256

# Burn's reader limits (burn-pack, 64-bit targets); we refuse what Burn refuses.
MAX_METADATA_SIZE = 100 * 1024 * 1024
MAX_TENSOR_COUNT = 100_000
MAX_TENSOR_SIZE = 10 * 1024**3
MAX_CBOR_DEPTH = 128
MAX_FILE_SIZE = 100 * 1024**3

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def align_up(value: int, alignment: int = TENSOR_ALIGNMENT) -> int:
    return -(-value // alignment) * alignment


def aligned_data_start(metadata_size: int) -> int:
    """Where Burn >= 0.20 starts the data section: the header and metadata rounded up to 256."""
    return align_up(HEADER_SIZE + metadata_size)


def legacy_data_start(metadata_size: int) -> int:
    """Where Burn 0.19 started the data section: right after the metadata, unpadded."""
    return HEADER_SIZE + metadata_size
