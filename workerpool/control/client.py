"""Talking to a running supervisor over its control socket (``status``, ``reload``, ``check``,
``modules``)."""

from __future__ import annotations

import json
from typing import Any

import zmq

from ..errors import NotAJSONObject, json_object
from ..protocol import reach
from ..units import MS_PER_SECOND


class ControlError(Exception):
    """No supervisor answered, or it answered with an error."""


class Unanswered(ControlError):
    """No answer came: no server, something else at the endpoint, or a server stuck."""


class NoServer(Unanswered):
    """No process listens at the endpoint (a socket file left by a server that is gone, say)."""


def call(endpoint: str, command: str, *, timeout: float = 5.0, **arguments: Any) -> dict[str, Any]:
    """Send one command and return the supervisor's JSON answer."""
    try:
        reach.check(endpoint, handshake_seconds=reach.HANDSHAKE_SECONDS if timeout < 0
                    else min(timeout, reach.HANDSHAKE_SECONDS))
    except reach.NothingListens as exc:
        raise NoServer(str(exc)) from None
    except reach.Unreachable as exc:
        raise Unanswered(str(exc)) from None
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", json.dumps({"command": command, **arguments}).encode()])
        # poll takes whole milliseconds; pyzmq truncated a float and waited forever when negative.
        if not sock.poll(None if timeout < 0 else int(timeout * MS_PER_SECOND)):
            raise Unanswered(f"the server at {endpoint} completed a handshake but did not "
                               f"answer in {timeout:g} s: its loop is stuck or very busy (give it longer "
                               "with --timeout)")
        frames = sock.recv_multipart()
    finally:
        sock.close(linger=0)
    try:
        answer = json_object(frames[-1])
    except NotAJSONObject as exc:
        raise ControlError(f"{endpoint} answered something that is not JSON" if exc.found is None
                           else f"{endpoint} is not a control socket: it answered {exc.found}") from exc
    if "error" in answer:
        if not isinstance(answer["error"], str):  # a protocol reply: this is a client endpoint
            raise ControlError(f"{endpoint} is not a control socket: it answers as a server's "
                               "client endpoint does")
        raise ControlError(answer["error"])
    return answer
