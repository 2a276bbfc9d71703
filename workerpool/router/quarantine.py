"""Requests and clients that kill workers are refused instead of fed to more workers.

A request in flight on a worker that dies is retried once, alone (inference is idempotent, and
the worker may have died of something else: an operator's ``kill``, the OOM killer, its host
going away). A death alone blames nobody. A request is a killer only on evidence
(``recovery.py``): a second worker running it, or an identical request, alone crashed (a local worker's process died of
itself: SIGKILL, which operators, the OOM killer and kill sweeps send, is no evidence, nor is
SIGBUS, a weight file cut short, nor a worker host's link closing, which is how its host going
away looks), or it ran past ``--request-timeout``. Identical requests (same model, method,
arrays or texts, whatever their id) are then refused at once for ``REQUEST_TTL`` seconds, and a
client connection ``CLIENT_KILLS`` of whose distinct requests were killers within
``CLIENT_WINDOW`` seconds is refused for that window. New weights for a model forgive what
killed its workers. Both tables are bounded, oldest entries dropped first.
"""

from __future__ import annotations

import time
from _blake2 import blake2b  # hashlib's own; hashlib itself loads OpenSSL into the supervisor
from collections import OrderedDict
from typing import Any

from ..protocol import messages as protocol

REQUEST_TTL = 600.0
CLIENT_KILLS = 3
CLIENT_WINDOW = 60.0
MAX_ENTRIES = 1024


def fingerprint(frames: list[Any]) -> bytes | None:
    """What makes two requests (route, header, arrays or texts) the same: model, method, arrays
    and texts (not the id or deadline)."""
    try:
        header = protocol.decode_header(frames[1])
    except protocol.ProtocolError:
        return None
    digest = blake2b(digest_size=16)
    digest.update(protocol.encode_header({"model": header.get("model"), "method": header.get("method"),
                                          "arrays": header.get("arrays"), "texts": header.get("texts"),
                                          "frames": [len(frame) for frame in frames[2:]]}))
    for frame in frames[2:]:
        digest.update(frame.buffer if hasattr(frame, "buffer") else frame)
    return digest.digest()


class Quarantine:
    """Remembers killer requests and the clients that send them."""

    def __init__(self) -> None:
        self._requests: OrderedDict[bytes, float] = OrderedDict()  # fingerprint -> refused until
        self._kills: OrderedDict[bytes, dict[bytes, float]] = OrderedDict()  # client -> killer -> when
        self._models: dict[bytes, str] = {}  # fingerprint -> the model it killed workers of
        self._suspects: OrderedDict[bytes, tuple[float, str]] = OrderedDict()  # fingerprint -> when, of which model

    def __bool__(self) -> bool:
        return bool(self._requests or self._kills)

    def clear(self, model: str) -> None:
        """New weights for ``model``: what killed its workers before may not now."""
        forgiven = {key for key, killed in self._models.items() if killed == model}
        for key in [key for key, (_, suspected) in self._suspects.items() if suspected == model]:
            del self._suspects[key]
        for key in forgiven:
            self._requests.pop(key, None)
            del self._models[key]
        for client, kills in list(self._kills.items()):
            for key in forgiven & kills.keys():
                del kills[key]
            if not kills:
                del self._kills[client]

    def killed(self, client: bytes, frames: list[Any], model: str) -> None:
        """A request of ``client`` for ``model`` proved a killer: it killed a worker running it
        alone after failing once, or ran out of time."""
        key = fingerprint(frames)
        if key is not None:
            self._quarantine(client, key, model)

    def _quarantine(self, client: bytes, key: bytes, model: str) -> None:
        self._models[key] = model
        now = time.monotonic()
        self._requests.pop(key, None)
        self._requests[key] = now + REQUEST_TTL
        kills = {k: t for k, t in self._kills.pop(client, {}).items() if now - t < CLIENT_WINDOW}
        kills[key] = now
        self._kills[client] = kills
        for table in (self._kills, self._requests):
            while len(table) > MAX_ENTRIES:
                table.popitem(last=False)
        if len(self._models) > 2 * MAX_ENTRIES:  # keep the models of those still remembered
            live = self._requests.keys() | {k for kills in self._kills.values() for k in kills}
            self._models = {k: m for k, m in self._models.items() if k in live}

    def suspected(self, client: bytes, frames: list[Any], model: str) -> bool:
        """A request crashed the worker running it alone: whether an identical one did so within
        ``REQUEST_TTL`` (then it is a killer, quarantined now); else it is remembered."""
        key = fingerprint(frames)
        if key is None:
            return False
        now = time.monotonic()
        before = self._suspects.pop(key, None)
        if before is not None and now - before[0] < REQUEST_TTL:
            self._quarantine(client, key, model)  # hashed once: the request may be megabytes
            return True
        self._suspects[key] = (now, model)
        while len(self._suspects) > MAX_ENTRIES:
            self._suspects.popitem(last=False)
        return False

    def refusal(self, client: bytes, frames: list[Any]) -> str | None:
        """Why this request is refused, or None. Costs a hash only while anything is held."""
        now = time.monotonic()
        kills = [t for t in self._kills.get(client, {}).values() if now - t < CLIENT_WINDOW]
        if len(kills) >= CLIENT_KILLS:
            return (f"{len(kills)} different requests from this connection killed workers or ran past "
                    f"--request-timeout in the last {CLIENT_WINDOW:g}s; it is refused until that passes")
        if not kills:
            self._kills.pop(client, None)
        if not self._requests:
            return None
        key = fingerprint(frames)
        until = None if key is None else self._requests.get(key)
        if key is None or until is None:
            return None
        if now >= until:
            del self._requests[key]
            return None
        return "an identical request killed workers or ran past --request-timeout; it is refused"
