"""Load over HTTP/1.1 from raw sockets: keep-alive connections with one request in flight each,
counted as ``zmq_load.drive`` counts workerpool's, and a warm-up that reaches every worker."""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .zmq_load import REPLY_TIMEOUT, WARMUP_TIMEOUT, summary

Reply = tuple[dict[str, str], bytes]


def http_request(body: bytes, method: str = "POST", path: str = "/",
                 content_type: str = "application/octet-stream") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def post_json(port: int, path: str, document: Any) -> Any:
    """``document`` POSTed as JSON to ``path`` on a loopback server, its JSON answer; RuntimeError
    for any status but 200."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", path, json.dumps(document), {"Content-Type": "application/json"})
        reply = connection.getresponse()
        body = reply.read()
    finally:
        connection.close()
    if reply.status != 200:
        raise RuntimeError(f"{path} answered {reply.status}: {body[:200]!r}")
    return json.loads(body)


def kserve_body(row: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A binary KServe v2 request of ``row`` (the JSON head, then the raw floats) and its headers."""
    head = json.dumps({"inputs": [{"name": "input", "shape": list(row.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": row.nbytes}}],
                       "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    return head + row.tobytes(), {"Content-Type": "application/octet-stream",
                                  "Inference-Header-Content-Length": str(len(head))}


def parse_reply(buffer: bytearray) -> tuple[int, Reply] | None:
    """The length, headers and body of the whole 200 reply at the start of ``buffer``, if it is
    there."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    status, *lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    if not status.startswith("HTTP/1.1 200"):
        raise RuntimeError(f"the server answered {status!r}")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    total = end + 4 + int(headers["content-length"])
    if len(buffer) < total:
        return None
    return total, (headers, bytes(buffer[end + 4:total]))


@dataclass
class Connection:
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    sent_at: float = 0.0

    @classmethod
    def open(cls, port: int) -> Connection:
        sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def send(self, request: bytes) -> None:
        self.sent_at = time.perf_counter()
        self.sock.sendall(request)

    def read(self) -> Reply | None:
        """Take what has arrived; the reply once it is whole."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise RuntimeError("the server closed a keep-alive connection")
        self.buffer += data
        parsed = parse_reply(self.buffer)
        if parsed is None:
            return None
        del self.buffer[:parsed[0]]
        return parsed[1]

    def wait(self) -> Reply:
        """Block until the reply is whole (the socket's timeout bounds each read)."""
        while (reply := self.read()) is None:
            pass
        return reply

    def exchange(self, request: bytes) -> Reply:
        self.send(request)
        return self.wait()


def warm_http_workers(proc: subprocess.Popen[bytes], port: int, request: bytes, workers: int,
                      server: str = "gunicorn") -> set[int]:
    """Open ``2 * workers`` new connections at a time, one request each, until every worker has
    answered one (each connection stays with the worker that accepted it); their pids, from the
    ``X-Worker-Pid`` header. Any server whose replies carry that header will do (``server``
    names it in errors)."""
    seen: set[str] = set()
    deadline = time.monotonic() + WARMUP_TIMEOUT
    while len(seen) < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {workers} {server} workers answered "
                               f"(exit code {proc.poll()})")
        connections = [Connection.open(port) for _ in range(2 * workers)]
        for connection in connections:
            connection.send(request)
        for connection in connections:
            seen.add(connection.wait()[0]["x-worker-pid"])
            connection.sock.close()
    return {int(pid) for pid in seen}


def http_drive(port: int, request: bytes, in_flight: int, seconds: float) -> dict[str, Any]:
    """``zmq_load.drive`` over HTTP: ``in_flight`` keep-alive connections, one request
    outstanding on each, for ``seconds``; counted the same way (replies after the end are
    drained, not counted)."""
    connections = [Connection.open(port) for _ in range(in_flight)]
    for _ in range(3):  # warm up connections and caches
        for connection in connections:
            connection.exchange(request)
    latencies: list[float] = []
    with selectors.DefaultSelector() as selector:
        for connection in connections:
            selector.register(connection.sock, selectors.EVENT_READ, connection)
            connection.send(request)
        start = time.perf_counter()
        end = start + seconds
        outstanding = in_flight
        counting = True
        while outstanding:
            events = selector.select(REPLY_TIMEOUT)
            if not events:
                raise RuntimeError(f"no HTTP reply in {REPLY_TIMEOUT:g}s")
            for key, _ in events:
                connection = key.data
                if connection.read() is None:
                    continue
                now = time.perf_counter()
                if counting:
                    latencies.append(now - connection.sent_at)
                    counting = now < end
                if counting:
                    connection.send(request)
                else:
                    outstanding -= 1
        elapsed = time.perf_counter() - start
    for connection in connections:
        connection.sock.close()
    return summary(in_flight, latencies, elapsed)
