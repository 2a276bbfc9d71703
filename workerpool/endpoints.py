"""What a ZeroMQ endpoint must look like, checked before any socket sees it.

libzmq answers a mistyped endpoint with ``Invalid argument``, and one it cannot reach (an IPv6
address on a socket without IPv6, say) with silence; the command line and the client check
first and say what to write instead.
"""

from __future__ import annotations

TRANSPORTS = ("tcp://", "ipc://")
DEFAULT_BIND = "tcp://127.0.0.1:5555"  # where serve listens and clients connect: loopback only


def check(text: str, *, bind: bool = False) -> str:
    """``text`` if it is ``tcp://HOST:PORT`` or ``ipc://PATH`` (``HOST`` may be ``*`` and
    ``PORT`` ``*`` when ``bind``); else ``ValueError`` naming what to write instead."""
    scheme, sep, rest = text.partition("://")
    if not text.strip() or text != text.strip():
        raise ValueError(f"{text!r}: an endpoint is tcp://HOST:PORT or ipc://PATH, with no spaces")
    if not sep:
        address = f"127.0.0.1:{text}" if text.isascii() and text.isdigit() else text
        raise ValueError(f"{text!r} names no transport: write tcp://{address} (or ipc://PATH for "
                         "a local socket)")
    if scheme in ("http", "https"):
        raise ValueError(f"{text!r}: an HTTP address, but this speaks ZeroMQ: write "
                         "tcp://HOST:PORT, the server's --bind (its --http port is for HTTP "
                         "clients: KServe v2, OpenAI embeddings, metrics and probes)")
    if scheme == "inproc":
        raise ValueError(f"{text!r}: inproc:// reaches only sockets inside one process; use "
                         "tcp:// or ipc://")
    if scheme == "ipc":
        if not rest:
            raise ValueError(f"{text!r} names no path: write ipc://PATH")
        return text
    if scheme != "tcp":
        raise ValueError(f"{text!r}: the transport {scheme + '://'!r} is not supported; use tcp:// "
                         "or ipc://")
    host, colon, port = rest.rpartition(":")
    if host.startswith("[") or ":" in host:
        raise ValueError(f"{text!r}: IPv6 addresses are not supported; use an IPv4 address or a "
                         "host name")
    if not colon or not host:
        raise ValueError(f"{text!r} names no port: write tcp://HOST:PORT")
    if host == "*" and not bind:
        raise ValueError(f"{text!r}: * binds every interface; to connect, name the host, such "
                         f"as tcp://127.0.0.1:{port}")
    if not (bind and port == "*") and not (port.isascii() and port.isdigit()
                                            and 0 < int(port) < 2**16):
        free = f" (or * for a free one: tcp://{host}:*)" if bind else ""
        raise ValueError(f"{text!r}: not tcp://HOST:PORT with a port from 1 to 65535{free}")
    return text
