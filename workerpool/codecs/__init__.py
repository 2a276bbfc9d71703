"""The HTTP protocols' bodies, read and written in the worker that runs the request (a text
API's request is read at the front door, each part's answer written in its worker).

- ``view``: the served model as the protocols describe it.
- ``kserve`` and ``openai``: the Open Inference Protocol's (v2) and OpenAI embeddings' bodies.
- ``tei`` and ``rerank``: Text Embeddings Inference's routes, and Cohere's and Jina's rerank.
- ``text_calls``: what the text APIs share: the request read at the door, pairs on the wire,
  scores of a classifier's logits.
- ``http_call``: an HTTP request through the router, both ends: the front door's frames and
  the worker's decoding and reply.
"""
