"""The protocol's version, its limits and its error: what every part of the wire shares."""

from __future__ import annotations

from typing import Any

from ..units import KiB, MiB

VERSION = 3  # 2: every request starts with a route frame (route.py); 3: it names the model, and texts travel in a frame
MAX_HEADER_BYTES = 64 * KiB
MAX_RANK = 32
MAX_ARRAYS = 64
# The most bytes an array's shape may span, each zero-size axis counted as one: beyond any
# address space (x86-64 user space is 2**47), and far below numpy's own 2**63 bound, so no
# product of sizes overflows anywhere, not even for an empty array with huge other axes.
MAX_EXTENT = 2**48
MAX_NESTING = 64  # far below the recursion limit, so an id read can always be re-encoded
MAX_TEXTS = 1024  # texts in one request; their bytes are bounded by the message's limit
# The least --max-message-size a server takes: a client sends a request up to this size before
# it has learnt the server's own limit, which the server states in its connections' metadata
# under LIMIT_PROPERTY (ZMTP handshake properties, read from any message it sends).
MIN_MESSAGE_SIZE = MiB
LIMIT_PROPERTY = "X-Max-Message-Size"

# The array dtypes the wire carries, as numpy's ``dtype.str`` spells them.
DTYPE_CODES = ("<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1")

METHOD_INFER = "infer"
METHOD_INFO = "info"
METHODS = (METHOD_INFER, METHOD_INFO)


class ProtocolError(ValueError):
    """A message does not follow the protocol; answered with a ``bad_request`` error.

    ``request_id`` is the id from the header when the header itself was readable, so that the
    error reply still names the request.
    """

    def __init__(self, message: str, request_id: Any = None) -> None:
        super().__init__(message)
        self.request_id = request_id
