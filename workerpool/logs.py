"""Logging setup shared by the supervisor and its workers: one line per event, on stderr.

``text`` is for people; ``json`` is one JSON object per line for log collectors, with the time,
level, logger, message, pid and, where the event knows them, ``worker``, ``generation`` and
``request_id`` (passed as ``extra``). The format travels to the template and the workers in
the environment (``WORKERPOOL_LOG_FORMAT``), which is also how an operator may set it.

The access log (:class:`AccessLog`) is one line per answered request, from whichever door
answered it: the router writes the ZeroMQ door's as it answers (``router/replies.py``), the
HTTP door's connection writes its own with the status and what the router measured of a
request it ran (:class:`Ran`). A line names the door, the route (HTTP) or method (ZeroMQ), the
model, the status (a ZeroMQ answer's as HTTP would give it) and error code, the bytes in and
out, the time the request waited and ran, the worker that answered and the request's id; in
JSON each is a key too. Lines are written in the log format of the rest, as from the logger
``workerpool.access`` at INFO, whatever ``--log-level`` says. Errors (an HTTP status of 400 or
more, a ZeroMQ error code) are always written; of the requests answered well, the share
``--access-log-sample``, counted, not drawn at random.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from .units import MS_PER_SECOND

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
FORMAT_ENV = "WORKERPOOL_LOG_FORMAT"
FIELDS = ("worker", "generation", "request_id")  # extras a log call may name
ACCESS_LOGGER = "workerpool.access"  # the name the access log's lines go by, whatever --log-level says


class JsonFormatter(logging.Formatter):
    """One JSON object per record; an exception's traceback goes in ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": utc_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        entry.update({name: getattr(record, name) for name in FIELDS if hasattr(record, name)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def utc_time(seconds: float) -> str:
    """A JSON line's time: UTC, to the millisecond."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"


def setup_logging(level: str, log_format: str | None = None) -> None:
    """Log ``level`` and up to stderr, in ``log_format`` (default: from the environment, else
    text); the chosen format is left in the environment for the processes started later."""
    log_format = log_format or os.environ.get(FORMAT_ENV, "text")
    if log_format not in FORMATS:
        log_format = "text"
    os.environ[FORMAT_ENV] = log_format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json"
        else logging.Formatter("%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger("workerpool")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.captureWarnings(True)  # a model's warnings, in the same format
    warnings = logging.getLogger("py.warnings")
    warnings.handlers[:] = [handler]
    warnings.propagate = False


class Throttle:
    """At most one line per kind every ``interval`` seconds: a flood of refusals is worth a
    warning now and then, with its count so far, not one per refusal."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}

    def due(self, kind: str = "") -> bool:
        """Whether a line of ``kind`` may be logged now (then it counts as logged)."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            return False
        self._last[kind] = now
        return True


REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # what a request id may be: visible ASCII, at most 128


@dataclass(frozen=True, slots=True)
class Ran:
    """What the router measured of a request it answered: its outcome (``ok`` or the error
    code), seconds waiting for a worker and running (None: it never reached one) and the
    worker that answered (its pid, None: none did)."""

    outcome: str
    queued: float | None = None
    ran: float | None = None
    worker: int | None = None


class RequestIds:
    """Ids for requests that bring none: this process's random prefix and a count, unique
    without a system call per request."""

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex()
        self._count = itertools.count(1)

    def make(self) -> str:
        return f"{self._prefix}-{next(self._count):x}"

    def chosen(self, given: str | None) -> str:
        """``given`` (a client's ``X-Request-Id``) when it is a fit id, else a new one."""
        return given if given is not None and REQUEST_ID.fullmatch(given) else self.make()


class AccessLog:
    """Access lines: every error, and of the successes a share ``sample`` of them, counted
    (with ``on`` false, none at all, errors included). Lines are held until :meth:`flush`,
    which the supervisor's loop calls after each turn: one write for the lines of a turn, not
    a call into ``logging`` and a write for each. ``log_format``: as the other lines (default:
    the environment's, which :func:`setup_logging` set); ``stream``: default stderr."""

    def __init__(self, *, on: bool = True, sample: float = 1.0, log_format: str | None = None,
                 stream: TextIO | None = None) -> None:
        self.on = on
        self.sample = sample
        self.json = (log_format or os.environ.get(FORMAT_ENV)) == "json"
        self._credit = 0.0  # a success gets a line once a whole one is earned
        self._lines: list[str] = []
        self._stream = stream
        self._pid = os.getpid()

    def wanted(self, error: bool) -> bool:
        """Whether the next answer gets a line (a success earns ``sample`` of one)."""
        if not self.on:
            return False
        if error:
            return True
        self._credit += self.sample
        if self._credit < 1.0 - 1e-9:  # sums of tenths fall short of 1 by a rounding
            return False
        self._credit -= 1.0
        return True

    def write(self, door: str, route: str, *, model: str, status: int, ran: Ran, size_in: int,
              size_out: int, request_id: str) -> None:
        """One line, for a request :meth:`wanted` chose."""
        queued, run, now = _ms(ran.queued), _ms(ran.ran), time.time()
        message = (f"{door} {route} {status} model={model or '-'} code={ran.outcome} in={size_in} out={size_out} "
                   f"queue_ms={_text(queued)} run_ms={_text(run)} worker={_text(ran.worker)} id={request_id}")
        if self.json:
            self._lines.append(json.dumps({
                "time": utc_time(now), "level": "info", "logger": ACCESS_LOGGER, "message": message,
                "pid": self._pid, "door": door, "route": route, "model": model or None, "status": status,
                "code": ran.outcome, "bytes_in": size_in, "bytes_out": size_out, "queue_ms": queued,
                "run_ms": run, "worker": ran.worker, "request_id": request_id}))
        else:
            local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            self._lines.append(f"{local},{int(now % 1 * 1000):03d} [{self._pid}] INFO {ACCESS_LOGGER}: {message}")

    def flush(self) -> None:
        """Write the lines held; lost when stderr is gone (serving goes on)."""
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        stream = self._stream or sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * MS_PER_SECOND, 3)


def _text(value: object) -> str:
    return "-" if value is None else str(value)
