"""The asyncio client: the blocking client's semantics on ``zmq.asyncio``, shareable by coroutines."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any, Self

import zmq
import zmq.asyncio

from . import protocol
from .client import DEFAULT_ENDPOINT, Outputs, Result, _Call, _Calls, _open_socket, _poll_ms, _send
from .errors import WorkerpoolError
from .protocol import Inputs
from .security import ClientKeys


class AsyncClient:
    """asyncio client for a workerpool server; same constructor, timeouts and retries as ``Client``.

    Any number of coroutines on one event loop may await it at once: their requests are
    pipelined on the one socket, and a single reader task routes each reply to its caller by
    request id (and runs the retry policy). Use it from one event loop and one thread only.
    Cancelling a call abandons it; its late reply is discarded.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        context: zmq.Context | None = None,
        keys: ClientKeys | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._keys = keys
        self._context = context or zmq.Context.instance()
        self._calls = _Calls(endpoint, timeout, retries, on_done=self._wake)
        self._socket: zmq.asyncio.Socket | None = _open_socket(
            self._context, endpoint, zmq.asyncio.Socket, keys
        )
        self._waiters: dict[_Call, asyncio.Future[None]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def request(self, x: Inputs, *, deadline: float | None = None) -> Result:
        """Run the model on ``x``; see ``Client.request``."""
        return (await self._wait(self._start(x, protocol.METHOD_INFER, deadline))).result()

    async def infer(self, x: Inputs, *, deadline: float | None = None) -> Outputs:
        """Like ``request``, returning only the outputs."""
        return (await self.request(x, deadline=deadline)).outputs

    async def info(self) -> dict[str, Any]:
        """The server's description of itself and its model."""
        return (await self._wait(self._start(None, protocol.METHOD_INFO, None))).info()

    def infer_many(
        self,
        inputs: Iterable[Inputs] | AsyncIterable[Inputs],
        *,
        window: int = 8,
        deadline: float | None = None,
    ) -> AsyncIterator[Outputs]:
        """Outputs in input order with up to ``window`` in flight; see ``Client.infer_many``."""
        if window < 1:
            raise ValueError(f"window must be >= 1, not {window!r}")
        return self._pipeline(inputs, window, deadline)

    async def close(self) -> None:
        """Stop the reader, fail calls still waiting, close the socket at once."""
        if self._socket is None:
            return
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._calls.close()
        self._socket.close(linger=0)
        self._socket = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _pipeline(
        self, inputs: Iterable[Inputs] | AsyncIterable[Inputs], window: int, deadline: float | None
    ) -> AsyncIterator[Outputs]:
        calls: deque[_Call] = deque()
        try:
            async for x in _aiter(inputs):
                calls.append(self._start(x, protocol.METHOD_INFER, deadline))
                if len(calls) == window:
                    yield (await self._wait(calls.popleft())).result().outputs
            while calls:
                yield (await self._wait(calls.popleft())).result().outputs
        finally:
            for call in calls:
                self._calls.forget(call)

    def _start(self, payload: Inputs | None, method: str, deadline: float | None) -> _Call:
        self._open()
        call = self._calls.start(payload, method, deadline, self._send)
        if self._calls.outstanding and (self._reader is None or self._reader.done()):
            self._reader = asyncio.get_running_loop().create_task(self._read())
        return call

    def _send(self, frames: list) -> None:
        _send(self._open(), frames)

    async def _wait(self, call: _Call) -> _Call:
        if not call.done:
            waiter = self._waiters[call] = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                del self._waiters[call]
                self._calls.forget(call)
        return call

    def _wake(self, call: _Call) -> None:
        waiter = self._waiters.get(call)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _read(self) -> None:
        """The single reader: runs while any call is outstanding, then exits (``_start`` restarts it)."""
        try:
            while self._calls.outstanding:
                socket = self._open()
                delay = self._calls.next_expiry() - time.monotonic()
                if delay <= 0:
                    self._reset()
                elif await socket.poll(_poll_ms(delay), zmq.POLLIN):
                    self._calls.reply(await socket.recv_multipart(copy=False))
        except Exception as exc:  # noqa: BLE001 - whatever stops the reader must reach every caller
            self._calls.abandon(exc)

    def _reset(self) -> None:
        self._open().close(linger=0)
        self._socket = _open_socket(self._context, self.endpoint, zmq.asyncio.Socket, self._keys)
        self._calls.retry(time.monotonic(), self._send)

    def _open(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            raise WorkerpoolError("the client is closed")
        return self._socket


async def _aiter(items: Iterable[Inputs] | AsyncIterable[Inputs]) -> AsyncIterator[Inputs]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
