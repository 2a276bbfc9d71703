"""The HTTP front door (``serve --http``): gateway processes the supervisor starts, each a
client of the router.

- ``main``: the process, on the HTTP socket the supervisor bound; ``spec``: what it is started with.
- ``server``: aiohttp's server, the routes and the limits on connections, heads and bodies.
- ``dataplane``: what the routes ask of the pool (describe, resolve, infer), in no protocol's terms.
- ``kserve`` and ``openai``: the REST adapters, Open Inference Protocol (v2) and OpenAI embeddings.
- ``upstream``: the link to the router, one lane per HTTP connection.
- ``ops``: the probes and metrics, answered by the supervisor's operations endpoint.
"""
