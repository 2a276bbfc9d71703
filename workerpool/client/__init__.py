"""The clients: ``Client`` (blocking, in ``sync``) and ``AsyncClient`` (asyncio, in ``aio``) over
one ``BaseClient`` (``base``) that keeps what they share: the connection's state (``link``) and
the calls in flight with their retries (``calls``)."""
