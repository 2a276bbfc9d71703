"""How the ``serve`` role is built: every part bound and wired once, before the role exists.

:func:`open_serving` claims the control socket, binds the client and worker hosts' sockets,
makes the router with its links and connection caps, opens the HTTP front door when asked,
and only then makes the :class:`~workerpool.pool.serving.ServingRole` over them: no part of
the role appears later, and none is ever missing. What the router tells about its workers goes
to :class:`~workerpool.pool.worker_events.WorkerEvents`, which needs only the pool, so the
router can be made before the role.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import resource
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, NamedTuple

import numpy as np
import zmq

from .. import models, runtime, security
from ..codecs.view import ModelState
from ..config.pool import ServeConfig, StartupError
from ..control.server import ControlServer
from ..events.loop import Loop
from ..linux.cpus import usable_cpus
from ..logs import AccessLog
from ..protocol import messages as protocol
from ..router.connections import ConnectionLimit
from ..router.core import Router
from ..router.links import RouterLinks
from ..router.local_links import LocalLinks
from ..router.sockets import bind_sockets
from ..supervisor.role import Pool
from ..units import MS_PER_SECOND, KiB, MiB, format_size
from .commands import ControlCommands
from .exposure import open_doors
from .serving import ServingRole, serve_model
from .serving_parts import ServingParts
from .worker_events import WorkerEvents

log = logging.getLogger(__name__)

BATCH_ROOM = 4096  # requests of the model's declared input that --max-message-size makes room for
UNDECLARED_MESSAGE_SIZE = 64 * MiB
STRAGGLER_LINGER_MS = 1000
STRAGGLER_QUIET_MS = 20  # clients silent this long at exit have nothing more on its way
RESERVED_FDS = 64  # the supervisor's own: sockets, libzmq's internals, logs, the control socket
HTTP_BACKLOG = 1024
FDS_PER_WORKER = 4  # its pidfd, its link and the pipes around starting it
ROOM_TO_ANSWER = 8  # by default 1/8 of the client connections' room holds those not served
MAX_REFUSED_WAITING = 64  # HTTP connections past the cap that may wait for their 503 to be read


def open_serving(config: ServeConfig, pool: Pool, cleanup: ExitStack) -> ServingRole:
    """Build and bind everything ``serve`` runs on ``pool``'s loop; undo steps go on ``cleanup``.
    Raises :class:`StartupError` with what to change when an endpoint or file will not do."""
    context = zmq.Context()
    cleanup.callback(context.destroy, linger=0)
    try:
        control_endpoint = config.control or runtime.default_control_endpoint()
    except OSError as exc:
        raise StartupError(f"cannot create the runtime directory: {exc}") from exc
    control_server = ControlServer(context, control_endpoint)
    control_server.claim()
    events = WorkerEvents(pool)
    access = AccessLog(on=not config.no_access_log, sample=config.access_log_sample)
    cleanup.callback(access.flush)  # the lines of the last answers, once every other step is undone
    router, links = _bind_router(config, pool, events, context, _secure(config, context, cleanup), access)
    cleanup.callback(links.local.close)
    cleanup.callback(_answer_stragglers, pool, router, links)
    connections = ConnectionLimit(links.frontend, *_connection_caps(config))
    cleanup.callback(connections.close)
    router.intake.connections = lambda: connections
    door = _http_door(config) if config.http else None
    parts = ServingParts(config, pool, router, links, connections, control_server, events.switch_failures,
                         door.url if door else None, router.intake.max_message_size)
    commands = ControlCommands(parts)
    cleanup.callback(commands.close)
    control_server.bind(pool.loop, cleanup, commands.handlers())
    _read_sockets(pool.loop, parts, commands)
    if door is not None:
        _open_http(parts, commands, door, cleanup)
    return ServingRole(parts, commands)


def _bind_router(config: ServeConfig, pool: Pool, events: WorkerEvents, context: zmq.Context,
                 secure: Callable[[zmq.Socket, str], None] | None, access: AccessLog) -> tuple[Router, RouterLinks]:
    max_message_size = config.max_message_size or max(
        default_max_message_size(served.current.signature) for served in pool.models)
    if max_message_size < protocol.MIN_MESSAGE_SIZE:
        raise StartupError(f"--max-message-size {format_size(max_message_size)} is below "
                           f"{format_size(protocol.MIN_MESSAGE_SIZE)}, the size up to which "
                           "clients send a request before learning the server's limit")
    if config.max_worker_memory is not None and config.max_worker_memory < max_message_size:
        raise StartupError(f"--max-worker-memory {format_size(config.max_worker_memory)} is below "
                           f"--max-message-size {format_size(max_message_size)}: a worker could not "
                           "even receive the largest request")
    try:
        sockets = bind_sockets(
            context, frontend=config.bind, remote_backend=config.backend,
            max_message_size=max_message_size, heartbeat=config.heartbeat, liveness=config.liveness,
            secure=secure,
        )
    except zmq.ZMQError as exc:
        raise StartupError(_bind_failure(exc, {config.bind: "--bind", config.backend: "--backend"})) from exc
    router = Router(
        events, max_queue=config.max_queue, max_queue_bytes=config.max_queue_bytes,
        max_message_size=max_message_size, heartbeat=config.heartbeat, liveness=config.liveness,
        request_timeout=config.request_timeout,
        running_cap=max(1, usable_cpus() // pool.threads_per_worker),  # cores / a worker's share
        access=access,
    )
    for served in pool.models:
        serve_model(router, served)
    return router, RouterLinks(sockets, router, LocalLinks(pool.loop, router))


def _secure(config: ServeConfig, context: zmq.Context,
            cleanup: ExitStack) -> Callable[[zmq.Socket, str], None] | None:
    """Start CURVE when keys are given; warn about every door open to the network without
    keys or a token."""
    for warning in open_doors(config):
        log.warning("%s", warning)
    keys = config.server_keys
    if keys is None:
        return None
    if config.backend and keys.worker_dir is None:
        raise StartupError(f"--backend {config.backend} with CURVE needs --curve-worker-keys DIR: "
                           "the public keys of the worker hosts allowed to join")
    try:
        authenticator = keys.start(context)
    except security.KeysError as exc:
        raise StartupError(str(exc)) from exc
    cleanup.callback(authenticator.stop)
    return keys.apply


def _connection_caps(config: ServeConfig) -> tuple[int, int]:
    """The connections served (--max-connections) and the most held open: what the open
    file limit leaves beside the pool's own descriptors, halved with --http, which takes its
    connections from the same room. A cap above it would let connections exhaust descriptors."""
    room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - RESERVED_FDS - FDS_PER_WORKER * max(config.workers, 1)
    ceiling = max(1, room // 2 if config.http else room)
    wanted = config.max_connections
    if wanted is None:
        return max(1, ceiling - ceiling // ROOM_TO_ANSWER), ceiling
    if wanted > ceiling:
        log.warning("--max-connections %d is more than the open file limit leaves room for; "
                    "serving at most %d connections (raise the limit with ulimit -n)", wanted, ceiling)
    return min(wanted, ceiling), ceiling


def _read_sockets(loop: Loop, parts: ServingParts, commands: ControlCommands) -> None:
    router, links, connections = parts.router, parts.links, parts.connections
    loop.read(connections.monitor, connections.on_event)
    loop.read(links.frontend, links.on_frontend)
    if links.remote is not None:
        loop.read(links.remote, links.on_remote_backend)
    loop.after_each_turn(links.flush)
    loop.after_each_turn(router.replies.access.flush)
    loop.after_each_turn(router.count_held)

    def duties() -> None:
        router.tick()
        connections.sweep()
        commands.answer_waiting()

    loop.every_tick(duties, urgent=lambda: bool(router.queue or commands.status_waiters), due=lambda: router.wake_at)


class HttpDoor(NamedTuple):
    """The HTTP front door's listening socket, where it listens and its TLS context (or None)."""

    socket: socket.socket
    url: str
    tls: Any


def _http_door(config: ServeConfig) -> HttpDoor:
    """Bind ``--http``, with TLS when --http-cert and --http-key are given."""
    from ..ops.http import parse_address

    assert config.http is not None
    try:
        host, port = parse_address(config.http)
    except ValueError as exc:
        raise StartupError(f"--http: {exc}") from exc
    tls = _tls(config)
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    backlog=HTTP_BACKLOG)
    except OSError as exc:
        # create_server's own message repeats the address: the error number's text is enough
        # (a name that does not resolve has a negative one, and its own text).
        reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
        raise StartupError(f"cannot serve --http {config.http}: {reason}{_in_use(exc.errno, '--http')}") from exc
    return HttpDoor(sock, f"{'https' if tls else 'http'}://{host}:{sock.getsockname()[1]}", tls)


def _open_http(parts: ServingParts, commands: ControlCommands, door: HttpDoor, cleanup: ExitStack) -> None:
    """The HTTP front door, on this loop beside the router's sockets, handing requests to
    the router without a socket between them (imported only when asked for)."""
    from ..gateway.connection import FrontSettings
    from ..gateway.routes import Routes
    from ..gateway.server import HttpServer
    from ..ops.http import OpsAnswers

    config, pool, connections, links = parts.config, parts.pool, parts.connections, parts.links
    settings = FrontSettings(
        max_body=parts.max_message_size, max_buffered=config.max_queue_bytes,
        max_connections=connections.limit,
        max_refused=min(MAX_REFUSED_WAITING, connections.ceiling - connections.limit),
        client_timeout=config.http_timeout, tls=door.tls)
    routes = Routes(lambda: _describe(pool), commands.unready,
                    OpsAnswers(lambda: _snapshot(parts, commands)).answer, token=_token(config))
    server = HttpServer(pool.loop, door.socket, settings, routes, parts.router, parts.router.replies.access)
    links.deliver_local = server.deliver
    cleanup.callback(server.close, links.flush)
    cleanup.callback(links.flush)  # the answers of the last turn, before the connections close
    pool.loop.every_tick(server.sweep)
    names = ", ".join(served.name for served in pool.models)
    texts = any(models.takes_text(served.current.signature) for served in pool.models)
    log.info("HTTP on %s: KServe v2 at /v2/models/{%s}%s, /metrics, /healthz, /readyz", parts.http_url, names,
             ", OpenAI at /v1/embeddings, TEI at /embed, /rerank, /predict, /tokenize, /info, rerank at "
             "/v1/rerank and /v2/rerank" if texts else "")


def _describe(pool: Pool) -> dict[str, ModelState]:
    """Each served model's signature and generation, for the HTTP front door."""
    return {served.name: ModelState(served.current.signature, served.current.model, served.current.generation,
                                    served.entry.max_batch)
            for served in pool.models}


def _snapshot(parts: ServingParts, commands: ControlCommands) -> dict[str, Any]:
    """What a scrape reads, taken between two events of the loop."""
    router, pool = parts.router, parts.pool
    return {"status": commands.status(), "outcomes": dict(router.replies.outcomes),
            "durations": {key: histogram.copy() for key, histogram in router.replies.durations.items()},
            "models": {name: stats.copy() for name, stats in router.stats.models.items()},
            "request_seconds": router.stats.occupancy.seconds(time.monotonic()),
            "reloads": pool.models.outcomes(), "replacements": pool.replacements,
            "pids": list(pool.children), "helpers": [os.getpid(), *pool.helper_pids()],
            "paths": {served.name: served.entry.path for served in pool.models}}


def _answer_stragglers(pool: Pool, router: Router, links: RouterLinks) -> None:
    """At exit, answer what reached the socket after the last poll, until clients have been
    quiet for ``STRAGGLER_QUIET_MS`` (at most ``STRAGGLER_LINGER_MS``), then give the replies
    that long to leave: every request the router read gets an answer. libzmq cannot stop
    reading a connection that stays open, so a request sent after that reaches no one, and
    its client sees the connection drop."""
    router.stop_accepting()
    frontend = links.frontend
    give_up = time.monotonic() + STRAGGLER_LINGER_MS / MS_PER_SECOND
    while frontend.poll(STRAGGLER_QUIET_MS) and time.monotonic() < give_up:
        links.on_frontend()
        links.flush()
    frontend.close(linger=STRAGGLER_LINGER_MS)
    intake = router.intake
    answered = sum(router.replies.outcomes.values())
    if not pool.announced and not intake.read:  # it never served: nothing to account for
        return
    log.log(logging.INFO if answered == intake.read else logging.WARNING,
            "%d requests read, %d answered", intake.read, answered)


def _token(config: ServeConfig) -> bytes | None:
    """The bearer token of --http-token-file; a file that cannot be read fails the start."""
    if config.http_token_file is None:
        return None
    try:
        with open(config.http_token_file, "rb") as file:
            token = file.read().strip()
    except OSError as exc:
        raise StartupError(f"--http-token-file {config.http_token_file}: {exc.strerror}") from exc
    if not token:
        raise StartupError(f"--http-token-file {config.http_token_file} is empty")
    return token


def _tls(config: ServeConfig) -> Any:
    """The TLS context of --http-cert and --http-key, or None for plain HTTP."""
    if (config.http_cert is None) != (config.http_key is None):
        raise StartupError("--http-cert and --http-key go together")
    if config.http_cert is None:
        return None
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.http_cert, config.http_key)
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(f"--http-cert/--http-key cannot be used: {exc}") from exc
    return context


def default_max_message_size(signature: dict[str, Any]) -> int:
    """Room for a batch of 4096 inputs of the model's declared shape (at least the protocol's
    least limit, 1 MiB); 64 MiB when the model declares none."""
    declared = models.array_input(signature) or {}
    dtype, shape = declared.get("dtype"), declared.get("shape")
    if dtype is None or shape is None or any(d is None for d in shape[1:]):
        return UNDECLARED_MESSAGE_SIZE
    sample = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    return max(protocol.MIN_MESSAGE_SIZE, BATCH_ROOM * sample + 64 * KiB)


def _bind_failure(exc: zmq.ZMQError, options: dict[str | None, str]) -> str:
    """Which endpoint could not be bound, and the option that moves it. pyzmq puts the endpoint
    only in the message: ``Address already in use (addr='tcp://...')``."""
    named = re.search(r" \(addr='([^']*)'\)", exc.strerror)
    if named is None:
        return f"cannot bind the pool's sockets: {exc.strerror}"
    endpoint, reason = named.group(1), exc.strerror[:named.start()]
    option = options.get(endpoint)
    if option is None:
        return f"cannot bind {endpoint}: {reason}"
    return f"cannot bind {option} {endpoint}: {reason}{_in_use(exc.errno, option)}"


def _in_use(errno_value: int | None, option: str) -> str:
    """What to do about an address another process holds, for the option that names it."""
    return f": stop what uses it, or choose another with {option}" if errno_value == errno.EADDRINUSE else ""
