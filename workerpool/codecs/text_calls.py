"""What every text API shares: a request read at the front door (:class:`TextRequest`), pairs
of texts on the wire, the options a worker reads, and scores from a classifier's logits.

A text API's request is read at the front door and sent to the router as a request of texts,
which it spreads over the workers (``http_call.text_request_frames``); its options travel in the
header's ``http`` object. A pair (a query and a document, or two texts to classify together)
travels as one text, its two sides joined by NUL: the router cuts a request between texts, so a
pair is never cut apart, and no text may hold a NUL itself (refused at the door). Each part's
worker writes its share of the response body; the door joins the shares (``finish``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadRequest
from ..models.texts import NORM_EPS, Texts
from .view import ModelView

PAIR = "\0"  # joins the two sides of a pair on the wire
EMBED, CLASSIFY = "embed", "classify"  # the tasks a model of texts has (its info's "task")

# The response body from each part's share (in order) and the tokens they ran.
Finish = Callable[[list[bytes], int], bytes]


@dataclass(frozen=True)
class TextRequest:
    """A text API's request, read at the front door: its texts (pairs joined), the options its
    workers read, and how the door writes the response from the parts' shares."""

    texts: list[str]
    options: dict[str, Any]
    finish: Finish


def pairs(firsts: Sequence[str], seconds: Sequence[str]) -> list[str]:
    """Pairs as the wire carries them; a text holding a NUL is refused."""
    if any(PAIR in text for text in (*firsts, *seconds)):
        raise BadRequest("a text holds the NUL character, which no text of a pair may hold")
    return [first + PAIR + second for first, second in zip(firsts, seconds, strict=True)]


def payload(texts: list[str], options: dict[str, Any]) -> Texts:
    """What a worker runs for a request of texts: each text; each pair when the options say
    so; or the options' ``query`` paired with each text (rerank: the query travels once, in
    the header); with the truncation the request asked for (None: as the model is served)."""
    truncate, query = options.get("truncate"), options.get("query")
    if truncate is not None and not isinstance(truncate, bool):
        raise BadRequest("'truncate' must be true or false")
    if isinstance(query, str):
        return Texts([(query, text) for text in texts], truncate)
    if options.get("pairs") is True:
        return Texts([_split(text) for text in texts], truncate)
    return Texts(texts, truncate)


def _split(text: str) -> tuple[str, str]:
    first, _, second = text.partition(PAIR)
    return first, second


def require_task(view: ModelView, task: str, route: str) -> None:
    """Refuse a route whose task the model does not have, naming what it needs."""
    if view.task == task:
        return
    needs = {EMBED: "an embedding model", CLASSIFY: "a classifier or cross-encoder"}[task]
    has = {EMBED: "an embedding model", CLASSIFY: "a classifier"}.get(view.task or "", "a model that takes no texts")
    raise BadRequest(f"{route} needs {needs}; the model {view.name!r} is {has}")


def scores(logits: np.ndarray, raw: bool) -> np.ndarray:
    """A classifier's scores: its logits when ``raw``, else their sigmoid for one label and
    their softmax over several, as TEI and sentence-transformers' CrossEncoder give them."""
    logits = np.asarray(logits, np.float64)
    if raw:
        return logits
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def flag(document: dict[str, Any], name: str, default: bool | None) -> bool | None:
    """A boolean field of a request, ``default`` when absent."""
    value = document.get(name, default)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false, not {str(value)[:40]!r}")
    return value


def read_dimensions(value: Any, view: ModelView | None) -> int | None:
    """A request's ``dimensions``: None (all of them), or a whole number from 1 up, at most the
    width of ``view``'s embeddings where it says."""
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadRequest(f"'dimensions' must be a whole number from 1 up, not {str(value)[:40]!r}")
    width = None if view is None else embedding_width(view)
    if view is not None and width is not None and value > width:
        raise BadRequest(f"'dimensions' {value} is more than the {width} the model {view.name!r} gives")
    return value


def cut(embeddings: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Embeddings ``[N, H]`` as a text API writes them: the first ``dimensions`` components
    (None: all), renormalised to unit length when ``normalize``, float32."""
    rows = np.asarray(embeddings, np.float32)
    if dimensions is not None:
        if dimensions > rows.shape[1]:
            raise BadRequest(f"'dimensions' {dimensions} is more than the {rows.shape[1]} the model gives")
        rows = rows[:, :dimensions]
    if normalize:
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), NORM_EPS)
    return rows


def listed(parts: list[bytes], tokens: int) -> bytes:
    """A response body that is the JSON list of every part's items, in order."""
    return b"[" + b",".join(parts) + b"]"


def embedding_width(view: ModelView) -> int | None:
    """The width of a model's ``embedding`` output, None when it has none or does not say."""
    shape = next((t.shape for t in view.outputs if t.name == "embedding"), None)
    return shape[-1] if shape else None


def texts_of(value: Any, name: str) -> list[str]:
    """A field that holds one text or a non-empty list of texts."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(text, str) for text in value):
        raise BadRequest(f"'{name}' must be a string or a non-empty list of strings")
    return value
