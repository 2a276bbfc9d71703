"""Rerank as Cohere's and Jina's clients send it: ``POST /v1/rerank`` and ``/v2/rerank``.

A request names the ``model``, a ``query`` and its ``documents`` (texts, or objects with a
``text``), and may ask for the ``top_n`` best and for the documents back
(``return_documents``: by default yes on ``/v1``, as Jina answers, no on ``/v2``, as Cohere's
version 2 answers). The answer lists ``results`` best first, each with the document's
``index`` and its ``relevance_score`` (the cross-encoder's sigmoid), with Cohere's ``id`` and
``meta`` and Jina's ``model`` and ``usage`` beside them, so that both clients read it. Long
documents are cut at the model's limit, as both services cut them (``max_tokens_per_doc`` is
taken; the model's own limit is what applies).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..errors import BadRequest
from .tei import ranked_scores, rerank_fields
from .text_calls import TextRequest, flag
from .view import ModelView


def read(document: dict[str, Any], view: ModelView, version: int) -> TextRequest:
    """A rerank request of API ``version`` (1 or 2), for the model ``view``."""
    documents = document.get("documents")
    if isinstance(documents, list):
        if any(isinstance(item, dict) and not isinstance(item.get("text"), str) for item in documents):
            raise BadRequest("each of 'documents' must be a string or an object with a string 'text'")
        documents = [item["text"] if isinstance(item, dict) else item for item in documents]
    query, texts = rerank_fields({**document, "documents": documents}, view, f"/v{version}/rerank", "documents")
    top_n = document.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise BadRequest(f"'top_n' must be a whole number from 1 up, not {str(top_n)[:40]!r}")
    limit = document.get("max_tokens_per_doc")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise BadRequest(f"'max_tokens_per_doc' must be a whole number from 1 up, not {str(limit)[:40]!r}")
    returned = flag(document, "return_documents", version == 1)
    model = view.name

    def finish(parts: list[bytes], tokens: int) -> bytes:
        ranked = ranked_scores(parts)[:top_n]
        results = [{"index": index, "relevance_score": score,
                    **({"document": {"text": texts[index]}} if returned else {})} for index, score in ranked]
        return json.dumps({"id": str(uuid.uuid4()), "model": model, "results": results,
                           "meta": {"api_version": {"version": str(version)}, "billed_units": {"search_units": 1}},
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()

    options = {"op": "rerank", "raw": False, "query": query, "truncate": True}
    return TextRequest(texts, options, finish)
