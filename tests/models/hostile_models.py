"""Test models that misbehave on request, for the worker's hardening tests.

``factory`` builds :class:`Hostile`, which declares float32 ``[B, 4]`` in and ``[B, 2]`` out
and does what the first element of its input names (one of the constants below);
``undeclared`` builds the same model without the declaration. Memory figures are in the
second element, in MiB.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from workerpool.units import MiB

ANSWER = 0  # the declared output: the first two columns, doubled
KEYBOARD_INTERRUPT = 1
SYSTEM_EXIT = 2
CUSTOM_BASE_EXCEPTION = 3
WRONG_SHAPE = 4  # float32 [3]
WRONG_DTYPE = 5  # float64 [B, 2]
NOTHING = 6  # None
ALLOCATE = 7  # touch x[0, 1] MiB, then let it go
KEEP = 8  # touch x[0, 1] MiB and keep it for good
HOARD = 9  # touch 16 MiB at a time, holding all of it, until memory runs out
CRASH = 10  # end the process at once (os._exit(70)), as a crashing extension would, without a core file


class Escape(BaseException):
    """Not an Exception: what a model might raise to get out of everything."""


class Undeclared:
    """Misbehaves as asked, declaring nothing."""

    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []

    def __call__(self, x: np.ndarray) -> np.ndarray | None:
        x = np.atleast_2d(x)
        code, amount = int(x[0, 0]), int(x[0, 1]) * MiB
        if code in RAISES:
            raise RAISES[code]()
        if code == WRONG_SHAPE:
            return np.zeros(3, np.float32)
        if code == WRONG_DTYPE:
            return np.zeros((len(x), 2), np.float64)
        if code == NOTHING:
            return None
        if code == CRASH:
            os._exit(70)
        if code == ALLOCATE:
            np.ones(amount, np.uint8)
        elif code == KEEP:
            self.kept.append(np.ones(amount, np.uint8))
        elif code == HOARD:
            hoard = []
            while True:
                hoard.append(np.ones(16 * MiB, np.uint8))
        return x[:, :2] * np.float32(2)


RAISES: dict[int, Callable[[], BaseException]] = {
    KEYBOARD_INTERRUPT: KeyboardInterrupt,
    SYSTEM_EXIT: lambda: SystemExit(3),
    CUSTOM_BASE_EXCEPTION: lambda: Escape("out"),
}


class Hostile(Undeclared):
    """Misbehaves as asked, declaring float32 [B, 4] in and [B, 2] out."""

    input_shape = (None, 4)
    input_dtype = np.dtype(np.float32)
    output_shape = (None, 2)
    output_dtype = np.dtype(np.float32)


def factory(weights, metadata) -> Hostile:
    return Hostile()


def undeclared(weights, metadata) -> Undeclared:
    return Undeclared()
