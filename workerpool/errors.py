"""Errors a client can receive, one class per error code on the wire."""

from __future__ import annotations


class WorkerpoolError(Exception):
    """Base of every error the client library raises."""


class RemoteError(WorkerpoolError):
    """The server answered with an error; ``code`` is the wire error code."""

    code = "internal"

    def __init__(self, message: str, *, worker_pid: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.worker_pid = worker_pid


class BadRequest(RemoteError):
    """The request was malformed or does not fit the model's input: fix it before retrying."""

    code = "bad_request"


class Overloaded(RemoteError):
    """The server's queue is full; retry later or add workers."""

    code = "overloaded"


class DeadlineExceeded(RemoteError):
    """The request's deadline passed before a worker could take it."""

    code = "deadline_exceeded"


class WorkerFailed(RemoteError):
    """The worker running the request died, and so did the one retry."""

    code = "worker_failed"


class RequestTimeout(RemoteError):
    """The request ran past the server's --request-timeout; its worker was replaced."""

    code = "request_timeout"


class ShuttingDown(RemoteError):
    """The server is stopping and takes no new requests."""

    code = "shutting_down"


class InternalError(RemoteError):
    """The model or the server failed unexpectedly while handling a valid request."""

    code = "internal"


class Timeout(WorkerpoolError):
    """A connected server sent no reply within the client's timeout, after every retry."""


class Unreachable(WorkerpoolError, ConnectionError):
    """No workerpool server completed a ZeroMQ handshake in time; the message says what was
    seen instead (nothing listening, another program, keys the server refuses)."""


class ConnectionLost(WorkerpoolError, ConnectionError):
    """The connection to the server dropped while the request was in flight, and no server
    took the request back in time (or no retry was left)."""


ERRORS_BY_CODE: dict[str, type[RemoteError]] = {
    cls.code: cls
    for cls in (BadRequest, Overloaded, DeadlineExceeded, WorkerFailed, RequestTimeout, ShuttingDown,
                InternalError)
}
