"""A text model that gives no embedding: one score per text (its length), declared as such.

Over HTTP, ``/v1/embeddings`` must refuse it at the front door; a request that gets past that
(a ZeroMQ client can write an OpenAI call's header itself) must fail alone in the worker, which
serves on.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np


class Scorer:
    accepts_text = True
    text_output_shape: ClassVar[dict[str, tuple[None]]] = {"score": (None,)}
    text_output_dtype = np.float32

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        return {"score": np.array([len(text) for text in texts], np.float32)}


def factory(weights, metadata) -> Scorer:
    return Scorer()
