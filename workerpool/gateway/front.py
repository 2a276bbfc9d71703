"""The HTTP front door's thread: an event loop (uvloop when installed) serving aiohttp on the
socket the supervisor bound, beside the router's loop in the same process.

Stopping closes the listening socket, lets the requests under way finish (the router answers
what it took, or ``shutting_down`` to what it no longer takes) and ends the thread.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from ..router.local import LocalClients
from .dataplane import DataPlane, Describe
from .ops import Answer, OpsRoutes
from .server import Gateway, make_server
from .upstream import REPLY_SLACK, RouterLink


@dataclass(frozen=True)
class FrontSettings:
    model_name: str
    max_body: int  # bytes; a larger request body is answered 413 before it is read
    max_buffered: int  # bytes of request bodies held at once, over every connection
    max_connections: int
    max_refused: int  # connections past max_connections that may wait for their 503 to be read
    request_timeout: float
    client_timeout: float  # --http-timeout
    token: bytes | None = None
    tls: ssl.SSLContext | None = None


class HttpFront:
    """aiohttp on its own thread, handing requests to the router through ``clients``."""

    def __init__(self, sock: socket.socket, settings: FrontSettings, ops: Answer, clients: LocalClients,
                 describe: Describe) -> None:
        self.socket = sock
        self._describe = describe
        self.settings = settings
        self._ops = ops
        self._clients = clients
        self._loop = _new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure

    def stop(self, meanwhile: Callable[[float], None]) -> None:
        """End the thread, calling ``meanwhile(seconds)`` while it finishes (the router's
        answers to what it still hands over)."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        while self._thread.is_alive():
            meanwhile(0.05)
            self._thread.join(0)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        settings = self.settings
        try:
            link = RouterLink(self._clients, self._loop)
            plane = DataPlane(link, settings.model_name, self._describe, request_timeout=settings.request_timeout)
            gateway = Gateway(plane, OpsRoutes(self._ops), max_body=settings.max_body,
                              max_buffered=settings.max_buffered, token=settings.token,
                              client_timeout=settings.client_timeout)
            runner = web.ServerRunner(make_server(gateway, settings.max_connections, settings.max_refused), handle_signals=False,
                                      shutdown_timeout=settings.request_timeout + REPLY_SLACK)
            await runner.setup()
            await web.SockSite(runner, self.socket, ssl_context=settings.tls).start()
            self._stop = asyncio.Event()
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            self._started.set()
        await self._stop.wait()
        await runner.cleanup()


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
