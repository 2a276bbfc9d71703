"""A WSGI app serving the Burnpack model at ``$COMPARE_MODEL``: what a user of ``gunicorn
--preload`` would write instead of workerpool.

The weights are mapped and the model built at import, so with ``--preload`` the master does it
once and the forked workers share the mapping. ``POST /`` takes raw float32 bytes, a whole
number of rows of the model's input width, and answers the output's raw bytes; the
``X-Worker-Pid`` header names the worker that answered. ``GET /threads`` answers the worker's
BLAS and OpenMP thread counts, as threadpoolctl reads them.

    COMPARE_MODEL=model.bpk gunicorn --preload --worker-class gthread \\
        -c scripts/compare_app/gunicorn_conf.py --pythonpath scripts compare_app.app:application
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

from workerpool import burnpack, models

Environ = dict[str, Any]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]

PACK = burnpack.read(os.environ["COMPARE_MODEL"])
MODEL = models.build_model(PACK.tensors, PACK.metadata)
WIDTH = int(models.Contract.of(MODEL, "mlp").info()["inputs"][0]["shape"][-1])


def infer(body: bytes) -> bytes | None:
    """The model's output for ``body``'s rows, or None when it is not whole rows of float32."""
    row = 4 * WIDTH
    if not body or len(body) % row:
        return None
    x = np.frombuffer(body, dtype=np.float32).reshape(len(body) // row, WIDTH)
    return np.ascontiguousarray(MODEL(x), dtype=np.float32).tobytes()


def threads() -> bytes:
    return json.dumps({p["internal_api"]: p["num_threads"] for p in threadpool_info()}).encode()


def respond(start_response: StartResponse, status: str, body: bytes, kind: str) -> list[bytes]:
    start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body))),
                            ("X-Worker-Pid", str(os.getpid()))])
    return [body]


def application(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"] == "/threads":
        return respond(start_response, "200 OK", threads(), "application/json")
    if environ["REQUEST_METHOD"] != "POST":
        return respond(start_response, "405 Method Not Allowed", b"", "text/plain")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    output = infer(environ["wsgi.input"].read(length))
    if output is None:
        return respond(start_response, "400 Bad Request",
                       f"expected rows of {WIDTH} float32\n".encode(), "text/plain")
    return respond(start_response, "200 OK", output, "application/octet-stream")
