"""How a setting's text becomes its value, checked where it is read.

Each parser raises :class:`argparse.ArgumentTypeError` with the reason, so that argparse, a
``--config`` file and a ``WORKERPOOL_*`` variable all report a bad value the same way.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
from collections.abc import Callable
from typing import TypeVar

from .. import endpoints, runtime
from ..units import MS_PER_SECOND, parse_size

Number = TypeVar("Number", int, float)


def size(text: str) -> int:
    """Bytes written like ``512MiB``."""
    return _number(text, parse_size)


def count(text: str) -> int:
    """A whole number from 0 up."""
    value = _number(text, int, f"invalid count {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _number(text: str, parse: Callable[[str], Number], invalid: str | None = None) -> Number:
    """``text`` parsed, else a usage error: ``invalid``, or what ``parse`` says."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(invalid or str(exc)) from None


def seconds(text: str) -> float:
    return _amount(text, "seconds")


def milliseconds(text: str) -> float:
    """Milliseconds on the command line, seconds in the config."""
    return _amount(text, "milliseconds") / MS_PER_SECOND


def _amount(text: str, unit: str) -> float:
    value = _number(text, float, f"invalid number of {unit} {text!r}")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of {unit} from 0 up")
    return value


def fraction(text: str) -> float:
    """A share from 0 to 1."""
    value = _number(text, float, f"invalid fraction {text!r}")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction from 0 to 1")
    return value


def _above_zero(parse: Callable[[str], Number], message: str) -> Callable[[str], Number]:
    """``parse``, refusing 0 with ``message``: a limit of nothing is a typo, not a setting."""

    def parse_above_zero(text: str) -> Number:
        value = parse(text)
        if value == 0:
            raise argparse.ArgumentTypeError(message)
        return value

    return parse_above_zero


positive_count = _above_zero(count, "must be at least 1")
positive_size = _above_zero(size, "must be more than 0 bytes")
positive_seconds = _above_zero(seconds, "must be more than 0 seconds")


CACHE_OFF = "off"


def cache_dir(text: str) -> str | None:
    """A cache folder, made absolute (workers may start elsewhere); ``off``: None, no cache."""
    if text == CACHE_OFF:
        return None
    if not text:
        raise argparse.ArgumentTypeError("give a folder, or 'off'")
    return os.path.abspath(os.path.expanduser(text))


def endpoint(text: str, *, bind: bool = False) -> str:
    """A ZeroMQ endpoint, which names its transport (a bare address gets a hint); one to
    ``bind`` may pick a free port (``tcp://HOST:*``)."""
    try:
        return endpoints.check(text, bind=bind)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


bind_endpoint = functools.partial(endpoint, bind=True)


def control_endpoint(text: str) -> str:
    """A control endpoint: always an ipc:// path to a socket file (clients' endpoints are
    elsewhere; an abstract ipc://@name has no permissions to keep others out)."""
    if runtime.ipc_path(text) is not None:
        return text
    if text.startswith("ipc://@"):
        raise argparse.ArgumentTypeError(f"{text!r}: the control socket must be a file, which only "
                                         "you can open (an abstract @name is open to every user)")
    if text.startswith(endpoints.TRANSPORTS) or ":" in text or not text:
        raise argparse.ArgumentTypeError(f"{text!r}: the control socket is an ipc://PATH (the "
                                         "client endpoint, tcp://..., is another socket)")
    raise argparse.ArgumentTypeError(f"{text!r} names no transport: write ipc://{text}")


def unpaired(*options: tuple[str, object]) -> str | None:
    """Why options that only work together, as ``(flag, value)``, were given apart; None if
    they were given all or none."""
    if len({bool(value) for _, value in options}) == 1:
        return None
    return " and ".join(flag for flag, _ in options) + " go together"
