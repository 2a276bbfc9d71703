"""The line a pool prints on stdout once every worker is ready: its readiness signal.

``serve`` and ``workers`` write it here and workerpool.testing (tests, benchmarks, users' scripts)
reads it here, so the two can never disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SERVE_READY_PREFIX = "workerpool: serving "

_SERVE_READY = re.compile(
    re.escape(SERVE_READY_PREFIX)
    + r"(?P<path>.+) \((?P<size>[^,()]+), models? (?P<model>.+)\)"
    r" with (?P<workers>\d+) workers? on (?P<endpoint>\S+)"
)
_WORKERS_READY = re.compile(
    r"workerpool: (?P<workers>\d+) workers? for (?P<path>.+) \((?P<size>[^,()]+),"
    r" model (?P<model>.+)\) serving through (?P<endpoint>\S+)"
)


@dataclass(frozen=True)
class Ready:
    """What a ready line says. ``endpoint``: where clients connect (``serve``), or the router
    backend the workers connect to (``workers``)."""

    path: str
    size: str
    model: str
    workers: int
    endpoint: str


def serve_line(path: str, size: str, model: str, workers: int, endpoint: str) -> str:
    """The ready line of ``serve``: ``path`` is the one file served, or ``NAME=PATH, ...`` for
    several; ``model`` the kinds of the models (``mlp``, or ``bert, mlp``)."""
    plural = "s" if ", " in model else ""
    return (f"{SERVE_READY_PREFIX}{path} ({size}, model{plural} {model}) with {worker_count(workers)} "
            f"on {endpoint}")



def workers_line(path: str, size: str, model: str, workers: int, connect: str) -> str:
    return (f"workerpool: {worker_count(workers)} for {path} ({size}, model {model}) serving "
            f"through {connect}")


def worker_count(count: int) -> str:
    """``1 worker``, ``8 workers``: as both lines (and their patterns) say it."""
    return f"{count} worker{'' if count == 1 else 's'}"


def parse_ready_line(line: str) -> Ready | None:
    """The fields of a ``serve`` or ``workers`` ready line; None for any other line."""
    for pattern in (_SERVE_READY, _WORKERS_READY):
        match = pattern.fullmatch(line.rstrip("\r\n"))
        if match is not None:
            workers = int(match["workers"])
            return Ready(match["path"], match["size"], match["model"], workers, match["endpoint"])
    return None
