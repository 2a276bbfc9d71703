"""Test models for batching: a factory model that opts in, one that does not, one that fails on
stacks, one that declares no output. Each doubles a float32 ``[B, 4]`` input; a first element below zero means "sleep that
many seconds first", to hold a worker busy with a batch.
"""

from __future__ import annotations

import time

import numpy as np

WIDTH = 4


class Doubling:
    input_shape = (None, WIDTH)
    input_dtype = np.float32
    output_shape = (None, WIDTH)
    output_dtype = np.float32

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim == 1:
            x = x[np.newaxis]
        if x.size and x.flat[0] < 0:
            time.sleep(float(-x.flat[0]))
        return x * 2


class Stacking(Doubling):
    batching = True


class UndeclaredOutput:
    """Batches, declares its input only, and answers a bare row without the batch axis."""

    input_shape = (None, WIDTH)
    input_dtype = np.float32
    batching = True

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x * 2


class NoStacks(Stacking):
    """Says it batches, then raises on any stacked batch."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim == 2 and len(x) > 1:
            raise ValueError("this model cannot take more than one row")
        return super().__call__(x)


class Poisoned(Stacking):
    """Fails any pass holding a row whose first element is 7; remembers the most rows it was handed."""

    def __init__(self) -> None:
        self.most_rows = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.most_rows = max(self.most_rows, len(x))
        if (x[:, 0] == 7).any():
            raise ValueError("a poisoned row")
        return super().__call__(x)


def poisoned(weights, metadata) -> Poisoned:
    return Poisoned()


def stacking(weights, metadata) -> Stacking:
    return Stacking()


def unbatched(weights, metadata) -> Doubling:
    return Doubling()


def no_stacks(weights, metadata) -> NoStacks:
    return NoStacks()


def undeclared_output(weights, metadata) -> UndeclaredOutput:
    return UndeclaredOutput()
