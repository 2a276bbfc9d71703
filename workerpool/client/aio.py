"""The asyncio client: the blocking client's semantics on ``zmq.asyncio``, shareable by coroutines.

All but the waiting lives in ``base.py``; here one reader task polls the socket and
each caller awaits a future that its call's outcome resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any, Self

import zmq.asyncio

from ..errors import RemoteError
from ..protocol import messages as protocol
from ..protocol.messages import Inputs
from .base import BaseClient
from .calls import Call, Outputs, Result


class AsyncClient(BaseClient[zmq.asyncio.Socket]):
    """asyncio client for a workerpool server; same constructor, timeouts and retries as ``Client``.

    Any number of coroutines on one event loop may await it at once: their requests are
    pipelined on the one socket, and a single reader task routes each reply to its caller by
    request id (and runs the retry policy). Use it from one event loop and one thread only.
    Cancelling a call abandons it; its late reply is discarded.
    """

    _socket_class = zmq.asyncio.Socket
    _poller_class = zmq.asyncio.Poller
    _poller: zmq.asyncio.Poller
    _reader: asyncio.Task[None] | None = None
    _limit_asked: asyncio.Future[dict[str, Any]] | None = None

    @staticmethod
    def _settled(outcome: Any) -> Any:
        """zmq.asyncio settles a non-blocking socket call at once, as a future."""
        return outcome.result() if asyncio.isfuture(outcome) else outcome

    async def request(self, x: Inputs, *, deadline: float | None = None, model: str | None = None) -> Result:
        """Run the model on ``x``; see ``Client.request``."""
        return (await self._wait(await self._start_infer(x, deadline, model))).result()

    async def infer(self, x: Inputs, *, deadline: float | None = None, model: str | None = None) -> Outputs:
        """Like ``request``, returning only the outputs."""
        return (await self.request(x, deadline=deadline, model=model)).outputs

    async def info(self, *, model: str | None = None) -> dict[str, Any]:
        """The server's description of itself and of ``model`` (its only model when None)."""
        self._take_news()
        return (await self._wait(self._start(None, protocol.METHOD_INFO, None, model))).info()

    def infer_many(
        self,
        inputs: Iterable[Inputs] | AsyncIterable[Inputs],
        *,
        window: int = 8,
        deadline: float | None = None,
        model: str | None = None,
    ) -> AsyncIterator[Outputs]:
        """Outputs in input order with up to ``window`` in flight; see ``Client.infer_many``."""
        if window < 1:
            raise ValueError(f"window must be >= 1, not {window!r}")
        return self._pipeline(inputs, window, deadline, model)

    async def close(self) -> None:
        """Stop the reader, fail calls still waiting, close the socket at once."""
        if self._socket is None:
            return
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._shut()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _pipeline(
        self, inputs: Iterable[Inputs] | AsyncIterable[Inputs], window: int, deadline: float | None,
        model: str | None,
    ) -> AsyncIterator[Outputs]:
        calls: deque[Call] = deque()
        try:
            async for x in _aiter(inputs):
                calls.append(await self._start_infer(x, deadline, model))
                if len(calls) == window:
                    yield (await self._wait(calls.popleft())).result().outputs
            while calls:
                yield (await self._wait(calls.popleft())).result().outputs
        finally:
            for call in calls:
                self._calls.forget(call)

    async def _start_infer(self, x: Inputs, deadline: float | None, model: str | None) -> Call:
        """``Client._start_infer``; callers that need the limit at once share one ``info`` call."""
        self._take_news()
        if self._calls.must_learn_limit(x):
            if self._limit_asked is None or self._limit_asked.done():
                self._limit_asked = asyncio.ensure_future(self.info(model=model))
            with contextlib.suppress(RemoteError):  # any reply states the server's limit
                await asyncio.shield(self._limit_asked)
        return self._start(x, protocol.METHOD_INFER, deadline, model)

    def _start(self, payload: Inputs | None, method: str, deadline: float | None,
               model: str | None = None) -> Call:
        call = super()._start(payload, method, deadline, model)
        if self._calls.outstanding and (self._reader is None or self._reader.done()):
            self._reader = asyncio.get_running_loop().create_task(self._read())
        return call

    async def _wait(self, call: Call) -> Call:
        if not call.done:
            waiter = asyncio.get_running_loop().create_future()
            call.on_done = functools.partial(_wake, waiter)
            try:
                await waiter
            finally:
                self._calls.forget(call)
        return call

    async def _read(self) -> None:
        """The single reader: runs while any call is outstanding, then exits (``_start`` restarts it)."""
        try:
            while self._calls.outstanding:
                poll_ms = self._poll_ms()
                if poll_ms is not None:
                    self._open()
                    self._take(dict(await self._poller.poll(poll_ms)))
        except Exception as exc:  # noqa: BLE001 - whatever stops the reader must reach every caller
            self._calls.abandon(exc)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # a cancelled caller's waiter is already done
        waiter.set_result(None)


async def _aiter(items: Iterable[Inputs] | AsyncIterable[Inputs]) -> AsyncIterator[Inputs]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
