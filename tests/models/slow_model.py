"""A test model for serving tests: doubles its input, and sleeps first when asked to.

A first element below zero means "sleep that many seconds", which lets a test hold one worker
busy and watch the others keep serving; ``holds_gil`` sleeps holding the GIL.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np


class SlowDouble:
    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.size and x.flat[0] < 0:
            time.sleep(float(-x.flat[0]))
        return x * 2


def factory(weights, metadata) -> SlowDouble:
    return SlowDouble()


class GilHolder(SlowDouble):
    """Sleeps inside one C call that keeps the GIL, as an extension that never releases it would."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.size and x.flat[0] < 0:
            ctypes.PyDLL(None).usleep(int(-x.flat[0] * 1_000_000))
        return x * 2


def holds_gil(weights, metadata) -> GilHolder:
    return GilHolder()
