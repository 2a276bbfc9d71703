"""Logging setup shared by the supervisor and its workers: one line per event, on stderr."""

from __future__ import annotations

import logging
import sys

LEVELS = ("debug", "info", "warning", "error")


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger("workerpool")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
