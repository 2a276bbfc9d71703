"""The ``serve`` role: the router, its control socket and what they report.

Composed with a :class:`~workerpool.supervisor.core.Supervisor`, it binds the client and
worker hosts' endpoints, gives each worker it starts a link of its own to the router, serves each model the
supervisor serves (added and removed while it runs too), moves workers to new weights through
each model's rolling reload, and answers ``status``, ``reload``, ``check`` and ``models``
(``commands.py``).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import resource
import signal
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np
import zmq

from .. import models, runtime, security
from ..codecs.view import ModelState
from ..config.pool import STOP_TIMEOUT_SECONDS, ServeConfig, StartupError
from ..control.server import ControlServer
from ..events.loop import Loop
from ..protocol import messages as protocol
from ..router.connections import ConnectionLimit
from ..router.core import Router
from ..router.links import RouterLinks
from ..router.local_links import LocalLinks
from ..router.registry import WorkerRecord
from ..router.sockets import bind_sockets
from ..supervisor.process import Child
from ..supervisor.ready_line import serve_line
from ..supervisor.role import Pool
from ..units import MS_PER_SECOND, KiB, MiB, format_size
from ..weights.served import ServedModel
from ..worker.spec import WorkerSpec
from .commands import ControlCommands
from .exposure import open_doors

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


class ServingRole:
    """The local router with its control socket, for ``workerpool serve``."""

    leave_timeout = STOP_TIMEOUT_SECONDS  # local workers leave at once: the router holds nothing

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self._router: Router | None = None
        self.switch_failures: dict[str, str] = {}  # by model: why a worker could not switch to its newest weights
        self.commands = ControlCommands(self)
        self.http_url: str | None = None

    @property
    def router(self) -> Router:
        assert self._router is not None, "the router is bound in open()"
        return self._router

    @property
    def requests(self) -> Router | None:
        """The router holds the requests: shutdown drains it."""
        return self._router

    backend = None  # local workers talk over links (``router/local_links.py``), not an endpoint

    def open(self, pool: Pool, cleanup: ExitStack) -> None:
        self.pool = pool
        context = zmq.Context()
        cleanup.callback(context.destroy, linger=0)
        cleanup.callback(self.commands.close)
        try:
            control_endpoint = self.config.control or runtime.default_control_endpoint()
        except OSError as exc:
            raise StartupError(f"cannot create the runtime directory: {exc}") from exc
        self.control_server = ControlServer(context, control_endpoint, self.commands.handlers())
        self.control_server.claim()
        self._router, self.links = self._bind_router(context, pool.loop, self._secure(context, cleanup))
        cleanup.callback(self.links.local.close)
        cleanup.callback(self._answer_stragglers)
        self.control_server.bind(pool.loop, cleanup)
        self.connections = ConnectionLimit(self.links.frontend, *self._connection_caps())
        cleanup.callback(self.connections.close)
        self.router.intake.connections = lambda: self.connections
        self._read_sockets(pool.loop)
        self.http_url = self._open_http(pool, cleanup) if self.config.http else None

    def _open_http(self, pool: Pool, cleanup: ExitStack) -> str:
        """The HTTP front door, on this loop beside the router's sockets, handing requests to
        the router without a socket between them (imported only when asked for)."""
        from ..gateway.connection import FrontSettings
        from ..gateway.routes import Routes
        from ..gateway.server import HttpServer
        from ..ops.http import OpsAnswers, parse_address

        config = self.config
        assert config.http is not None
        try:
            host, port = parse_address(config.http)
        except ValueError as exc:
            raise StartupError(f"--http: {exc}") from exc
        settings = FrontSettings(
            max_body=self.max_message_size, max_buffered=config.max_queue_bytes,
            max_connections=self.connections.limit,
            max_refused=min(MAX_REFUSED_WAITING, self.connections.ceiling - self.connections.limit),
            client_timeout=config.http_timeout, tls=_tls(config))
        try:
            sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                        backlog=HTTP_BACKLOG)
        except OSError as exc:
            # create_server's own message repeats the address: the error number's text is enough
            # (a name that does not resolve has a negative one, and its own text).
            reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
            raise StartupError(f"cannot serve --http {config.http}: {reason}{_in_use(exc.errno, '--http')}") from exc
        routes = Routes(self._describe, self.commands.unready, OpsAnswers(self._snapshot).answer,
                        token=_token(config))
        server = HttpServer(pool.loop, sock, settings, routes, self.router)
        self.links.deliver_local = server.deliver
        cleanup.callback(server.close, self.links.flush)
        cleanup.callback(self.links.flush)  # the answers of the last turn, before the connections close
        pool.loop.every_tick(server.sweep)
        url = f"{'https' if settings.tls else 'http'}://{host}:{sock.getsockname()[1]}"
        names = ", ".join(served.name for served in self.pool.models)
        texts = any(models.takes_text(served.current.signature) for served in self.pool.models)
        log.info("HTTP on %s: KServe v2 at /v2/models/{%s}%s, /metrics, /healthz, /readyz", url, names,
                 ", OpenAI at /v1/embeddings, TEI at /embed, /rerank, /predict, /tokenize, /info, rerank at "
                 "/v1/rerank and /v2/rerank" if texts else "")
        return url

    def _describe(self) -> dict[str, ModelState]:
        """Each served model's signature and generation, for the HTTP front door."""
        return {served.name: ModelState(served.current.signature, served.current.model, served.current.generation,
                                        served.entry.max_batch)
                for served in self.pool.models}

    def _snapshot(self) -> dict[str, Any]:
        """What a scrape reads, taken between two events of the loop."""
        router, pool = self.router, self.pool
        return {"status": self.commands.status(), "outcomes": dict(router.replies.outcomes),
                "models": {name: stats.copy() for name, stats in router.stats.models.items()},
                "request_seconds": router.stats.occupancy.seconds(time.monotonic()),
                "reloads": pool.models.outcomes(), "replacements": pool.replacements,
                "pids": list(pool.children), "helpers": [os.getpid(), *pool.helper_pids()],
                "paths": {served.name: served.entry.path for served in pool.models}}

    def _connection_caps(self) -> tuple[int, int]:
        """The connections served (--max-connections) and the most held open: what the open
        file limit leaves beside the pool's own descriptors, halved with --http, which takes its
        connections from the same room. A cap above it would let connections exhaust descriptors."""
        room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - RESERVED_FDS \
            - FDS_PER_WORKER * max(self.config.workers, 1)
        ceiling = max(1, room // 2 if self.config.http else room)
        wanted = self.config.max_connections
        if wanted is None:
            return max(1, ceiling - ceiling // ROOM_TO_ANSWER), ceiling
        if wanted > ceiling:
            log.warning("--max-connections %d is more than the open file limit leaves room for; "
                        "serving at most %d connections (raise the limit with ulimit -n)", wanted, ceiling)
        return min(wanted, ceiling), ceiling

    def _bind_router(self, context: zmq.Context, loop: Loop,
                     secure: Callable[[zmq.Socket, str], None] | None) -> tuple[Router, RouterLinks]:
        config = self.config
        max_message_size = config.max_message_size or max(
            default_max_message_size(served.current.signature) for served in self.pool.models)
        if max_message_size < protocol.MIN_MESSAGE_SIZE:
            raise StartupError(f"--max-message-size {format_size(max_message_size)} is below "
                               f"{format_size(protocol.MIN_MESSAGE_SIZE)}, the size up to which "
                               "clients send a request before learning the server's limit")
        if config.max_worker_memory is not None and config.max_worker_memory < max_message_size:
            raise StartupError(f"--max-worker-memory {format_size(config.max_worker_memory)} is below "
                               f"--max-message-size {format_size(max_message_size)}: a worker could not "
                               "even receive the largest request")
        self.max_message_size = max_message_size
        try:
            sockets = bind_sockets(
                context, frontend=config.bind, remote_backend=config.backend,
                max_message_size=max_message_size, heartbeat=config.heartbeat, liveness=config.liveness,
                secure=secure,
            )
        except zmq.ZMQError as exc:
            raise StartupError(_bind_failure(exc, {config.bind: "--bind", config.backend: "--backend"})) from exc
        router = Router(
            self, max_queue=config.max_queue, max_queue_bytes=config.max_queue_bytes,
            max_message_size=max_message_size, heartbeat=config.heartbeat, liveness=config.liveness,
            request_timeout=config.request_timeout, running_cap=self._running_cap(),
        )
        for served in self.pool.models:
            _serve(router, served)
        return router, RouterLinks(sockets, router, LocalLinks(loop, router))

    def _running_cap(self) -> int:
        """Local workers that can run at once: the cores this pool may use, each worker's share."""
        return max(1, len(os.sched_getaffinity(0)) // self.pool.threads_per_worker)

    def _read_sockets(self, loop: Loop) -> None:
        router, links = self.router, self.links
        loop.read(self.connections.monitor, self.connections.on_event)
        loop.read(links.frontend, links.on_frontend)
        if links.remote is not None:
            loop.read(links.remote, links.on_remote_backend)
        loop.after_each_turn(links.flush)
        loop.after_each_turn(router.count_held)
        loop.every_tick(self._duties, urgent=lambda: bool(router.queue or self.commands.status_waiters),
                        due=lambda: router.wake_at)

    def _secure(self, context: zmq.Context, cleanup: ExitStack) -> Callable[[zmq.Socket, str], None] | None:
        """Start CURVE when keys are given; warn about every door open to the network without
        keys or a token."""
        for warning in open_doors(self.config):
            log.warning("%s", warning)
        keys = self.config.server_keys
        if keys is not None:
            if self.config.backend and keys.worker_dir is None:
                raise StartupError(f"--backend {self.config.backend} with CURVE needs --curve-worker-keys DIR: "
                                   "the public keys of the worker hosts allowed to join")
            try:
                authenticator = keys.start(context)
            except security.KeysError as exc:
                raise StartupError(str(exc)) from exc
            cleanup.callback(authenticator.stop)
            return keys.apply
        return None

    def _answer_stragglers(self) -> None:
        """At exit, answer what reached the socket after the last poll, until clients have been
        quiet for ``STRAGGLER_QUIET_MS`` (at most ``STRAGGLER_LINGER_MS``), then give the replies
        that long to leave: every request the router read gets an answer. libzmq cannot stop
        reading a connection that stays open, so a request sent after that reaches no one, and
        its client sees the connection drop."""
        router, links = self.router, self.links
        router.stop_accepting()
        frontend = links.frontend
        give_up = time.monotonic() + STRAGGLER_LINGER_MS / MS_PER_SECOND
        while frontend.poll(STRAGGLER_QUIET_MS) and time.monotonic() < give_up:
            links.on_frontend()
            links.flush()
        frontend.close(linger=STRAGGLER_LINGER_MS)
        intake = router.intake
        answered = sum(router.replies.outcomes.values())
        if not self.pool.announced and not intake.read:  # it never served: nothing to account for
            return
        log.log(logging.INFO if answered == intake.read else logging.WARNING,
                "%d requests read, %d answered", intake.read, answered)

    def _duties(self) -> None:
        self.router.tick()
        self.connections.sweep()
        self.commands.answer_waiting()

    # The supervisor's side.

    ready_pipe = False  # the router hears it: the worker registers

    def prepare(self, spec: WorkerSpec) -> WorkerSpec:
        return spec

    @property
    def stop_patience(self) -> float:
        return self.config.request_timeout + self.leave_timeout

    def child_started(self, child: Child) -> None:
        """The router reads the worker's link from now on (what it sent before waits there)."""
        assert child.link is not None, "a local worker is started with a link"
        child.address = self.links.local.attach(child.link)
        child.link = None

    def child_exited(self, child: Child, why: str) -> None:
        self.router.worker_exited(child.token, why, asked=child.stopping,
                                  killed=child.returncode == -signal.SIGKILL)
        if child.address is not None:
            self.links.local.detach(child.address)

    def roll_out(self, model: str) -> None:
        """Move every worker to ``model``'s newest generation (a model new to the router is
        served from now on, each worker loading it in turn)."""
        self.switch_failures.pop(model, None)
        served = self.pool.models[model]
        if model not in self.router.policies:
            _serve(self.router, served)
        order = protocol.encode_header({"model": served.spec().to_data()})
        self.router.begin_rollout(model, served.current.generation, order)

    def model_removed(self, model: str) -> None:
        self.switch_failures.pop(model, None)
        self.router.remove_model(model)

    def reload_done(self) -> bool:
        return self.router.reload_complete()

    surge = 0  # workers switch to new weights in place, one at a time: none starts for it

    def ready_line(self, path: str, size: str, model: str, workers: int) -> str:
        return serve_line(path, size, model, workers, self.links.endpoint)

    # The router's side.

    def _local_child(self, worker: WorkerRecord) -> Child | None:
        """The process behind a registered worker, known by the token it was started with:
        never by the pid it reports, so no peer can make the supervisor signal a process."""
        return self._child_with(worker.token) if worker.local else None

    def _child_with(self, token: str | None) -> Child | None:
        if token is None:
            return None
        return next((c for c in self.pool.children.values() if c.token == token), None)

    def started_here(self, token: str | None) -> bool:
        return self._child_with(token) is not None or token in self.pool.starter.tokens()

    def worker_ready(self, worker: WorkerRecord) -> None:
        child = self._local_child(worker)
        if child is not None:
            self.pool.child_ready(child)

    def worker_lost(self, worker: WorkerRecord, why: str) -> None:
        child = self._local_child(worker)
        # One told to stop is on its way out: the supervisor kills it if it overstays.
        if child is not None and child.alive() and not child.stopping:
            log.warning("killing worker %d: %s", worker.pid, why)
            child.kill()

    def models_changed(self, worker: WorkerRecord) -> None:
        """What a worker serves decides which models its replacement maps (``--workers
        NAME=N``) and whether it is behind."""
        child = self._local_child(worker)
        if child is not None:
            child.generations = dict(worker.models)

    def reload_failed(self, worker: WorkerRecord, model: str, why: str) -> None:
        generation = self.pool.models[model].current.generation if model in self.pool.models else 0
        self.switch_failures[model] = f"worker {worker.pid} could not switch {model} to generation {generation}: {why}"


def _serve(router: Router, served: ServedModel) -> None:
    """Have ``router`` serve ``served`` with its own settings."""
    entry = served.entry
    router.add_model(served.name, served.current.signature, max_rows=entry.max_batch, wait=entry.batch_wait,
                     limit=entry.workers)


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
