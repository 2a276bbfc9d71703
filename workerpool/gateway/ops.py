"""``/metrics``, ``/healthz``, ``/readyz`` and the v2 health routes: answered by the
supervisor's operations endpoint (``workerpool.ops.http``, on loopback), which this gateway
asks on each probe, so they say what the supervisor's loop says."""

from __future__ import annotations

import aiohttp
from aiohttp import web

OPS_TIMEOUT = 5.0  # seconds: a little past the supervisor's own patience with its loop


class OpsProxy:
    def __init__(self, url: str) -> None:
        self.url = url
        self._session: aiohttp.ClientSession | None = None

    async def get(self, path: str) -> web.Response:
        """The operations endpoint's answer to ``path``, passed through."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=OPS_TIMEOUT))
        try:
            async with self._session.get(self.url + path) as answer:
                body = await answer.read()
                return web.Response(status=answer.status, body=body,
                                    content_type=answer.content_type, charset=answer.charset)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.Response(status=503, text=f"the supervisor's operations endpoint did not "
                                f"answer: {exc or type(exc).__name__}\n")

    async def ok(self, path: str) -> bool:
        return (await self.get(path)).status == 200

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
