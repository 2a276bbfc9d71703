"""``/metrics``, ``/healthz``, ``/readyz`` and the v2 health routes: answered by the
supervisor's operations answers (``workerpool.ops.http``), which wait for the router's loop, so
they run on the executor's threads and never on this event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

Answer = Callable[[str], tuple[int, str, bytes]]


class OpsRoutes:
    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def get(self, path: str) -> web.Response:
        status, content_type, body = await asyncio.get_running_loop().run_in_executor(None, self._answer, path)
        kind, _, charset = content_type.partition("; charset=")
        return web.Response(status=status, body=body, content_type=kind, charset=charset or None)
