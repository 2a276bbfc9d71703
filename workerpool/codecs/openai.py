"""OpenAI's embeddings API (``POST /v1/embeddings``) for a model that takes texts: request and
response bodies, and errors in OpenAI's shape.

The front door reads a request's body (:func:`decode_embeddings`), so that its texts can be
spread over the workers; each worker writes the items of the response's ``data`` for the texts
it ran (:func:`encode_items`), and the front door puts them in one body (:func:`join_embeddings`):
the supervisor never formats a float.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from ..errors import BadRequest
from .kserve import json_object
from .text_calls import TextRequest, cut, embedding_width, read_dimensions
from .view import Answer, ModelView

ENCODINGS = ("float", "base64")


def requested_model(body: bytes | memoryview) -> tuple[dict[str, Any], Any]:
    """The request's JSON object, and the model it names (None when it names none)."""
    document = json_object(body)
    model = document.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, the name of a model, not {type(model).__name__}")
    return document, model


def decode_embeddings(document: dict[str, Any], view: ModelView) -> TextRequest:
    """The texts, how their embeddings are to be written (``encoding`` and ``dimensions``,
    :func:`read_options`) and how the response is joined, of the model ``view`` describes.
    ``user`` is taken and not used."""
    if not view.takes_texts:
        raise BadRequest(f"the model {view.name!r} takes no texts, so it gives no embeddings: "
                         "call it with KServe v2 (/v2/models/NAME/infer)")
    if embedding_width(view) is None:
        outputs = ", ".join(repr(t.name) for t in view.outputs)
        raise BadRequest(f"the model {view.name!r} gives no embeddings (its outputs: {outputs}): "
                         "/v1/embeddings needs an embedding model; call this one with KServe v2 "
                         "(/v2/models/NAME/infer)")
    texts = document.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if _token_ids(texts) or (isinstance(texts, list) and texts and all(map(_token_ids, texts))):
        raise BadRequest(TOKEN_IDS)
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("'input' must be a string or a non-empty list of strings")
    options = read_options({"encoding": document.get("encoding_format", "float"),
                            "dimensions": read_dimensions(document.get("dimensions"), view)})
    model = view.name
    return TextRequest(texts, options, lambda items, tokens: join_embeddings(model, items, tokens))


TOKEN_IDS = ("'input' holds token ids: this server tokenizes texts itself with the model's own "
             "tokenizer, and ids from another one (tiktoken's, which LangChain's OpenAIEmbeddings "
             "sends by default) would give wrong vectors without a word; send the texts (LangChain: "
             "OpenAIEmbeddings(..., check_embedding_ctx_length=False))")


def _token_ids(value: Any) -> bool:
    """Whether ``value`` is a list of token ids (whole numbers)."""
    return isinstance(value, list) and bool(value) and all(type(item) is int for item in value)


def read_options(given: dict[str, Any]) -> dict[str, Any]:
    """How embeddings are written, checked: ``encoding`` (``float`` or ``base64``) and
    ``dimensions`` (None: all of them; else the first that many, renormalised)."""
    encoding, dimensions = given.get("encoding", "float"), given.get("dimensions")
    if encoding not in ENCODINGS:
        raise BadRequest(f"'encoding_format' must be one of {', '.join(ENCODINGS)}, not {str(encoding)[:40]!r}")
    return {"encoding": encoding, "dimensions": read_dimensions(dimensions, None)}


def encode_items(answer: Answer, first: int, options: dict[str, Any]) -> tuple[bytes, int]:
    """The items of ``data`` for the texts a worker ran, the first being the request's text
    ``first``, joined by commas; and the tokens they held. With ``dimensions``, each embedding
    is cut to its first that many components and renormalised, as OpenAI does: meaningful for a
    model trained for it (Matryoshka), a loss of accuracy for others."""
    dimensions = options["dimensions"]
    embeddings = cut(answer.outputs["embedding"], dimensions, normalize=dimensions is not None)
    tokens = int(answer.outputs["tokens"].sum()) if "tokens" in answer.outputs else 0
    items = [json.dumps({"object": "embedding", "index": first + index,
                         "embedding": _encoded(row, options["encoding"])}, separators=(",", ":"))
             for index, row in enumerate(embeddings)]
    return ",".join(items).encode(), tokens


def join_embeddings(model: str, items: list[bytes], tokens: int) -> bytes:
    """The response body around the items every part gave, in the order of the texts."""
    usage = json.dumps({"prompt_tokens": tokens, "total_tokens": tokens})
    return b"".join((b'{"object":"list","data":[', b",".join(items), b'],"model":',
                     json.dumps(model).encode(), b',"usage":', usage.encode(), b"}"))


def _encoded(row: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(row.tobytes()).decode()
    return row.tolist()


def error_object(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
