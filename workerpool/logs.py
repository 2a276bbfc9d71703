"""Logging setup shared by the supervisor and its workers: one line per event, on stderr.

``text`` is for people; ``json`` is one JSON object per line for log collectors, with the time,
level, logger, message, pid and, where the event knows them, ``worker``, ``generation`` and
``request_id`` (passed as ``extra``). The format travels to the template and the workers in
the environment (``WORKERPOOL_LOG_FORMAT``), which is also how an operator may set it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
FORMAT_ENV = "WORKERPOOL_LOG_FORMAT"
FIELDS = ("worker", "generation", "request_id")  # extras a log call may name


class JsonFormatter(logging.Formatter):
    """One JSON object per record; an exception's traceback goes in ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        entry.update({name: getattr(record, name) for name in FIELDS if hasattr(record, name)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


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
