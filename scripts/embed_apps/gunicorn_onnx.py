"""OpenAI-shaped ``POST /v1/embeddings`` from a sentence-transformers folder exported to ONNX
(``$EMBED_FOLDER``), as a WSGI app: what a user of gunicorn writes instead of workerpool.

The session is built at import: in each worker after the fork under plain gunicorn, once in the
master under ``--preload``. Default onnxruntime session options; the folder's tokenizer cut at
256 tokens (sentence-transformers' cut for all-MiniLM-L6-v2) and padded to the longest text of
the request, as the exported tokenizer.json itself does neither; masked mean pooling and L2
normalisation. ``X-Worker-Pid`` names the worker that answered.

    EMBED_FOLDER=minilm-onnx gunicorn --workers 2 --pythonpath scripts embed_apps.gunicorn_onnx:application
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

FOLDER = os.environ["EMBED_FOLDER"]
SESSION = ort.InferenceSession(os.path.join(FOLDER, "onnx", "model.onnx"), providers=["CPUExecutionProvider"])
INPUTS = [i.name for i in SESSION.get_inputs()]
TOKENIZER = Tokenizer.from_file(os.path.join(FOLDER, "tokenizer.json"))
TOKENIZER.enable_truncation(256)
TOKENIZER.enable_padding()


def embed(texts: list[str]) -> tuple[np.ndarray, int]:
    """The unit-length embeddings of ``texts`` and the tokens the model ran."""
    encodings = TOKENIZER.encode_batch(texts)
    given = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings],
             "token_type_ids": [e.type_ids for e in encodings]}
    feeds = {name: np.array(given[name], np.int64) for name in INPUTS}
    states = SESSION.run(None, feeds)[0]
    mask = feeds["attention_mask"][:, :, None].astype(np.float32)
    pooled = (states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12), int(mask.sum())


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ["REQUEST_METHOD"] != "POST" or environ["PATH_INFO"] != "/v1/embeddings":
        start_response("404 Not Found", [("Content-Length", "0")])
        return [b""]
    request = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
    texts = [request["input"]] if isinstance(request["input"], str) else request["input"]
    vectors, tokens = embed(texts)
    body = json.dumps({
        "object": "list", "model": request.get("model", ""),
        "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                              ("X-Worker-Pid", str(os.getpid()))])
    return [body]
