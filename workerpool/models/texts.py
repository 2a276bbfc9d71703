"""Texts to sentence embeddings, for every model that takes texts (``bert``, ``onnx``).

The tokenizer is the file's own ``tokenizer.json`` (metadata :data:`TOKENIZER_KEY`), cut at
:data:`MAX_LENGTH_KEY` tokens and built once per process (:func:`tokenizer`). A model's
:class:`TextEncoder` tokenizes texts, runs them through the model's encoder in the passes
:mod:`.text_passes` plans (texts of like length together, each pass padded only to its own
longest text) and pools each text's token states into one embedding as sentence-transformers
does (:class:`Pooling`). It gives each pass's embeddings as that pass ends, so that a worker
answers a request as soon as its texts are done. Hugging Face's ``tokenizers`` is imported
only here, when a file carries a tokenizer.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import extras
from ..errors import NotAJSONObject, json_object
from .base import ModelError, ModelInputError
from .text_passes import plan_passes

TOKENIZER_KEY = "workerpool.tokenizer"  # tokenizer.json, as text
MAX_LENGTH_KEY = "workerpool.max_seq_length"  # tokens kept per text; the rest is cut
NORM_EPS = 1e-12  # as torch.nn.functional.normalize
POOLING_MODES = ("mean", "cls", "max")

# The token states of padded rows: ids, attention mask, token types [B, L] -> [B, L, H].
Encoder = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Pooling:
    """How token states become one embedding: the masked mean, the first (CLS) token or the
    masked maximum, then L2-normalised when ``normalize``."""

    mode: str
    normalize: bool

    def __call__(self, states: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``[B, H]`` float32 of states ``[B, L, H]`` and their attention mask ``[B, L]``; a row
        without tokens pools to zeros, not NaN."""
        if not states.shape[1]:
            return np.zeros((len(states), states.shape[2]), np.float32)
        kept = np.asarray(mask) > 0
        if self.mode == "cls":
            pooled = states[:, 0].astype(np.float32)
        elif self.mode == "max":
            pooled = np.where(kept[:, :, None], states, np.finfo(np.float32).min).max(axis=1)
        else:
            weights = kept[:, :, None].astype(np.float32)
            pooled = (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        pooled[~kept.any(axis=1)] = 0  # a text the tokenizer made nothing of, alone or in company
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), NORM_EPS)
        return pooled.astype(np.float32)


MEAN_NORMALIZED = Pooling("mean", True)  # sentence-transformers' usual, and bert's


def pooling_of(model: str, text: str) -> Pooling:
    """The pooling a file's metadata describes as ``{"mode": ..., "normalize": ...}``."""
    try:
        found = json_object(text)
    except NotAJSONObject as exc:
        raise ModelError(f"{model}: the pooling metadata is not a JSON object") from exc
    mode, normalize = found.get("mode"), found.get("normalize", False)
    if mode not in POOLING_MODES or not isinstance(normalize, bool):
        raise ModelError(f"{model}: pooling {text!r} is not {{\"mode\": "
                         f"{'|'.join(POOLING_MODES)}, \"normalize\": true|false}}")
    return Pooling(mode, normalize)


def max_length(model: str, metadata: Mapping[str, str], default: int) -> int:
    """The tokens kept per text: the metadata's :data:`MAX_LENGTH_KEY`, else ``default``."""
    text = metadata.get(MAX_LENGTH_KEY)
    try:
        value = int(text) if text is not None else default
    except ValueError:
        value = 0
    if value < 1:
        raise ModelError(f"{model}: {MAX_LENGTH_KEY} {text!r} is not a whole number from 1 up")
    return value


def tokenizer(model: str, text: str | None, length: int) -> Any:
    """The file's tokenizer (``text``, its tokenizer.json), cutting texts at ``length`` tokens;
    None when the file carries none."""
    if text is None:
        return None
    try:
        return _tokenizer(text, length)
    except ImportError as exc:
        raise ModelError(f"{model}: {extras.missing('tokenizers', 'texts')}") from exc
    except Exception as exc:
        raise ModelError(f"{model}: {TOKENIZER_KEY} cannot be read: {exc}") from exc


@functools.lru_cache(maxsize=2)
def _tokenizer(text: str, length: int) -> Any:
    """Kept once built: the supervisor builds it when it validates the file, before it forks the
    template, so forked workers share its 10 MiB or so instead of building their own. It runs
    on the worker's own thread (no thread pool per worker beside the model's own threads)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer

    built = Tokenizer.from_str(text)
    built.enable_truncation(length)
    built.no_padding()  # each chunk of texts is padded to its own longest (embed_texts)
    return built


@dataclass(frozen=True)
class TextEncoder:
    """How a model turns texts into embeddings: its tokenizer, its encoder (token states of
    padded rows), its pooling and what a pass costs beyond its tokens (``overhead``, in tokens:
    see :mod:`.text_passes`)."""

    model: str
    tokenizer: Any
    encode: Encoder
    pooling: Pooling
    overhead: float

    def __call__(self, texts: Sequence[Any]) -> dict[str, np.ndarray]:
        """``embedding``, ``[len(texts), H]`` float32, and ``tokens``, ``[len(texts)]`` int32
        (each text's tokens after the cut, what usage is counted in)."""
        lengths, passes = self.tokenized(texts)
        embeddings: np.ndarray | None = None
        for indices, pooled in passes:
            if embeddings is None:  # the width is the encoder's, known from its first answer
                embeddings = np.empty((len(lengths), pooled.shape[1]), np.float32)
            embeddings[indices] = pooled
        assert embeddings is not None
        return {"embedding": embeddings, "tokens": np.array(lengths, np.int32)}

    def tokenized(self, texts: Sequence[Any],
                  max_rows: int | None = None) -> tuple[list[int], Iterator[tuple[list[int], np.ndarray]]]:
        """Each text's tokens, and the passes over them (:func:`.text_passes.plan_passes`, at most
        ``max_rows`` texts each), run one by one as the iterator is read: the indices of the
        texts each pass embedded, and their embeddings, ``[len(indices), H]`` float32. A text's
        embedding does not depend on the texts beside it. Raises :class:`ModelInputError` for
        what the tokenizer cannot read."""
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ModelInputError(f"{self.model}: texts must be a non-empty list of strings")
        try:
            encodings = self.tokenizer.encode_batch(list(texts))
        except Exception as exc:  # noqa: BLE001 - what the tokenizer cannot read is the client's
            raise ModelInputError(f"{self.model}: the tokenizer cannot read these texts: {exc}") from None
        lengths = [len(e.ids) for e in encodings]
        return lengths, self._passes(encodings, plan_passes(lengths, self.overhead, max_rows=max_rows))

    def _passes(self, encodings: list[Any], plan: list[list[int]]) -> Iterator[tuple[list[int], np.ndarray]]:
        for indices in plan:
            ids, mask, types = _padded([encodings[i] for i in indices])
            yield indices, self.pooling(self.encode(ids, mask, types), mask)


def text_outputs(width: int | None) -> tuple[dict[str, tuple[int | None, ...]], dict[str, type]]:
    """The shapes and dtypes a model that embeds texts declares for them (``width`` None:
    unknown)."""
    shapes: dict[str, tuple[int | None, ...]] = {"embedding": (None, width), "tokens": (None,)}
    return shapes, {"embedding": np.float32, "tokens": np.int32}


def _padded(chunk: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, attention mask and token types of a chunk's encodings, int64 ``[B, L]``,
    padded with 0 to its longest."""
    longest = max(1, *(len(e.ids) for e in chunk))  # one padding token at least: no encoder takes none
    ids, mask, types = (np.array([getattr(e, field) + [0] * (longest - len(e.ids)) for e in chunk],
                                 dtype=np.int64)
                        for field in ("ids", "attention_mask", "type_ids"))
    return ids, mask, types
