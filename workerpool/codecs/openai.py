"""OpenAI's embeddings API (``POST /v1/embeddings``) for a model that takes texts: request and
response bodies, and errors in OpenAI's shape."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from ..errors import BadRequest, ModelNotFound
from .kserve import json_object
from .view import Answer, ModelView

ENCODINGS = ("float", "base64")


def decode_embeddings(body: bytes | memoryview, view: ModelView) -> tuple[list[str], str]:
    """The texts and the encoding format asked for."""
    document = json_object(body)
    model = document.get("model")
    if model is not None and model != view.name:
        raise ModelNotFound(f"the model {model!r} does not exist here; this server serves {view.name!r}")
    if not view.takes_texts:
        raise BadRequest(f"the model {view.name!r} takes no texts, so it gives no embeddings: "
                         "call it with KServe v2 (/v2/models/NAME/infer)")
    texts = document.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("'input' must be a string or a non-empty list of strings (token arrays "
                         "are not taken: this server tokenizes)")
    dimensions, width = document.get("dimensions"), _width(view)
    if dimensions is not None and dimensions != width:
        raise BadRequest(f"'dimensions' {dimensions!r} cannot be given: the model {view.name!r} gives "
                         f"{width} dimensions")
    encoding = document.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise BadRequest(f"'encoding_format' must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
    return texts, encoding


def _width(view: ModelView) -> int | None:
    shape = next((t.shape for t in view.outputs if t.name == "embedding"), None)
    return shape[-1] if shape else None


def encode_embeddings(view: ModelView, answer: Answer, encoding: str) -> bytes:
    embeddings = np.asarray(answer.outputs["embedding"], dtype="<f4")
    tokens = int(answer.outputs["tokens"].sum()) if "tokens" in answer.outputs else 0
    data = [{"object": "embedding", "index": index, "embedding": _encoded(row, encoding)}
            for index, row in enumerate(embeddings)]
    return json.dumps({"object": "list", "data": data, "model": view.name,
                       "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                      separators=(",", ":")).encode()


def _encoded(row: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(row.tobytes()).decode()
    return row.tolist()


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
