"""The HTTP front door (``serve --http``): aiohttp on a thread of the supervisor, whose
requests go to the router in-process as a ZeroMQ client's would.

- ``front``: the thread and its event loop, on the socket the supervisor bound.
- ``server``: aiohttp's server, the routes and the limits on connections, heads and bodies.
- ``dataplane``: what the routes ask of the pool (describe, resolve, infer), in no protocol's terms.
- ``kserve`` and ``openai``: the REST adapters, Open Inference Protocol (v2) and OpenAI embeddings.
- ``upstream``: the link to the router, one client per HTTP connection.
- ``ops``: the probes and metrics, answered off the event loop by ``workerpool.ops.http``.
"""
