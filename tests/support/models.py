"""The tests' models as a worker builds them, for reference answers."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from workerpool import burnpack, models

SLOW = ("--model", "slow_model:factory")  # doubles its input; x[0] < 0 sleeps -x[0] seconds


def build_local(path: str | os.PathLike) -> Callable[..., Any]:
    """The model in ``path``, built in this process as a worker builds it: the reference answers."""
    pack = burnpack.read(path)
    return models.build_model(pack.tensors, pack.metadata)


def batch_outcomes(loaded: Any, inputs: list[Any]) -> list[Any]:
    """``LoadedModel.infer_batch``'s outcomes in the order of ``inputs``, each given once."""
    found = dict(loaded.infer_batch(inputs))
    assert sorted(found) == list(range(len(inputs)))
    return [found[index] for index in range(len(inputs))]
