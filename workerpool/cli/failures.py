"""How a failure reaches the user: one line, ``workerpool: error: <message>``, and an exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


class CommandError(Exception):
    """A failure the user can act on; printed as ``workerpool: error: <message>``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def reported(*errors: type[BaseException], exit_code: int = 1,
             saying: Callable[[Any], str] = str) -> Iterator[None]:
    """Turn the library's ``errors`` raised inside into a :class:`CommandError` with the line
    ``saying`` makes of them (their own message unless told otherwise)."""
    try:
        yield
    except errors as exc:
        raise CommandError(saying(exc), exit_code) from exc
