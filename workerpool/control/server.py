"""The supervisor's control socket: a local ROUTER that answers ``status``, ``reload``, ``check``
and ``modules``.

Control is not authenticated, so it is only ever an ipc socket (mode 0600) in a directory
only this user can enter (0700). The endpoint is claimed first (a socket file left by a dead server is removed; a live one is never
taken over), bound for this user only (0600), and unlinked at exit. Each command has its own
handler; a handler answers at once, or returns None and answers later through :meth:`reply`.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

import zmq

from .. import runtime
from ..config.pool import StartupError
from ..events.loop import Loop
from . import client as control

log = logging.getLogger(__name__)

Handler = Callable[[bytes, dict[str, Any]], dict[str, Any] | None]
CLAIM_TIMEOUT = 2.0
OWNER_ONLY_UMASK = 0o177  # sockets created while it is set are rw for this user only


class ControlServer:
    """Binds the control endpoint and dispatches each command to its handler."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        path = runtime.ipc_path(endpoint)
        if path is None:
            raise StartupError(f"the control endpoint {endpoint} must be ipc://PATH: control is not "
                               "authenticated, so only a socket file that only this user can open will "
                               "do (an abstract ipc://@name is open to every user)")
        _check_private(os.path.dirname(os.path.abspath(path)))
        self.endpoint = endpoint
        self.handlers: dict[str, Handler] = {}  # given when bound: commands may need this server to answer
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)

    def claim(self) -> None:
        """Remove a socket file left by a server that died; refuse one a live server answers on."""
        path = runtime.ipc_path(self.endpoint)
        if path is None or not os.path.exists(path):
            return
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise StartupError(f"control endpoint {self.endpoint}: {path} exists and is not a "
                               "socket; choose another --control")
        try:
            control.call(self.endpoint, "status", timeout=CLAIM_TIMEOUT, memory=False)
        except control.NoServer:
            os.unlink(path)
            return
        except control.ControlError:
            pass  # a server too busy (or stopped) to answer still holds its socket
        raise StartupError(f"another server listens on control endpoint {self.endpoint}: stop it, or "
                           "give this one its own --control ipc://DIR/control.sock (DIR a folder of "
                           "yours, mode 0700) and --bind")

    def bind(self, loop: Loop, cleanup: ExitStack, handlers: Mapping[str, Handler]) -> None:
        """Bind the endpoint (after ``claim``) and answer each command from ``loop`` with its
        handler; unlink it at exit."""
        self.handlers = dict(handlers)
        old_umask = os.umask(OWNER_ONLY_UMASK)
        try:
            self.socket.bind(self.endpoint)
        except zmq.ZMQError as exc:
            raise StartupError(f"cannot bind control endpoint {self.endpoint}: {exc}") from exc
        finally:
            os.umask(old_umask)
        path = runtime.ipc_path(self.endpoint)
        if path is not None:
            cleanup.callback(_unlink_if_present, path)
        loop.read(self.socket, self._on_readable)

    def reply(self, client: bytes, answer: dict[str, Any]) -> None:
        try:
            self.socket.send_multipart([client, b"", json.dumps(answer).encode()])
        except zmq.ZMQError as exc:
            log.debug("control reply dropped: %s", exc)

    def _on_readable(self) -> None:
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            answer = self._answer(frames)
            if answer is not None:
                self.reply(frames[0], answer)

    def _answer(self, frames: list[bytes]) -> dict[str, Any] | None:
        try:
            request = json.loads(frames[-1])
            command = request["command"]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            return {"error": "malformed control request"}
        handler = self.handlers.get(command) if isinstance(command, str) else None
        if handler is None:
            return {"error": f"unknown control command {command!r}"}
        try:
            return handler(frames[0], request)
        except Exception as exc:  # a bad argument must not stop the server
            log.exception("control command %s failed", command)
            return {"error": f"{command} failed: {type(exc).__name__}: {exc}"}


def _check_private(directory: str) -> None:
    """The control socket's directory must be ours and closed to others (mode 0700)."""
    try:
        st = os.stat(directory)
    except OSError as exc:
        hint = f" (create it: mkdir -m 700 {directory})" if isinstance(exc, FileNotFoundError) else ""
        raise StartupError(f"cannot use {directory} for the control socket: {exc.strerror}{hint}") from exc
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise StartupError(f"the control socket's directory {directory} must be owned by this user "
                           f"with mode 0700 (it is {stat.filemode(st.st_mode)}): anyone who can open "
                           "the socket can control the server")


def _unlink_if_present(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
