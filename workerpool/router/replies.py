"""The answers the router sends clients, counted by model, route and outcome: the one place an
answer leaves the router's core (into its outbox), so that every answer is counted once. A
ZeroMQ client's answer gets its access line here; an answer to the HTTP door's lane carries
what the router measured of it (:class:`~workerpool.logs.Ran`) to the door, which writes the
line with the HTTP status."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ..errors import ErrorCode
from ..logs import REQUEST_ID, AccessLog, Ran, RequestIds
from ..protocol import messages as protocol
from .outbox import Outbox
from .requests import ZMQ, Request, header_of
from .stats import LATENCY_BUCKETS, Histogram

UNKNOWN_MODEL = ""  # the model label of an answer to a request whose model is not served
OK = "ok"


class Replies:
    """Sends answers through ``outbox``; ``outcomes`` counts them by (model, route, ``ok`` or
    code), ``route`` being ``zmq`` or the HTTP route's name (from the route table, never a
    client's words); ``durations`` holds, by (model, route), the seconds from each request's
    arrival to its answer."""

    def __init__(self, outbox: Outbox, access: AccessLog | None = None) -> None:
        self.outbox = outbox
        self.access = access or AccessLog(on=False)
        self.outcomes: Counter[tuple[str, str, str]] = Counter()
        self.durations: dict[tuple[str, str], Histogram] = {}
        self._ids = RequestIds()

    def send(self, client: bytes, frames: list[Any], model: str, outcome: str, *, api: str = ZMQ,
             request: Request | None = None, sent: list[Any] | None = None,
             header: dict[str, Any] | None = None) -> None:
        """Answer ``client``'s ``request`` with ``frames``; or, for a request not taken in,
        what it ``sent`` past the delimiter (``header``: its header, when already read)."""
        self.count(model, outcome, api)
        now = time.monotonic()
        if request is not None:
            durations = self.durations.get((model, api))
            if durations is None:
                durations = self.durations[(model, api)] = Histogram(LATENCY_BUCKETS)
            durations.observe(now - request.received)
        if api != ZMQ:  # the HTTP door's lane: the door writes the access line
            self.outbox.to_client(client, frames, _ran(outcome, request, now))
            return
        self.outbox.to_client(client, frames)
        if self.access.wanted(outcome != OK):
            sent = request.frames if request is not None else sent or []
            self._write(frames, model, outcome, request, sent, header_of(sent) if header is None else header, now)

    def count(self, model: str, outcome: str, api: str = ZMQ) -> None:
        """Count an answer: one sent here, or one the HTTP front door gave itself."""
        self.outcomes[(model, api, outcome)] += 1

    def error(self, client: bytes, sent: list[Any], code: ErrorCode, message: str,
              model: str = UNKNOWN_MODEL, *, api: str = ZMQ) -> None:
        """Answer a request not taken in (``sent``: what it sent past the delimiter)."""
        header = header_of(sent)
        self.send(client, protocol.encode_error(header.get("id"), code, message), model, code, api=api, sent=sent,
                  header=header)

    def _write(self, frames: list[Any], model: str, outcome: str, request: Request | None, sent: list[Any],
               header: dict[str, Any], now: float) -> None:
        method = header.get("method")
        request_id = header.get("id")
        if request_id is None:
            shown = self._ids.make()
        elif isinstance(request_id, str) and REQUEST_ID.fullmatch(request_id):
            shown = request_id
        else:  # a number, an object, or a string a log line must not carry as it is
            shown = ascii(request_id)[:128]
        status = 200 if outcome == OK else ErrorCode.read(outcome.encode()).http_status  # as HTTP would answer
        self.access.write(ZMQ, method if method in protocol.METHODS else "-", model=model, status=status,
                          ran=_ran(outcome, request, now), size_in=sum(len(frame) for frame in sent),
                          size_out=sum(len(frame) for frame in frames), request_id=shown)


def _ran(outcome: str, request: Request | None, now: float) -> Ran:
    if request is None:
        return Ran(outcome)
    if request.started is None:  # it never left the queue
        return Ran(outcome, now - request.received)
    return Ran(outcome, request.started - request.received, now - request.started, request.worker)
