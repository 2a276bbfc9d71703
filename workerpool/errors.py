"""The one error taxonomy: every wire error code with its HTTP status (:class:`ErrorCode`),
the error a client receives for each, one class per code; and what the package's other errors
are told with: an exception quoted in a message, JSON that must hold an object.

Worker, router, clients and the HTTP front door all speak these codes: a worker puts its
error's code in the status frame of its reply, so the router counts errors without decoding them.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Self


class ErrorCode(enum.StrEnum):
    """A wire error code; ``http_status`` is what the HTTP front door answers it with."""

    BAD_REQUEST = "bad_request", 400
    MODEL_NOT_FOUND = "model_not_found", 404
    OVERLOADED = "overloaded", 429
    SHUTTING_DOWN = "shutting_down", 503
    DEADLINE_EXCEEDED = "deadline_exceeded", 504
    REQUEST_TIMEOUT = "request_timeout", 504
    WORKER_FAILED = "worker_failed", 500
    INTERNAL = "internal", 500

    http_status: int

    def __new__(cls, value: str, http_status: int) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.http_status = http_status
        return member

    @classmethod
    def read(cls, status: bytes) -> ErrorCode:
        """The code of a worker's reply status frame that is not ``ok``; ``INTERNAL`` for one
        this version does not know (a worker host is outside: its word is not trusted)."""
        code = cls._value2member_map_.get(status.decode("ascii", "replace"))
        return code if isinstance(code, ErrorCode) else cls.INTERNAL


# Each wire error code and its class, filled in as the classes below name their codes.
ERRORS_BY_CODE: dict[str, type[RemoteError]] = {}


class WorkerpoolError(Exception):
    """Base of every error the client library raises."""


class RemoteError(WorkerpoolError):
    """The server answered with an error; ``code`` is the wire error code."""

    code: str = ErrorCode.INTERNAL

    def __init_subclass__(cls, *, code: ErrorCode | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            ERRORS_BY_CODE[code] = cls

    def __init__(self, message: str, *, worker_pid: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.worker_pid = worker_pid


class BadRequest(RemoteError, code=ErrorCode.BAD_REQUEST):
    """The request was malformed or does not fit the model's input: fix it before retrying."""


class RequestTooLarge(BadRequest):
    """The request is larger than the server's --max-message-size: it was never sent. Send
    fewer rows per request, or raise the server's limit."""


class Overloaded(RemoteError, code=ErrorCode.OVERLOADED):
    """The server's queue is full; retry later or add workers."""


class DeadlineExceeded(RemoteError, code=ErrorCode.DEADLINE_EXCEEDED):
    """The request's deadline passed before a worker could take it."""


class ModelNotFound(RemoteError, code=ErrorCode.MODEL_NOT_FOUND):
    """No model of that name, or not that version, is served there."""


class WorkerFailed(RemoteError, code=ErrorCode.WORKER_FAILED):
    """The worker running the request died, and so did the one retry."""


class RequestTimeout(RemoteError, code=ErrorCode.REQUEST_TIMEOUT):
    """The request ran past the server's --request-timeout; its worker was replaced."""


class ShuttingDown(RemoteError, code=ErrorCode.SHUTTING_DOWN):
    """The server is stopping and takes no new requests."""


class InternalError(RemoteError, code=ErrorCode.INTERNAL):
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
