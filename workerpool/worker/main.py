"""A worker process: maps the weights itself, builds each model on the views, serves requests.

A worker serves every model its spec names (by default every model of the pool: their weights
are shared mappings, so one more model costs a worker only the model's private state). This is
the process's loop: register with the router, take its messages (requests, each naming its
model, are answered by ``requests.py``, inline), heartbeat, reload or add or drop a model,
leave. A local worker talks over the link it inherited, a worker host's over ZeroMQ
(``channels.py``). A worker idle for :data:`IDLE_RELEASE` gives back the memory serving left
free (:meth:`LoadedModel.release_memory`): under load it keeps its working set, at rest it
holds little more than when it started.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import time
from typing import Any

import zmq
from threadpoolctl import ThreadpoolController

from .. import burnpack, models, security
from ..config.pool import POLLS_PER_HEARTBEAT
from ..errors import ErrorCode
from ..linux import controls
from ..linux.controls import release_free_memory
from ..logs import setup_logging
from ..models.loaded import LoadedModel
from ..protocol import messages as protocol
from ..protocol.transport import POLLIN, POLLOUT
from ..units import MS_PER_SECOND, format_size
from .channels import LinkChannel, RouterChannel, ZmqChannel
from .memory_bound import MemoryBound, MemoryLimitTooLow
from .requests import Answer, failed, handle_batch, in_batch_order, read_part
from .spec import (
    CONTROL_SIGNALS,
    EXIT_FILE_CHANGED,
    EXIT_LOAD_FAILED,
    EXIT_RECYCLED,
    EXIT_REFUSED,
    STOP_SIGNAL,
    TOKEN_ENV,
    InvalidSpec,
    ModelSpec,
    WorkerSpec,
)

log = logging.getLogger(__name__)

IDLE_RELEASE = 1.0  # seconds without a request after which a worker gives back what serving took


class Worker:
    """One worker's life: load, connect, register, serve requests and reloads, leave."""

    def __init__(self, spec: WorkerSpec, parent: int, handoff: dict[str, LoadedModel] | None = None) -> None:
        self.spec = spec
        self.handoff = handoff or {}  # the models the template built for this order, by name
        self.models: dict[str, LoadedModel] = {}  # by the name each is served under
        self.token = os.environ.pop(TOKEN_ENV, None)  # proves to the router that our supervisor started us
        self.parent = parent  # the supervisor: once it is gone, so is this worker
        self.identity = f"{socket.gethostname()}/{os.getpid()}".encode()
        self.stopping = False
        self.reregister = False
        self.router_missing = False
        self.leaving = False  # said or about to say BYE
        self.exit_code = 0
        self.memory: MemoryBound | None = None

    def run(self) -> int:
        spec = self.spec
        if spec.threads is not None:  # before the model is built: it may run BLAS already
            self.threads = thread_pools().limit(limits=spec.threads)
        for model in spec.models:
            if not self._load_first(model):
                return EXIT_FILE_CHANGED  # the supervisor will validate the new file and start another
        self.handoff.clear()  # a reload must be able to free what the template built
        if spec.ready_fd is not None:  # tell a worker host's supervisor: loaded, now connecting
            try:
                os.write(spec.ready_fd, b"ready")
            except BrokenPipeError:  # it gave up on this start and asked for another worker
                log.warning("worker %d: the supervisor no longer waits for this worker; exiting",
                            os.getpid())
                return 1
            finally:
                os.close(spec.ready_fd)
        router: RouterChannel = ZmqChannel(spec, self.identity) if spec.link_fd is None \
            else LinkChannel(spec.link_fd)
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(STOP_SIGNAL, lambda *_: None)
        if spec.max_memory is not None:  # last: sockets and their threads are in the baseline
            self.memory = MemoryBound(spec.max_memory)
        try:
            return self._loop(router, wakeup_r)
        finally:
            router.close()

    def _load_first(self, model: ModelSpec) -> bool:
        """Build ``model`` (or take the template's) as the worker starts; False when its file
        was replaced meanwhile."""
        spec = self.spec
        try:
            loaded = self.handoff.pop(model.name, None) or self._build(model)
        except burnpack.BurnpackError:
            if model.source is None or is_identity(model.source, model.expect):
                raise
            log.warning("worker %d: generation %d of %s was replaced while starting", os.getpid(),
                        model.generation, model.name)
            return False
        if model.expect and loaded.pack.identity.as_list() != model.expect:
            log.warning("worker %d: %s changed while starting; the supervisor will validate the new file",
                        os.getpid(), model.path)
            return False
        log.debug("mapped %s and built model %s (%s, %s)", model.path, model.name, loaded.name, spec.load)
        self.models[model.name] = loaded
        return True

    def _build(self, model: ModelSpec) -> LoadedModel:
        spec = self.spec
        return LoadedModel(model.path, model.factory, spec.load, model.generation, spec.threads,
                           spec.cache_dir, model.source, max_rows=model.max_batch,
                           truncate=model.truncate)

    def _register(self, router: RouterChannel) -> bool:
        """Say READY (with what this worker serves); False while no router is connected."""
        ready = {"pid": os.getpid(), "host": socket.gethostname(), "local": not self.spec.remote,
                 "token": self.token, "models": {name: loaded.describe() for name, loaded in self.models.items()}}
        return router.send([protocol.READY, json.dumps(ready).encode()])

    def _loop(self, router: RouterChannel, wakeup: int) -> int:
        interval = self.spec.heartbeat
        poller = zmq.Poller()
        poller.register(router.source, POLLIN)
        poller.register(wakeup, POLLIN)
        patience = interval * self.spec.liveness
        router_seen = last_beat = time.monotonic()
        leave_by: float | None = None
        release_at: float | None = None  # the last reply: memory is given back once idle since
        registered = self._register(router)
        watching = POLLIN
        while True:
            # Until registered, also wake when the connection completes (IMMEDIATE holds the
            # READY back until then), not a poll interval later.
            wanted = POLLIN if registered else POLLIN | POLLOUT
            if wanted != watching:
                poller.modify(router.source, wanted)
                watching = wanted
            events = dict(poller.poll(int(interval * MS_PER_SECOND / POLLS_PER_HEARTBEAT)))
            now = time.monotonic()
            if events.get(router.source, 0) & POLLIN:
                router_seen = now
                with self.memory.unbounded() if self.memory else contextlib.nullcontext():
                    frames = router.receive()
                if frames is None:
                    log.warning("worker %d: the router closed this worker's link, exiting", os.getpid())
                    return 1
                if self._on_router(router, frames):
                    last_beat = release_at = time.monotonic()
            elif release_at is not None and now >= release_at + IDLE_RELEASE:
                release_at = None  # idle: give back what serving took
                self._release_memory()
            if self.reregister:
                self.reregister = registered = False
            if not registered:
                registered = self._register(router)
            if events.get(wakeup):
                os.read(wakeup, 64)
                self._leave(0, f"asked to stop ({STOP_SIGNAL.name})")
            if self.leaving and leave_by is None:
                # Say goodbye and wait for the router's STOP: a request it sent meanwhile is
                # still answered, so leaving loses nothing. No router connected: just go.
                leave_by = now + patience
                if not router.send([protocol.BYE]):
                    return self.exit_code
            if self.stopping or (leave_by is not None and (now >= leave_by or not registered)):
                return self.exit_code
            if now - last_beat >= interval:
                router.send([protocol.HEARTBEAT])
                last_beat = now
            if not self._router_alive(now - router_seen, patience):
                return 1

    def _router_alive(self, silent: float, patience: float) -> bool:
        """Whether to go on after the router has been ``silent`` that many seconds: a local
        worker exits once its supervisor is gone or has been silent past ``patience``; a
        worker host's waits for its router to come back."""
        if os.getppid() != self.parent:
            log.warning("worker %d: supervisor is gone, exiting", os.getpid())
            return False
        if silent > patience:
            if not self.spec.remote:
                log.warning("worker %d: no heartbeat from the router for %.1fs, exiting", os.getpid(), silent)
                return False
            if not self.router_missing:
                log.warning("worker %d: no heartbeat from the router at %s for %.1fs; waiting for it",
                            os.getpid(), self.spec.backend, silent)
            self.router_missing = True
        elif self.router_missing:
            log.info("worker %d: the router at %s is back", os.getpid(), self.spec.backend)
            self.router_missing = False
        return True

    def _release_memory(self) -> None:
        for loaded in self.models.values():
            loaded.release_memory()

    def _on_router(self, router: RouterChannel, frames: list[Any]) -> bool:
        """Handle one message from the router; True when a reply was sent."""
        command = frames[0].bytes
        if command in (protocol.REQUEST, protocol.BATCH):
            work = protocol.read_work(frames)
            if work is None:
                log.error("worker %d: malformed %s of %d frames ignored", os.getpid(), command.decode(), len(frames))
                return False
            loaded = self.models.get(work[0])
            if loaded is None and len(self.models) == 1:  # a host's one model, by the router's name for it
                loaded = next(iter(self.models.values()))
            self._answer_all(router, work[0], loaded, work[1])
            self._settle(loaded)
            return True
        if command == protocol.RELOAD and len(frames) >= 2:
            outcome = self._reload(frames[1].bytes)
            router.send([protocol.RELOADED, json.dumps(outcome).encode()])
            return True
        if command == protocol.STOP:
            self.stopping = True
        elif command == protocol.WHO:  # a restarted router does not know us yet
            self.reregister = True
        elif command == protocol.REFUSE:
            reason = frames[1].bytes.decode(errors="replace") if len(frames) > 1 else "no reason given"
            log.error("worker %d: the router refuses this worker: %s", os.getpid(), reason)
            raise Refused(reason)
        return False

    def _answer_all(self, router: RouterChannel, model: str, loaded: LoadedModel | None, batch: list[Any]) -> None:
        """Answer the requests of a message (client, part, frames each), each as soon as it and
        those before it are: the router takes a batch's replies in its order. What the model's
        tokenizer did goes just before the last reply, so that the pool's metrics hold it once
        the last client has its answer."""
        requests = [(request[2:], read_part(request[1])) for request in batch]
        answered: set[int] = set()
        try:
            for index, answer in in_batch_order(handle_batch(loaded, requests)):
                usage = loaded.take_usage() if loaded is not None and index == len(batch) - 1 else None
                if usage is not None:
                    router.send(protocol.usage_message(model, *usage))
                self._answer(router, batch[index][0], answer)
                answered.add(index)
        except Exception as exc:  # noqa: BLE001 - what no check caught: those not answered fail, the worker stays
            message = failed(None, exc, "the worker could not answer")
            for index, (frames, _) in enumerate(requests):
                if index not in answered:
                    request_id = protocol.request_id_of(frames[1]) if len(frames) > 1 else None
                    self._answer(router, batch[index][0], (ErrorCode.INTERNAL.encode(), protocol.encode_error(
                        request_id, ErrorCode.INTERNAL, message, worker_pid=os.getpid())))

    def _answer(self, router: RouterChannel, client: Any, answer: Answer) -> None:
        status, reply = answer
        router.send([protocol.REPLY, client, status, *reply])

    def _settle(self, loaded: LoadedModel | None) -> None:
        """Once a message's replies are sent and its outputs let go of: the model gives back
        what a pass that grew the worker took, then the memory bound is checked."""
        if loaded is not None:
            loaded.settle()
        self._check_memory()

    def _leave(self, code: int, why: str) -> None:
        """Leave the pool once the router lets go (the first reason given is the exit code)."""
        if not self.leaving:
            log.info("worker %d: %s, leaving the pool", os.getpid(), why)
            self.leaving, self.exit_code = True, code

    def _check_memory(self) -> None:
        """After an answer: a worker whose private memory grew past the limit is replaced."""
        if self.memory is None:
            return
        private = self.memory.private()
        if private > self.memory.limit:
            self._leave(EXIT_RECYCLED, f"private memory {format_size(private)} passed "
                        f"--max-worker-memory {format_size(self.memory.limit)}")

    def _reload(self, order: bytes) -> dict[str, Any]:
        """Between two requests: map the file the order names and build its model on it (a new
        generation, or a model this worker did not serve), or drop a model (``remove``)."""
        try:
            wanted = json.loads(order)
            if isinstance(wanted, dict) and isinstance(wanted.get("remove"), str):
                return self._drop(wanted["remove"])
            model = ModelSpec.from_data(wanted.get("model") if isinstance(wanted, dict) else None)
        except (ValueError, InvalidSpec) as exc:
            log.error("worker %d: a malformed RELOAD ignored: %s", os.getpid(), exc)
            return {"ok": False, "error": f"malformed RELOAD: {exc}"}
        with self.memory.lifted() if self.memory else contextlib.nullcontext():
            error = self._switch(model)
        current = self.models.get(model.name)
        if error is not None:
            return {"model": model.name, "ok": False, "ordered": model.generation,
                    "generation": current.generation if current else 0, "error": error}
        log.info("worker %d: serving generation %d of %s", os.getpid(), model.generation, model.name)
        return {"model": model.name, "ok": True, "ordered": model.generation, "generation": model.generation,
                "info": current.describe() if current else None}

    def _switch(self, model: ModelSpec) -> str | None:
        """Serve ``model`` if it builds from the expected file; why not, or None.

        The old generation is dropped only once the new one is built, and with it the last
        reference to the old mapping, so the replaced file's pages can be freed.
        """
        try:
            loaded = self._build(model)
        except (burnpack.BurnpackError, models.ModelError) as exc:
            return str(exc)
        if loaded.pack.identity.as_list() != model.expect:
            return f"{model.path} changed again before this worker mapped it"
        self.models[model.name] = loaded
        return None

    def _drop(self, name: str) -> dict[str, Any]:
        """Stop serving the model ``name``: its mapping goes with its last reference."""
        if self.models.pop(name, None) is not None:  # no reference kept: its memory is free below
            log.info("worker %d: no longer serving %s", os.getpid(), name)
        release_free_memory()
        return {"model": name, "ok": True, "removed": True}


def is_identity(path: str, identity: list[int] | None) -> bool:
    """Whether ``path`` is still the file of that identity (the supervisor's descriptor of a
    generation is closed, and its number reused, once two newer ones have come)."""
    try:
        return burnpack.FileIdentity.of(os.stat(path)).as_list() == identity
    except OSError:
        return False


class Refused(Exception):
    """The router will not take this worker (its model does not fit the router's)."""


@functools.cache
def thread_pools() -> ThreadpoolController:
    """The BLAS and OpenMP libraries loaded here; a template finds them once for all its workers."""
    return ThreadpoolController()


def main(spec: WorkerSpec, handoff: dict[str, LoadedModel] | None = None) -> int:
    """A worker's life, spawned (``child``) or forked (``template``); ``handoff``: the models its
    template built for this order, by name."""
    parent = spec.parent if spec.parent is not None else os.getppid()
    controls.set_name("wp-worker")
    orphan = not controls.die_with_parent(parent)
    for signum in CONTROL_SIGNALS:  # the supervisor's to handle, not the workers'
        signal.signal(signum, signal.SIG_IGN)
    setup_logging(spec.log_level)
    if orphan:
        log.warning("worker %d: supervisor %d is gone before this worker started, exiting",
                    os.getpid(), parent)
        return 1
    try:
        return Worker(spec, parent, handoff).run()
    except (burnpack.BurnpackError, models.ModelError, security.KeysError) as exc:
        log.error("worker %d: cannot load the model: %s", os.getpid(), exc)
        return EXIT_LOAD_FAILED
    except MemoryLimitTooLow as exc:
        log.error("worker %d: %s", os.getpid(), exc)
        return EXIT_LOAD_FAILED
    except InvalidSpec as exc:
        log.error("worker %d: %s", os.getpid(), exc)
        return 1
    except Refused:
        return EXIT_REFUSED
