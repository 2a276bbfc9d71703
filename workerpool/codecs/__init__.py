"""The HTTP protocols' bodies, read and written in the worker that runs the request.

- ``view``: the served model as the protocols describe it.
- ``kserve`` and ``openai``: the Open Inference Protocol's (v2) and OpenAI embeddings' bodies.
- ``http_call``: an HTTP request through the router, both ends: the front door's frames and
  the worker's decoding and reply.
"""
