"""Requests any served model takes, made from what its ``info`` declares, so that a benchmark
can drive a model it knows nothing else of: texts for a model that takes them (what such a model
is sent in earnest), else one row of every declared array, filled with ones (a valid token id,
a full attention mask, a bright pixel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from workerpool import models
from workerpool.models.contract import TEXT
from workerpool.protocol.messages import Inputs

from .embedding import SENTENCES

OPEN_AXIS = 8  # the size given to an axis the model leaves open past the batch axis (a sequence)


class NoInput(ValueError):
    """The model does not declare an input a request can be made of; the message says which."""


def requests_for(info: Mapping[str, Any]) -> list[Inputs]:
    """The requests to send in turn: each of :data:`SENTENCES` alone for a model that takes
    texts; otherwise one request of one row, a bare array or arrays by name as declared."""
    if models.takes_text(info):
        return [[sentence] for sentence in SENTENCES]
    arrays = [entry for entry in info.get("inputs") or () if entry.get("dtype") != TEXT]
    if not arrays:
        raise NoInput(f"model {info.get('model')!r} declares no input")
    if len(arrays) == 1 and arrays[0].get("name") is None:
        return [row_of(arrays[0])]
    return [{str(entry["name"]): row_of(entry) for entry in arrays}]


def row_of(entry: Mapping[str, Any]) -> np.ndarray:
    """Ones of the entry's dtype and shape: one row along a leading open axis (the batch axis),
    :data:`OPEN_AXIS` along any other."""
    name, dtype, shape = entry.get("name") or "the input", entry.get("dtype"), entry.get("shape")
    if dtype is None or shape is None:
        raise NoInput(f"{name} is of {'any dtype' if dtype is None else 'any shape'}: the model "
                      f"does not declare what to send")
    sizes = [1 if axis is None and i == 0 else OPEN_AXIS if axis is None else int(axis)
             for i, axis in enumerate(shape)]
    return np.ones(sizes, np.dtype(dtype))
