"""Texts to sentence embeddings or scores, for every model that takes texts (``bert``, ``onnx``).

The tokenizer is the file's own ``tokenizer.json`` (metadata :data:`TOKENIZER_KEY`), cut at
:data:`MAX_LENGTH_KEY` tokens (the model's limit) and built once per process (:func:`tokenizer`).
A model's :class:`TextEncoder` tokenizes texts, or pairs of texts (a query and a document, as
sentence-transformers' CrossEncoder tokenizes them: token types 0 and 1, the longer side cut
first), runs them through the model in the passes :mod:`.text_passes` plans (texts of like
length together, each pass padded only to its own longest text) and applies its head to each
pass: pooling token states into one embedding as sentence-transformers does (:class:`Pooling`),
or a classifier's logits. It gives each pass's outputs as that pass ends, so that a worker
answers a request as soon as its texts are done.

A text over the model's limit is refused unless its request asks for truncation
(:class:`Texts`); a text far longer than the limit is cut before it is tokenized
(:func:`_prefix`), so a 2 MB string costs what its first few kilobytes cost. Hugging Face's
``tokenizers`` is imported only here, when a file carries a tokenizer.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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


Item = str | tuple[str, str]  # a text, or a pair (query, document)
# Characters kept of a text before it is tokenized, per token of the model's limit: a text this
# long is all but surely over the limit, and its prefix decides (see _prefix).
CHARS_PER_TOKEN = 16
WIDER = 16  # past CHARS_PER_TOKEN * WIDER characters a token, a text's start is all that is read


class Texts(list[Item]):
    """A request's texts (or pairs), and whether those over the model's limit are cut
    (``truncate``) or refuse the request (None: as the model is served, ``--truncate``)."""

    def __init__(self, items: Sequence[Item], truncate: bool | None = None) -> None:
        super().__init__(items)
        self.truncate = truncate


def is_item(value: Any) -> bool:
    """Whether ``value`` is a text or a pair of texts."""
    return isinstance(value, str) or (type(value) is tuple and len(value) == 2
                                      and all(isinstance(side, str) for side in value))


# The output of a pass [B, ...] and the attention mask [B, L] -> what the model answers [B, ...].
Head = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Tokenized:
    """A batch of texts, tokenized: each one's encoding, its tokens after the cut, and whether
    it was over the model's limit."""

    encodings: list[Any]
    lengths: list[int]
    over: list[bool]


@dataclass
class TokenCount:
    """What a worker's tokenizer did since it was last asked: texts, their tokens, seconds."""

    texts: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def take(self) -> tuple[int, int, float]:
        """The counts so far, from zero again."""
        counted = (self.texts, self.tokens, self.seconds)
        self.texts, self.tokens, self.seconds = 0, 0, 0.0
        return counted


@dataclass(frozen=True)
class TextEncoder:
    """How a model answers texts: its tokenizer, its encoder (what a pass of padded rows
    gives), its head (pooling into ``embedding``, or a classifier's ``logits``: ``output`` names
    it), what a pass costs beyond its tokens (``overhead``, in tokens: see
    :mod:`.text_passes`), the tokens a text may have (``limit``) and a classifier's labels."""

    model: str
    tokenizer: Any
    encode: Encoder
    head: Head
    overhead: float
    limit: int
    output: str = "embedding"
    labels: tuple[str, ...] = ()
    counted: TokenCount = field(default_factory=TokenCount, compare=False)  # for the pool's metrics

    def __call__(self, texts: Sequence[Any]) -> dict[str, np.ndarray]:
        """The output, ``[len(texts), ...]`` float32, and ``tokens``, ``[len(texts)]`` int32
        (each text's tokens after the cut, what usage is counted in)."""
        tokenized = self.tokenize(texts)
        self.refuse_over(texts, tokenized, range(len(texts)), truncate=getattr(texts, "truncate", True) is not False)
        outputs: np.ndarray | None = None
        for indices, answered in self.passes(tokenized, range(len(texts))):
            if outputs is None:  # the width is the encoder's, known from its first answer
                outputs = np.empty((len(tokenized.lengths), *answered.shape[1:]), np.float32)
            outputs[indices] = answered
        assert outputs is not None
        return {self.output: outputs, "tokens": np.array(tokenized.lengths, np.int32)}

    def describe(self) -> dict[str, Any]:
        """What ``info`` says of the texts: the task, the tokens a text may have, the labels."""
        facts: dict[str, Any] = {"task": "classify" if self.output == LOGITS else "embed",
                                 "max_input_tokens": self.limit}
        if self.output == LOGITS:
            facts["labels"] = list(self.labels)
        else:
            facts["normalized"] = getattr(self.head, "normalize", False) is True
        return facts

    def tokenize(self, texts: Sequence[Any], *, special: bool = True) -> Tokenized:
        """Every text (or pair) tokenized, cut at the model's limit, with the model's special
        tokens unless not ``special``. Raises :class:`ModelInputError` for what the tokenizer
        cannot read."""
        if not texts or not all(map(is_item, texts)):
            raise ModelInputError(f"{self.model}: texts must be a non-empty list of strings")
        began = time.perf_counter()
        cut = [self._prefix(text) for text in texts]
        try:
            encodings = self.tokenizer.encode_batch([item for item, _ in cut], add_special_tokens=special)
        except Exception as exc:  # noqa: BLE001 - what the tokenizer cannot read is the client's
            raise ModelInputError(f"{self.model}: the tokenizer cannot read these texts: {exc}") from None
        lengths = [len(e.ids) for e in encodings]
        counted = self.counted
        counted.texts += len(lengths)
        counted.tokens += sum(lengths)
        counted.seconds += time.perf_counter() - began
        return Tokenized(encodings, lengths,
                         [bool(e.overflowing) or forced for e, (_, forced) in zip(encodings, cut, strict=True)])

    def refuse_over(self, texts: Sequence[Item], tokenized: Tokenized, indices: Iterable[int], *,
                    truncate: bool) -> None:
        """Raise :class:`ModelInputError` naming the first text of ``indices`` over the limit,
        unless ``truncate``."""
        if truncate:
            return
        for index in indices:
            if tokenized.over[index]:
                item = texts[index]
                what = f"the text beginning {item[:40]!r} is" if isinstance(item, str) else \
                    f"the pair beginning {item[0][:30]!r} and {item[1][:30]!r} is together"
                raise ModelInputError(
                    f"{self.model}: {what} longer than the model's limit of {self.limit} tokens: shorten "
                    "it, or ask for truncation (TEI: \"truncate\": true), or serve the model with --truncate")

    def passes(self, tokenized: Tokenized, indices: Iterable[int],
               max_rows: int | None = None) -> Iterator[tuple[list[int], np.ndarray]]:
        """The passes over the texts ``indices`` (:func:`.text_passes.plan_passes`, at most
        ``max_rows`` texts each), run one by one as the iterator is read: the indices of the
        texts each pass ran, and their outputs. A text's output does not depend on the texts
        beside it."""
        chosen = list(indices)
        plan = plan_passes([tokenized.lengths[i] for i in chosen], self.overhead, max_rows=max_rows)
        for positions in plan:
            run = [chosen[k] for k in positions]
            ids, mask, types = _padded([tokenized.encodings[i] for i in run])
            yield run, self.head(self.encode(ids, mask, types), mask)

    def _prefix(self, item: Item) -> tuple[Item, bool]:
        """``item`` as it is tokenized, and whether it was cut short where its whole could not
        be read (then it counts as over the limit). A side far over the limit is cut to its
        first :data:`CHARS_PER_TOKEN` characters a token where the tokens the limit keeps of
        that start end before its last word (the one the cut may split): they are then the whole
        text's, so the answer is the same (a side of a pair keeps fewer tokens than it would
        alone). A side of few words in many characters is read whole up to :data:`WIDER` times
        that, and past it only that far: its answer is its start's."""
        if isinstance(item, tuple):
            (first, cut_first), (second, cut_second) = self._prefix(item[0]), self._prefix(item[1])
            return (str(first), str(second)), cut_first or cut_second
        keep = self.limit * CHARS_PER_TOKEN
        if len(item) <= keep:
            return item, False
        prefix = item[:keep]
        encoding = self.tokenizer.encode(prefix)
        kept = [word for word in encoding.word_ids if word is not None]
        cut = [word for piece in encoding.overflowing for word in piece.word_ids if word is not None]
        if kept and cut and max(kept) < max(cut):
            return prefix, False
        return (item, False) if len(item) <= keep * WIDER else (item[:keep * WIDER], True)


LOGITS = "logits"  # a classifier's output for texts


def classify(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The head of a model whose pass already gives each text's logits."""
    return np.asarray(logits, np.float32)


def text_outputs(width: int | None, output: str = "embedding") -> tuple[dict[str, tuple[int | None, ...]],
                                                                          dict[str, type]]:
    """The shapes and dtypes a model that answers texts declares for them: ``output`` (an
    embedding, or logits), ``width`` wide (None: unknown), and each text's tokens."""
    shapes: dict[str, tuple[int | None, ...]] = {output: (None, width), "tokens": (None,)}
    return shapes, {output: np.float32, "tokens": np.int32}


def _padded(chunk: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, attention mask and token types of a chunk's encodings, int64 ``[B, L]``,
    padded with 0 to its longest."""
    longest = max(1, *(len(e.ids) for e in chunk))  # one padding token at least: no encoder takes none
    ids, mask, types = (np.array([getattr(e, field) + [0] * (longest - len(e.ids)) for e in chunk],
                                 dtype=np.int64)
                        for field in ("ids", "attention_mask", "type_ids"))
    return ids, mask, types
