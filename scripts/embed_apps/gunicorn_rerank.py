"""TEI-shaped ``POST /rerank`` from a cross-encoder exported to ONNX (``$RERANK_FOLDER``: its
``model.onnx`` and ``tokenizer.json``), as a WSGI app: what a user of gunicorn writes instead
of workerpool.

The session is built at import: once in the master under ``--preload``. Default onnxruntime
session options (``$RERANK_THREADS`` sets its intra-op threads); the query and each document tokenized as a pair (token types 0 and 1, the
longer side cut first at 512 tokens, as sentence-transformers' CrossEncoder does) and padded
to the longest pair of the request; the sigmoid of the logit; texts best first.
``X-Worker-Pid`` names the worker that answered.

    RERANK_FOLDER=ce-onnx gunicorn --preload --workers 2 --pythonpath scripts embed_apps.gunicorn_rerank:application
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

FOLDER = os.environ["RERANK_FOLDER"]
OPTIONS = ort.SessionOptions()
if os.environ.get("RERANK_THREADS"):  # else onnxruntime's default: a thread per core
    OPTIONS.intra_op_num_threads = int(os.environ["RERANK_THREADS"])
SESSION = ort.InferenceSession(os.path.join(FOLDER, "model.onnx"), OPTIONS, providers=["CPUExecutionProvider"])
INPUTS = [i.name for i in SESSION.get_inputs()]
TOKENIZER = Tokenizer.from_file(os.path.join(FOLDER, "tokenizer.json"))
TOKENIZER.enable_truncation(512)
TOKENIZER.enable_padding()


def scores(query: str, texts: list[str]) -> np.ndarray:
    """Each text's relevance to ``query``: the sigmoid of the cross-encoder's logit."""
    encodings = TOKENIZER.encode_batch([(query, text) for text in texts])
    given = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings],
             "token_type_ids": [e.type_ids for e in encodings]}
    logits = SESSION.run(None, {name: np.array(given[name], np.int64) for name in INPUTS})[0]
    return 1.0 / (1.0 + np.exp(-logits[:, 0]))


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ["REQUEST_METHOD"] != "POST" or environ["PATH_INFO"] != "/rerank":
        start_response("404 Not Found", [("Content-Length", "0")])
        return [b""]
    request = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
    found = scores(request["query"], request["texts"])
    ranked = sorted(range(len(found)), key=lambda i: -found[i])
    body = json.dumps([{"index": i, "score": float(found[i])} for i in ranked]).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                              ("X-Worker-Pid", str(os.getpid()))])
    return [body]
