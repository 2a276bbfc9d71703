"""Text Embeddings Inference's API (Hugging Face's TEI): ``/embed``, ``/rerank``, ``/predict``,
``/tokenize`` and ``/info``, in its JSON shapes, both ends.

The front door reads a request (``read_*``: a :class:`~.text_calls.TextRequest`); each part's
worker writes its share of the answer (:func:`write`, by the ``op`` option); the door joins
the shares (the request's ``finish``). Errors are TEI's ``{"error", "error_type"}``
(:func:`error_object`). As TEI does without ``--auto-truncate``, a text over the model's limit
is refused unless ``truncate`` is true (here, unless the pool runs with ``--truncate``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BadRequest
from . import text_calls
from .text_calls import (
    CLASSIFY,
    EMBED,
    TextRequest,
    cut,
    flag,
    listed,
    read_dimensions,
    require_task,
    scores,
    texts_of,
)
from .view import Answer, ModelView

OPS = ("embed", "rerank", "predict", "tokenize")  # what a worker writes
# A rerank query travels once in each part's header (not with every document), within its 64 KiB.
MAX_QUERY_CHARS = 8 * 1024
ERROR_TYPES = {400: "Validation", 404: "Validation", 405: "Validation", 408: "Validation", 411: "Validation",
               413: "Validation", 415: "Validation", 422: "Validation", 429: "Overloaded",
               503: "Unhealthy"}  # others: Backend


def error_object(message: str, status: int) -> dict[str, Any]:
    """TEI's error object."""
    return {"error": message, "error_type": ERROR_TYPES.get(status, "Backend")}


def info(view: ModelView, max_texts: int) -> dict[str, Any]:
    """``GET /info``: the model, its kind and its limits, in TEI's names (``max_batch_requests``:
    the texts one forward pass may take, ``--max-batch``; a request with more is spread)."""
    kind: dict[str, Any] = {"classifier": {"id2label": dict(enumerate(view.labels)),
                                           "label2id": {label: i for i, label in enumerate(view.labels)}}} \
        if view.task == CLASSIFY else {"embedding": {"pooling": "as the model's file says"}}
    if view.task == CLASSIFY and len(view.labels) == 1:
        kind = {"reranker": kind["classifier"]}
    return {"model_id": view.name, "model_sha": None, "model_dtype": "float32", "model_type": kind,
            "max_input_length": view.max_input_tokens, "max_client_batch_size": max_texts,
            "max_batch_requests": view.max_batch, "version": str(view.version)}


# The front door.


def read_embed(document: dict[str, Any], view: ModelView) -> TextRequest:
    """``POST /embed``: ``inputs``, ``normalize`` (default true), ``truncate``, ``dimensions``."""
    require_task(view, EMBED, "/embed")
    texts = texts_of(document.get("inputs"), "inputs")
    normalize = flag(document, "normalize", True)
    if not normalize and view.normalized:
        raise BadRequest(f"'normalize': false cannot be given: the model {view.name!r} normalises its "
                         "embeddings itself (a Normalize module)")
    options = {"op": "embed", "normalize": normalize, "dimensions": read_dimensions(document.get("dimensions"), view),
               "truncate": flag(document, "truncate", None)}
    return TextRequest(texts, options, listed)


def read_rerank(document: dict[str, Any], view: ModelView) -> TextRequest:
    """``POST /rerank``: ``query``, ``texts``, ``raw_scores``, ``return_text``, ``truncate``;
    answered with every text's index and score, best first."""
    query, texts = rerank_fields(document, view, "/rerank", "texts")
    return_text = flag(document, "return_text", False)

    def finish(parts: list[bytes], tokens: int) -> bytes:
        ranked = ranked_scores(parts)
        return json.dumps([{"index": index, "score": score, **({"text": texts[index]} if return_text else {})}
                           for index, score in ranked]).encode()

    options = {"op": "rerank", "raw": flag(document, "raw_scores", False), "query": query,
               "truncate": flag(document, "truncate", None)}
    return TextRequest(texts, options, finish)


def read_predict(document: dict[str, Any], view: ModelView) -> TextRequest:
    """``POST /predict``: ``inputs`` (a text, a pair ``[a, b]``, or a list of texts or pairs),
    ``raw_scores``, ``truncate``; answered with each input's labels and scores, best first (a
    list of them for a list of inputs)."""
    require_task(view, CLASSIFY, "/predict")
    inputs = document.get("inputs")
    single = isinstance(inputs, str) or (isinstance(inputs, list) and len(inputs) == 2
                                         and all(isinstance(side, str) for side in inputs))
    items = [inputs] if single else inputs
    if not isinstance(items, list) or not items:
        raise BadRequest("'inputs' must be a text, a pair [text, text], or a non-empty list of them")
    firsts, seconds, paired = [], [], False
    for item in items:
        sides = [item] if isinstance(item, str) else item
        if not isinstance(sides, list) or not 1 <= len(sides) <= 2 or not all(isinstance(s, str) for s in sides):
            raise BadRequest("each of 'inputs' must be a text, [text] or a pair [text, text]")
        firsts.append(sides[0])
        seconds.append(sides[1] if len(sides) == 2 else "")
        paired = paired or len(sides) == 2
    if paired and not all(isinstance(item, list) and len(item) == 2 for item in items):
        raise BadRequest("'inputs' mixes texts and pairs: send all of one kind")
    texts = text_calls.pairs(firsts, seconds) if paired else firsts
    options = {"op": "predict", "raw": flag(document, "raw_scores", False), "pairs": paired,
               "truncate": flag(document, "truncate", None)}

    return TextRequest(texts, options, (lambda parts, tokens: b",".join(parts)) if single else listed)


def read_tokenize(document: dict[str, Any], view: ModelView) -> TextRequest:
    """``POST /tokenize``: ``inputs``, ``add_special_tokens`` (default true); each text's tokens
    as the model runs them (cut at its limit)."""
    if view.task is None:
        raise BadRequest(f"/tokenize needs a model of texts; the model {view.name!r} takes none")
    texts = texts_of(document.get("inputs"), "inputs")
    options = {"op": "tokenize", "special": flag(document, "add_special_tokens", True), "truncate": True}
    return TextRequest(texts, options, listed)


def rerank_fields(document: dict[str, Any], view: ModelView, route: str, field: str) -> tuple[str, list[str]]:
    """A rerank request's query and documents (``field``), for a one-label classifier."""
    require_task(view, CLASSIFY, route)
    if len(view.labels) != 1:
        raise BadRequest(f"{route} needs a cross-encoder (one score a pair); the model {view.name!r} "
                         f"has {len(view.labels)} labels: classify with /predict")
    query = document.get("query")
    if not isinstance(query, str):
        raise BadRequest("'query' must be a string")
    if len(query) > MAX_QUERY_CHARS:
        raise BadRequest(f"the query is {len(query)} characters, over {MAX_QUERY_CHARS}: a model reads "
                         f"{view.max_input_tokens} tokens of a query and its document at most")
    return query, texts_of(document.get(field), field)


def ranked_scores(parts: list[bytes]) -> list[tuple[int, float]]:
    """The ``[index, score]`` every part wrote, best score first (ties in index order)."""
    found = json.loads(b"[" + b",".join(parts) + b"]")
    return sorted(((int(index), float(score)) for index, score in found), key=lambda pair: (-pair[1], pair[0]))


# The worker.


def write(answer: Answer, first: int, options: dict[str, Any], labels: tuple[str, ...]) -> tuple[bytes, int]:
    """A part's share of the answer (its first text being the request's ``first``), and the
    tokens its texts held; ``labels``: the classifier's."""
    outputs = answer.outputs
    tokens = int(outputs["tokens"].sum()) if "tokens" in outputs else 0
    op = options.get("op")
    if op == "embed":
        return _embeddings(outputs["embedding"], options), tokens
    if "logits" not in outputs or op not in ("rerank", "predict"):
        raise BadRequest(f"a TEI request of op {str(op)[:40]!r} cannot be answered from outputs "
                         f"{', '.join(outputs)}")
    found = scores(outputs["logits"], options.get("raw") is True)
    if op == "rerank":
        return ",".join(f"[{first + i},{float(row[0])!r}]" for i, row in enumerate(found)).encode(), tokens
    return ",".join(json.dumps(_labelled(row, labels)) for row in found).encode(), tokens


def _labelled(row: np.ndarray, labels: tuple[str, ...]) -> list[dict[str, Any]]:
    """One input's labels and scores, best first."""
    order = np.argsort(-row, kind="stable")
    return [{"score": float(row[i]), "label": labels[i] if i < len(labels) else f"LABEL_{i}"} for i in order]


def _embeddings(embeddings: np.ndarray, options: dict[str, Any]) -> bytes:
    rows = cut(embeddings, read_dimensions(options.get("dimensions"), None), options.get("normalize") is not False)
    return ",".join(json.dumps(row.tolist()) for row in rows).encode()


def write_tokens(encodings: list[Any], texts: Sequence[Any]) -> bytes:
    """``/tokenize``'s share: each text's tokens: id, the text it stands for (its own, for a
    special token), whether it is special, and where it starts and stops in the text
    (characters; None for a special token)."""
    items = []
    for encoding, text in zip(encodings, texts, strict=True):
        tokens = []
        for token_id, token, special, (start, stop) in zip(encoding.ids, encoding.tokens, encoding.special_tokens_mask,
                                                           encoding.offsets, strict=True):
            plain = special != 1
            tokens.append({"id": token_id, "text": text[start:stop] if plain else token, "special": not plain,
                           "start": start if plain else None, "stop": stop if plain else None})
        items.append(json.dumps(tokens))
    return ",".join(items).encode()
