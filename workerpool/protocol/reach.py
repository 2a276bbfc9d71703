"""Whether a workerpool server is there at all, told apart from one that is only slow.

A command that sends a request and waits learns nothing until its timeout, however the
request was lost: nothing listening, the wrong port, keys the server refuses. Two quick looks
say which. First the peer's ZMTP greeting (23/ZMTP): a ZeroMQ peer sends it as soon as it
accepts, naming its security mechanism, so a wrong port or a missing ``--curve-key`` shows at
once. Then a real handshake with this client's keys, watched through a socket monitor, which
shows a refused key. Both complete in the server's I/O thread whatever its event loop is doing,
so a busy server passes and only then may a request be slow.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from collections.abc import Callable
from functools import partial

import zmq

from .. import endpoints
from ..errors import Unreachable
from ..runtime import ipc_path, socket_address
from ..security import ClientKeys
from ..units import MS_PER_SECOND
from .transport import MONITOR_EVENT

CONNECT_SECONDS = 2.0  # for a connection, and for the greeting that follows it
HANDSHAKE_SECONDS = 5.0  # generous: a CURVE server checks a key on a Python thread
# A ZMTP 3 greeting: a 10-byte signature, the major and minor version, then the mechanism
# name, NUL-padded to 20 bytes. This client sends its signature and major version, after which
# a ZMTP 3 peer sends the rest of its own greeting.
SIGNATURE = b"\xff" + bytes(8) + b"\x7f"
MAJOR_VERSION = 3
MECHANISM = slice(12, 32)

_WATCHED = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class NothingListens(Unreachable):
    """No process accepts connections there; after other failures something (a stuck server,
    another program) may still hold the endpoint."""


def check(endpoint: str, keys: ClientKeys | None = None, *,
          handshake_seconds: float = HANDSHAKE_SECONDS) -> None:
    """Return once a ZeroMQ peer at ``endpoint`` completes a handshake with this client's
    ``keys``; raise :class:`Unreachable` saying what is there instead."""
    check_greeting(endpoint, keys)
    _handshake(endpoint, keys, handshake_seconds)


def check_greeting(endpoint: str, keys: ClientKeys | None, seconds: float = CONNECT_SECONDS) -> None:
    """Raise :class:`Unreachable` unless a ZeroMQ peer answers at ``endpoint`` within
    ``seconds`` with the security mechanism that ``keys`` (or their absence) call for."""
    try:
        endpoints.check(endpoint)
    except ValueError as exc:
        raise Unreachable(str(exc)) from None
    mechanism = _greeting_mechanism(endpoint, seconds)
    if mechanism == "CURVE" and keys is None:
        raise Unreachable(f"{endpoint}: the server requires CURVE keys: give --curve-key and "
                          "--curve-server-key")
    if mechanism == "NULL" and keys is not None:
        raise Unreachable(f"{endpoint}: the server takes no CURVE keys: leave out --curve-key "
                          "and --curve-server-key")
    if mechanism not in ("CURVE", "NULL"):
        raise Unreachable(f"{endpoint}: a ZeroMQ peer with the {mechanism!r} security "
                          "mechanism, which workerpool never uses: wrong port?")


def _open(endpoint: str, seconds: float) -> socket.socket:
    """A plain connection: the kernel's reason (refused, unknown host) is the clearest."""
    transport, _, address = endpoint.partition("://")
    connect: Callable[[], socket.socket]
    if transport == "ipc":
        _check_is_socket(endpoint)
        connect = partial(_connect_unix, socket_address(address), seconds)
    else:
        host, _, port = address.rpartition(":")
        connect = partial(socket.create_connection, (host, int(port)), seconds)
    try:
        return connect()
    except FileNotFoundError:
        raise NothingListens(f"nothing listens at {endpoint}: {address} does not exist") from None
    except ConnectionRefusedError:
        hint = "is the server running, and on that address?" if transport != "ipc" \
            else "no server holds that name" if address.startswith("@") \
            else "a server that stopped left that socket file behind"
        raise NothingListens(f"nothing listens at {endpoint}: connection refused ({hint})") from None
    except OSError as exc:  # on a socket file (permissions, say), nothing is known of its owner
        failure = NothingListens if transport == "tcp" else Unreachable
        raise failure(f"cannot connect to {endpoint}: {exc.strerror or exc} (is the server "
                      "running, and on that address?)") from None


def _wrong_port(endpoint: str) -> str:
    return " (wrong port?)" if endpoint.startswith("tcp://") else ""


def _connect_unix(path: str, seconds: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.settimeout(seconds)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def _check_is_socket(endpoint: str) -> None:
    """A path that is something else gets its own answer, not "connection refused"."""
    path = ipc_path(endpoint)
    if path is None:  # Linux's abstract namespace: no file
        return
    with contextlib.suppress(FileNotFoundError):
        mode = os.stat(path).st_mode
        if not stat.S_ISSOCK(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a file"
            raise Unreachable(f"{endpoint}: {path} is {kind}, not a socket")


def _greeting_mechanism(endpoint: str, seconds: float) -> str:
    """The security mechanism a ZeroMQ peer at ``endpoint`` names in its greeting."""
    greeting, waited = b"", False
    with _open(endpoint, seconds) as sock:
        deadline = time.monotonic() + seconds
        try:
            sock.sendall(SIGNATURE + bytes([MAJOR_VERSION]))
            while len(greeting) < MECHANISM.stop and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(MECHANISM.stop - len(greeting))
                if not chunk:
                    break
                greeting += chunk
        except TimeoutError:
            waited = True
        except OSError:
            pass  # reset by the peer: what it sent before is still worth reading
    if not greeting and waited:
        raise Unreachable(f"something at {endpoint} accepted the connection but sent nothing in "
                          f"{seconds:g} s: a stopped or hung server, or not a workerpool "
                          f"endpoint{_wrong_port(endpoint)}")
    if not greeting:
        raise Unreachable(f"something at {endpoint} accepted the connection and closed it at once: "
                          f"not a workerpool endpoint{_wrong_port(endpoint)}")
    mechanism = greeting[MECHANISM].rstrip(b"\0")
    if len(greeting) < MECHANISM.stop or greeting[0] != SIGNATURE[0] \
            or greeting[9] != SIGNATURE[9] or greeting[10] < MAJOR_VERSION \
            or not (mechanism.isascii() and mechanism.isalnum()):  # never echo a peer's bytes
        raise Unreachable(f"{endpoint}: the peer does not speak ZeroMQ's protocol{_wrong_port(endpoint)}")
    return mechanism.decode("ascii")


def _handshake(endpoint: str, keys: ClientKeys | None, seconds: float) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = None
    try:
        if keys is not None:
            keys.apply(sock)
        monitor = sock.get_monitor_socket(_WATCHED)
        sock.connect(endpoint)
        _watch(endpoint, monitor, keys is not None, seconds)
    finally:
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)


def _watch(endpoint: str, monitor: zmq.Socket, with_keys: bool, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if not monitor.poll(max(1, int(left * MS_PER_SECOND))):
            break
        event, _ = MONITOR_EVENT.unpack(monitor.recv_multipart()[0][:MONITOR_EVENT.size])
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            raise Unreachable(f"{endpoint}: the server refused this client's key (its public key "
                              "belongs in the server's --curve-client-keys folder)")
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and with_keys:
            raise Unreachable(f"{endpoint}: the encrypted handshake failed: is --curve-server-key "
                              "this server's public key?")
        if event not in (zmq.EVENT_CONNECTED, zmq.EVENT_CONNECT_RETRIED):
            raise Unreachable(f"{endpoint}: the peer ended the ZeroMQ handshake: a server with no "
                              "room for more connections under its open file limit, or not a "
                              "workerpool endpoint")
    raise Unreachable(f"{endpoint}: no ZeroMQ handshake completed in {seconds:g} s")
