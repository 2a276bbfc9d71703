"""What the router holds of a client's request: the request (:class:`Request`), the parts of
it that workers run (:class:`Part`), and its answer once every part has one.

A request whose rows (its texts, or the rows of its one array when the model stacks rows) are
more than one forward pass takes (``--max-batch``) runs in parts, each a message of its own to
whichever worker is free, so that one large request uses every worker and each part is bounded
by ``--request-timeout`` alone. A part's rows are cut from the request's data frame without
decoding anything: an array's rows are a slice of its bytes, and the route frame gives each
text's length. A part is answered as a request is; the request is answered when its last part
is, for a ZeroMQ client with the parts' arrays joined into one reply
(:func:`~workerpool.protocol.messages.merge_replies`), for the HTTP front door with each part's
reply in order, which the front door joins. A part that fails answers the whole request with
its error, and what is left of it is dropped.

Every part of a request runs on one generation of its model's weights: the first part to run
pins it (``generation``), so that an answer never mixes two versions of a model. If no worker
of that generation is left (all moved on while the rest waited), the request starts again from
its first row (``restart``): replies of parts run before come back stale, and are dropped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from ..protocol import messages as protocol
from ..protocol.route import Form, Route, is_json
from .batching import BatchShape

ZMQ = "zmq"  # the route of a request from the ZeroMQ door (the HTTP door's name their route)
PART = struct.Struct("<II")  # the rows [start, stop) a message to a worker carries of its request
WHOLE = b""  # the part frame of a message that carries its whole request


@dataclass(eq=False)
class Request:
    """A request the router holds, queued or (some of it) running, until it is answered."""

    client: bytes
    frames: list[Any]  # the route frame, the header frame, then the array frames
    route: Route
    model: str  # the served model's name it runs on
    received: float
    size: int = 0  # bytes of the message, counted against the queue's byte limit
    shape: BatchShape | None = None  # how it batches; None: it goes alone
    rows: int = 1  # the rows (or texts) it brings to a pass, which its parts are cut from
    expires: float | None = None
    taken: int = 0  # rows handed out to parts so far
    answered: list[tuple[int, list[Any]]] = field(default_factory=list)  # (first row, reply) of its parts
    answered_rows: int = 0
    generation: int | None = None  # the generation its parts run on, once one ran
    epoch: int = 0  # counts restarts: a part of an earlier epoch is stale
    done: bool = False  # answered, or given up
    split: bool = False  # runs in parts
    api: str = ZMQ  # the door and route it came by, for the counts and the access log
    started: float | None = None  # when its first part went to a worker
    worker: int | None = None  # the pid of the worker its last part went to
    _offsets: list[int] | None = None

    @property
    def id(self) -> Any:
        """The request's id, for an error reply or an access line: the router decodes its
        header for nothing else."""
        return request_id_of(self.frames)

    def expired(self, now: float) -> bool:
        """Whether its deadline passed while it waited to start: a request in parts of which
        one has been handed out runs to its end (what ran would be lost)."""
        return self.expires is not None and now >= self.expires and not (self.split and self.taken)

    @property
    def waiting(self) -> bool:
        """Whether rows of it are still to be handed to a worker."""
        return self.taken < self.rows

    def next_rows(self, most: int) -> int:
        """The rows its next part takes: at most ``most`` when it is split, else all of it."""
        return min(self.rows - self.taken, most) if self.split else self.rows

    def take(self, most: int) -> Part:
        """Its next part: the next ``next_rows(most)`` rows."""
        start = self.taken
        self.taken += self.next_rows(most)
        return Part(self, start, self.taken, self.epoch)

    def restart(self) -> None:
        """Run it again from its first row, on whatever generation its first part meets."""
        self.epoch += 1
        self.taken = self.answered_rows = 0
        self.answered.clear()
        self.generation = None

    def part_frames(self, part: Part) -> list[Any]:
        """A part's frames for a worker's message: the part frame, then the request's frames
        with its data cut to the part's rows."""
        if not self.split:
            return [WHOLE, *self.frames]
        data = protocol.buffer_of(self.frames[2])
        if self.route.form == Form.TEXTS:
            if self._offsets is None:
                self._offsets = self.route.text_offsets()
            cut = data[self._offsets[part.start]:self._offsets[part.stop]]
        else:  # an array's rows are its bytes in equal slices
            width = data.nbytes // self.route.first_axis()
            cut = data[part.start * width:part.stop * width]
        return [PART.pack(part.start, part.stop), self.frames[0], self.frames[1], cut]

    def answer(self, part: Part, reply: list[Any], *, joined: bool) -> list[Any] | None:
        """Take a part's reply; the request's reply once every part has one (None until then).
        ``joined``: the arrays of the parts' replies are put in one reply (a ZeroMQ client);
        else the replies follow each other (the HTTP front door joins them)."""
        if not self.split:
            return reply
        self.answered.append((part.start, reply))
        self.answered_rows += part.stop - part.start
        if self.answered_rows < self.rows:
            return None
        replies = [reply for _, reply in sorted(self.answered, key=lambda answered: answered[0])]
        self.answered.clear()
        if not joined:
            return [frame for reply in replies for frame in reply]
        return protocol.merge_replies(replies)


@dataclass(eq=False)
class Part:
    """Rows [start, stop) of a request, run by one worker; the whole of it when not split."""

    request: Request
    start: int
    stop: int
    epoch: int
    attempts: int = 0
    solo: bool = False  # sent alone from now on: it was in flight on a worker that was lost

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def stale(self) -> bool:
        """Whether its request was answered, or started again, since it was cut."""
        return self.request.done or self.epoch != self.request.epoch


def message_for(model: str, batch: list[Part]) -> list[Any]:
    """A worker's message that hands it ``batch``, parts of requests for ``model``."""
    return protocol.work_message(model, [[part.request.client, *part.request.part_frames(part)] for part in batch])


def request_id_of(frames: list[Any]) -> Any:
    """The id of a request (route frame, header, arrays), best effort: None when its header
    cannot be read."""
    return header_of(frames).get("id")


def header_of(frames: list[Any]) -> dict[str, Any]:
    """The header of a request (route frame, header, arrays), best effort: empty when it cannot
    be read. A protocol version 1 request has its header where the route frame is."""
    if not frames:
        return {}
    frame = frames[0] if is_json(bytes(memoryview(frames[0])[:3])) else frames[1] if len(frames) > 1 else None
    try:
        return {} if frame is None else protocol.decode_header(frame)
    except protocol.ProtocolError:
        return {}
