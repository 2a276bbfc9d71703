"""Errors a client can receive, one class per error code on the wire; and what the package's
other errors are told with: an exception quoted in a message, JSON that must hold an object.
"""

from __future__ import annotations

import json
from typing import Any

# Each wire error code and its class, filled in as the classes below name their codes.
ERRORS_BY_CODE: dict[str, type[RemoteError]] = {}


class WorkerpoolError(Exception):
    """Base of every error the client library raises."""


class RemoteError(WorkerpoolError):
    """The server answered with an error; ``code`` is the wire error code."""

    code = "internal"

    def __init_subclass__(cls, *, code: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            ERRORS_BY_CODE[code] = cls

    def __init__(self, message: str, *, worker_pid: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.worker_pid = worker_pid


class BadRequest(RemoteError, code="bad_request"):
    """The request was malformed or does not fit the model's input: fix it before retrying."""


class Overloaded(RemoteError, code="overloaded"):
    """The server's queue is full; retry later or add workers."""


class DeadlineExceeded(RemoteError, code="deadline_exceeded"):
    """The request's deadline passed before a worker could take it."""


class WorkerFailed(RemoteError, code="worker_failed"):
    """The worker running the request died, and so did the one retry."""


class RequestTimeout(RemoteError, code="request_timeout"):
    """The request ran past the server's --request-timeout; its worker was replaced."""


class ShuttingDown(RemoteError, code="shutting_down"):
    """The server is stopping and takes no new requests."""


class InternalError(RemoteError, code="internal"):
    """The model or the server failed unexpectedly while handling a valid request."""


def error_of_reply(header: dict[str, Any]) -> RemoteError:
    """The error an error reply's header carries: its code's class (an unknown code keeps its
    name on a plain ``RemoteError``); ``InternalError`` when it holds no error object."""
    error = header.get("error")
    worker_pid = header.get("worker_pid")
    if not isinstance(error, dict):
        return InternalError("malformed reply: error without an 'error' object", worker_pid=worker_pid)
    code = error.get("code")
    cls = ERRORS_BY_CODE.get(code, RemoteError) if isinstance(code, str) else RemoteError
    exc = cls(str(error.get("message", "")), worker_pid=worker_pid)
    if cls is RemoteError:
        exc.code = str(code)
    return exc


class Timeout(WorkerpoolError):
    """A connected server sent no reply within the client's timeout, after every retry."""


class Unreachable(WorkerpoolError, ConnectionError):
    """No workerpool server completed a ZeroMQ handshake in time; the message says what was
    seen instead (nothing listening, another program, keys the server refuses)."""


class ConnectionLost(WorkerpoolError, ConnectionError):
    """The connection to the server dropped while the request was in flight, and no server
    took the request back in time (or no retry was left)."""


def exception_text(exc: BaseException, *, named: bool = False, folded: bool = True) -> str:
    """``exc`` for a message that quotes it: its text on one line (``folded``) or as it is,
    after its class name when ``named`` or when it has no text."""
    text = " ".join(str(exc).split()) if folded else str(exc)
    return f"{type(exc).__name__}: {text}" if named else text or type(exc).__name__


class NotAJSONObject(ValueError):
    """JSON text that holds no object: ``found`` is the type of what it holds, None when it is
    not JSON at all (the message is then the decoder's)."""

    def __init__(self, message: str, found: str | None) -> None:
        super().__init__(message)
        self.found = found


def json_object(text: str | bytes) -> dict[str, Any]:
    """The object JSON ``text`` holds (a config, a control answer): else ``NotAJSONObject``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise NotAJSONObject(str(exc), None) from exc
    if not isinstance(value, dict):
        raise NotAJSONObject(f"a JSON {type(value).__name__}, not an object", type(value).__name__)
    return value
