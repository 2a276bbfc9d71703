"""How a message crosses a local link (``link.py``): records of a ``SOCK_SEQPACKET`` socket.

A message is the list of frames ZeroMQ would carry as one multipart message. It travels as
one record: a table (the frame count, then each frame's length, little-endian uint32s) and
the frames after it, gathered by one ``sendmsg`` from where they lie. A message longer than
a record may be (the socket's send buffer bounds it) goes on in the records that follow: the
table says how many bytes are to come, so no record needs a flag. A reader allocates a
message whole up to 16 MiB and reads its records in place; past that, its buffer grows with
the records that really came, never with what a table claims.

Nothing here touches a socket: the link's tests and the router's run the codec on its own.
"""

from __future__ import annotations

import builtins
import struct
from collections.abc import Sequence
from typing import Any

from ..units import KiB
from .arrays import buffer_of

RECORD_BYTES = 256 * KiB  # the most a record carries: room for any reader's buffer
COUNT = struct.Struct("<I")
LENGTH_BYTES = 4


class LinkError(ValueError):
    """A record that is no message of the link: the link is closed, its worker lost."""


class Frame:
    """A received frame: its bytes as a memoryview, read the way a ``zmq.Frame`` is read."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer

    @property
    def bytes(self) -> builtins.bytes:
        return self.buffer.tobytes()

    def __bytes__(self) -> builtins.bytes:
        return self.buffer.tobytes()

    def __len__(self) -> int:
        return self.buffer.nbytes


def records(frames: Sequence[Any], record_bytes: int = RECORD_BYTES) -> list[list[Any]]:
    """The records that carry ``frames`` (bytes, buffers, ``zmq.Frame``s or :class:`Frame`s),
    each a list of buffers for one ``sendmsg``: one record unless the message is longer than
    ``record_bytes``."""
    parts = [part if isinstance(part, bytes) else _flat(part) for part in frames]
    lengths = [len(part) if isinstance(part, bytes) else part.nbytes for part in parts]
    table = struct.pack(f"<{len(lengths) + 1}I", len(lengths), *lengths)
    if len(table) > record_bytes:
        raise LinkError(f"a message of {len(lengths)} frames: its table does not fit a record")
    if len(table) + sum(lengths) <= record_bytes:
        return [[table, *parts]]
    return _cut([memoryview(table), *(memoryview(part) for part in parts)], record_bytes)


def _flat(part: Any) -> memoryview:
    """``part``'s bytes as a flat byte view (a numpy array's as much as a frame's)."""
    view = buffer_of(part)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _cut(parts: list[memoryview], record_bytes: int) -> list[list[Any]]:
    """``parts`` laid end to end and cut every ``record_bytes``."""
    cut: list[list[Any]] = [[]]
    room = record_bytes
    for part in parts:
        while part.nbytes:
            if not room:
                cut.append([])
                room = record_bytes
            piece = part[:room]
            cut[-1].append(piece)
            room -= piece.nbytes
            part = part[piece.nbytes:]
    return cut


def read_table(record: memoryview, max_frames: int | None = None) -> tuple[list[int], int]:
    """The frame lengths a message's first record declares, and where its frames begin.

    ``max_frames`` bounds the count (what the reader takes from that peer); the table must lie
    whole in the record. Raises :class:`LinkError`.
    """
    if record.nbytes < COUNT.size:
        raise LinkError(f"a record of {record.nbytes} bytes is shorter than a frame count")
    (count,) = COUNT.unpack_from(record)
    if not count:
        raise LinkError("a message of no frames")
    if max_frames is not None and count > max_frames:
        raise LinkError(f"a message of {count} frames, over the {max_frames} taken")
    start = COUNT.size + LENGTH_BYTES * count
    if start > record.nbytes:
        raise LinkError(f"a table of {count} frames is longer than its record ({record.nbytes} bytes)")
    return list(struct.unpack_from(f"<{count}I", record, COUNT.size)), start


def frames_of(data: memoryview, lengths: Sequence[int]) -> list[Frame]:
    """``data`` (exactly the frames' bytes) cut into its frames."""
    frames, offset = [], 0
    for length in lengths:
        frames.append(Frame(data[offset:offset + length]))
        offset += length
    return frames
