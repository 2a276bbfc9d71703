"""The pool's event loop: one poll over sockets and file descriptors, plus duties.

Everything a pool reacts to (a request, a worker's message, a dead child's pidfd, a signal
through the wakeup pipe, a control command) is a readable source with a handler, so events are
handled one at a time, in order, without locks. Time-driven work (deadlines, heartbeats,
watching the weight file) runs as duties between polls.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import time
from collections.abc import Callable
from typing import Any

import zmq

from ..units import MS_PER_SECOND

log = logging.getLogger(__name__)

DUTY_INTERVAL = 0.01  # seconds between runs of the duties while anything is urgent


class Loop:
    """Dispatches readable and writable sources to their handlers and runs duties at most every
    ``DUTY_INTERVAL``; sleeps up to ``idle_timeout`` seconds when nothing is urgent.

    ZeroMQ sockets are polled by ``zmq_poll``; plain descriptors (pipes, pidfds, HTTP
    connections) by one epoll set, whose own descriptor is among what ``zmq_poll`` watches: a
    turn costs the same with one HTTP connection or a thousand."""

    def __init__(self, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self._poller = zmq.Poller()
        self._epoll = select.epoll()
        self._poller.register(self._epoll.fileno(), zmq.POLLIN)
        self._watched: set[int] = set()  # descriptors in the epoll set
        self._readers: dict[Any, Callable[[], None]] = {}
        self._writers: dict[Any, Callable[[], None]] = {}
        self._duties: list[Callable[[], None]] = []
        self._urgent: list[Callable[[], bool]] = []
        self._due: list[Callable[[], float | None]] = []
        self._after: list[Callable[[], None]] = []
        self._next_duties = 0.0

    def read(self, source: Any, handler: Callable[[], None]) -> None:
        """Call ``handler`` whenever ``source`` (a ZeroMQ socket, a socket or a file descriptor)
        is readable."""
        self._readers[_key(source)] = handler
        self._register(source)

    def write(self, source: Any, handler: Callable[[], None] | None) -> None:
        """Call ``handler`` whenever ``source`` is writable; None: no longer."""
        if handler is None:
            if self._writers.pop(_key(source), None) is not None:
                self._register(source)
            return
        self._writers[_key(source)] = handler
        self._register(source)

    def pause(self, source: Any) -> None:
        """Stop reading ``source`` (writing to it goes on); ``read`` starts again."""
        if self._readers.pop(_key(source), None) is not None:
            self._register(source)

    def forget(self, source: Any) -> None:
        """Stop watching ``source``; before it is closed, so that its descriptor is free for reuse."""
        self._readers.pop(_key(source), None)
        self._writers.pop(_key(source), None)
        self._register(source)

    def _register(self, source: Any) -> None:
        key = _key(source)
        reading, writing = key in self._readers, key in self._writers
        if isinstance(key, zmq.Socket):
            events = (zmq.POLLIN if reading else 0) | (zmq.POLLOUT if writing else 0)
            if events:
                self._poller.register(key, events)
            elif key in self._poller:
                self._poller.unregister(key)
            return
        wanted = (select.EPOLLIN if reading else 0) | (select.EPOLLOUT if writing else 0)
        # What the epoll set holds is checked against the kernel, not only this table: a
        # descriptor closed elsewhere leaves the set by itself, and its number comes back.
        if not wanted:
            if key in self._watched:
                self._watched.discard(key)
                with contextlib.suppress(OSError):  # it left with its descriptor: nothing to remove
                    self._epoll.unregister(key)
            return
        try:
            self._epoll.modify(key, wanted)
        except FileNotFoundError:
            self._epoll.register(key, wanted)
        self._watched.add(key)

    def every_tick(self, duty: Callable[[], None], *, urgent: Callable[[], bool] | None = None,
                   due: Callable[[], float | None] | None = None) -> None:
        """Run ``duty`` between polls; while ``urgent()`` is true, poll at the duty interval;
        also run it at the monotonic time ``due()`` returns, to the millisecond."""
        self._duties.append(duty)
        if urgent is not None:
            self._urgent.append(urgent)
        if due is not None:
            self._due.append(due)

    def after_each_turn(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once the events and duties of a turn are handled (the router's shell
        sends what they asked to be sent)."""
        self._after.append(hook)

    def turn(self) -> None:
        """Wait for events, handle them, then run the duties if they are due."""
        urgent = any(check() for check in self._urgent)
        timeout = 2 * DUTY_INTERVAL if urgent else self.idle_timeout
        due = min((at for at in (check() for check in self._due) if at is not None), default=None)
        if due is not None:
            timeout = max(0.0, min(timeout, due - time.monotonic()))
        epoll = self._epoll.fileno()
        for source, events in self._poller.poll(math.ceil(timeout * MS_PER_SECOND)):
            if source == epoll:
                for fd, happened in self._epoll.poll(0):
                    self._dispatch(fd, bool(happened & ~select.EPOLLOUT), bool(happened & select.EPOLLOUT))
            else:
                self._dispatch(source, bool(events & ~zmq.POLLOUT), bool(events & zmq.POLLOUT))
        now = time.monotonic()
        if now >= self._next_duties or (due is not None and now >= due):
            self._next_duties = now + DUTY_INTERVAL
            for duty in self._duties:
                _survive(duty)
        for hook in self._after:
            _survive(hook)

    def _dispatch(self, source: Any, readable: bool, writable: bool) -> None:
        """Readable, or an error the reader hears; writable, or a paused source's error."""
        reader = self._readers.get(source)
        if reader is not None and readable:
            _survive(reader)
        if writable or (reader is None and readable):
            writer = self._writers.get(source)
            if writer is not None:
                _survive(writer)


def _key(source: Any) -> Any:
    """What the poll reports ``source`` as: a ZeroMQ socket itself, anything else by its descriptor."""
    return source if isinstance(source, zmq.Socket | int) else source.fileno()


def _survive(call: Callable[[], None]) -> None:
    """Run one handler; a system call that fails (out of descriptors or memory for sockets, a
    peer gone mid-call) is logged and the loop goes on: the next event may go better."""
    try:
        call()
    except (OSError, zmq.ZMQError) as exc:
        log.error("%s failed: %s; carrying on", getattr(call, "__qualname__", call), exc)
