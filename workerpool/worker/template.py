"""The warm template: a process that has imported everything a worker needs and forks workers.

A worker forked from it skips the interpreter's start and the imports, and shares their pages
with the template and its siblings (copy-on-write), as gunicorn's ``--preload`` shares its
arbiter's. It holds no ZeroMQ context and no thread, so there is nothing a fork could copy in
a broken state. For the built-in numpy models it also builds each ordered model's generation
once (``_share_models``) and hands them to the workers it forks, which then share that work's
pages too; any other model each worker loads itself, exactly as a spawned one.

Each worker is forked twice (template, then a short-lived intermediate) and the intermediate
exits at once, so the worker is reparented to the supervisor, a child subreaper: the
supervisor reaps it and reads its exit status itself, and the worker's parent-death signal
follows the supervisor, not the template. A template that dies takes no worker with it.

The supervisor and the template speak over a ``SOCK_SEQPACKET`` socket pair, one JSON object
per message. The template says ``{"ready": true}`` once its imports are done; an order is
``{"id": n, "spec": {...}, "token": "..."}`` (the spec as ``WorkerSpec.to_data`` gives it),
with at most one descriptor attached (a local worker's end of its link, or a worker host's
ready pipe: the spec's ``link_fd`` or ``ready_fd`` names it), answered by ``{"id": n, "pid": p}`` or ``{"id": n, "error": "..."}``. The
supervisor also says ``{"keep": [names]}`` when a model is no longer served (not answered): what
the template built of any other model is let go of. The
forked worker gets the checked spec itself: nothing is parsed again as a command line. An
order over :data:`MAX_ORDER_BYTES`, or one without an id to answer, ends the template: the
supervisor and it no longer understand each other.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import select
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from .. import burnpack, models
from ..linux import controls
from ..logs import LEVELS, setup_logging
from ..models import mlp, mnist
from ..models.loaded import LoadedModel
from ..units import KiB
from . import main as worker
from .spec import CONTROL_SIGNALS, STOP_SIGNAL, TOKEN_ENV, InvalidSpec, ModelSpec, WorkerSpec

log = logging.getLogger(__name__)

MAX_ORDER_BYTES = 64 * KiB  # an order as JSON: the supervisor sends none larger
MAX_TOKEN = 256  # characters of a worker's token (the supervisor's have 32)
ORDER_KEYS = {"id", "spec", "token"}
REPARENT_TIMEOUT = 5.0  # seconds a new worker waits to become the supervisor's child
SHARED_MODELS = (mlp.NAME, mnist.NAME)  # built here for the workers (see _share_model)
STALE_CHECK_SECONDS = 1.0  # how often an idle template looks whether its model's file is gone

_shared: dict[str, tuple[tuple[Any, ...], LoadedModel]] = {}  # by model name: the spec it fits, the model


def run(sock: socket.socket, parent: int) -> NoReturn:
    """Serve fork requests until the supervisor closes its end (or dies: then so does this)."""
    code = 1
    try:
        controls.set_name("wp-template")
        if not controls.die_with_parent(parent):
            os._exit(1)
        devnull = os.open(os.devnull, os.O_RDONLY)  # as a spawned worker's stdin
        os.dup2(devnull, 0)
        os.close(devnull)
        _ignore_the_supervisors_signals()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a model's import may have ignored it
        worker.thread_pools()  # built here once, for all the workers, rather than in each
        gc.collect()
        gc.freeze()  # what is here now is never traversed again: its pages stay shared
        sock.send(json.dumps({"ready": True}).encode())
        while True:
            if not select.select([sock], [], [], STALE_CHECK_SECONDS)[0]:
                _drop_stale_models()
                continue
            try:
                size = sock.recv_into(bytearray(1), 1, socket.MSG_PEEK | socket.MSG_TRUNC)  # still unread
                if size > MAX_ORDER_BYTES:
                    log.error("template %d: an order of %d bytes, over %d; exiting", os.getpid(), size,
                              MAX_ORDER_BYTES)
                    break
                data, fds, flags, _ = socket.recv_fds(sock, MAX_ORDER_BYTES, 1)
            except ConnectionResetError:  # the supervisor closed its end before reading ours: gone
                data = b""
            if not data:
                code = 0
                break
            try:
                order = _decoded(data)
                if set(order) == {"keep"} and not fds:
                    _keep_only(order["keep"])
                    continue
                reply = _fork_order(order, fds, bool(flags & socket.MSG_CTRUNC), sock)
            finally:
                for fd in fds:
                    os.close(fd)
            if reply is None:
                log.error("template %d: an order without an id to answer, %r; exiting", os.getpid(),
                          data[:100])
                break
            sock.send(json.dumps(reply).encode())
    except (BrokenPipeError, ConnectionResetError):  # the supervisor closed its end first: it stopped
        code = 0
    except BaseException:
        log.exception("template %d failed", os.getpid())
    finally:
        os._exit(code)


class BadOrder(ValueError):
    """An order the supervisor would not send: refused, and the supervisor told why."""


def _fork_order(order: dict[str, Any], fds: list[int], truncated: bool,
                sock: socket.socket) -> dict[str, Any] | None:
    """Fork the worker ``order`` asks for and say which, or why not; None for no order at all.
    ``truncated``: descriptors beyond the one an order may carry came and were dropped."""
    if type(order.get("id")) is not int:
        return None
    try:
        spec, token = _checked(order, fds, truncated)
        _share_models(spec)
        pid = fork_worker(spec, token, sock)
    except (BadOrder, InvalidSpec) as exc:
        return {"id": order["id"], "error": f"the template refused the order: {exc}"}
    except OSError as exc:
        return {"id": order["id"], "error": f"cannot fork a worker: {exc.strerror or exc}"}
    return {"id": order["id"], "pid": pid}


def _decoded(data: bytes) -> dict[str, Any]:
    """The JSON object ``data`` holds; empty when it holds none."""
    try:
        order = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return {}
    return order if isinstance(order, dict) else {}


def _checked(order: dict[str, Any], fds: list[int], truncated: bool) -> tuple[WorkerSpec, str]:
    """The spec an order carries, the descriptor it names (its link's, or its ``ready_fd``)
    the one attached, and the worker's token."""
    if set(order) != ORDER_KEYS:
        raise BadOrder(f"its keys are {sorted(order)}, not {sorted(ORDER_KEYS)}")
    if truncated:
        raise BadOrder("more than one descriptor came with it")
    token = order["token"]
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN:
        raise BadOrder(f"its token is not a string of 1 to {MAX_TOKEN} characters")
    spec = WorkerSpec.from_data(order["spec"])
    if spec.link_fd is not None and spec.ready_fd is not None:
        raise BadOrder("its spec names two descriptors, a link's and a ready pipe's")
    if (spec.link_fd is not None or spec.ready_fd is not None) != bool(fds):
        raise BadOrder("the descriptor its spec names did not come with it" if not fds
                       else "a descriptor came that its spec does not name")
    if spec.link_fd is not None:
        return replace(spec, link_fd=fds[0]), token
    return replace(spec, ready_fd=fds[0] if fds else None), token


def fork_worker(spec: WorkerSpec, token: str, sock: socket.socket) -> int:
    """Fork a worker for ``spec`` through an intermediate that exits at once; its pid."""
    report_r, report_w = os.pipe()
    try:
        intermediate = os.fork()
    except OSError:
        os.close(report_r)
        os.close(report_w)
        raise
    if intermediate == 0:
        try:
            os.close(report_r)
            me = os.getpid()
            controls.die_with_parent(os.getppid())  # a stopped intermediate must not outlive the pool
            # The template ignores the stop signal, and an ignored signal is discarded: blocked,
            # one the supervisor sends before the worker sets its own action stays pending.
            signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})
            try:
                pid = os.fork()
            except OSError as exc:
                os.write(report_w, f"!{exc.errno}".encode())
                raise
            if pid == 0:
                os.close(report_w)
                _become_worker(spec, token, sock, me)
            os.write(report_w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(report_w)
    try:
        reported = os.read(report_r, 32)
    finally:
        os.close(report_r)
        with contextlib.suppress(ChildProcessError):  # reaped already: the pid is the answer
            os.waitpid(intermediate, 0)
    if reported.startswith(b"!"):  # the second fork failed: its errno
        errno = int(reported[1:])
        raise OSError(errno, os.strerror(errno))
    if not reported:
        raise OSError("the intermediate process died before it forked")
    return int(reported)


def _become_worker(spec: WorkerSpec, token: str, sock: socket.socket, intermediate: int) -> NoReturn:
    """In the forked worker: shed what is the template's, then run the worker's main (handing
    it the model built for its order, in a list it empties: no frame keeps the model then, and
    a reload frees it)."""
    global _shared
    code = 1
    try:
        sock.close()
        for signum in signal.valid_signals():  # Python handlers are the template's (the control
            if callable(signal.getsignal(signum)):  # signals stay ignored: see worker.main)
                signal.signal(signum, signal.SIG_DFL)
        signal.signal(STOP_SIGNAL, signal.SIG_DFL)  # stops a worker that has no handler for it yet
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
        if "numpy.random" in sys.modules:  # the random module reseeds itself after a fork
            sys.modules["numpy.random"].seed()  # numpy's global generator does not
        _wait_until_adopted(intermediate)
        os.environ[TOKEN_ENV] = token
        handoff = {name: model for name, (_, model) in _shared.items()}
        _shared = {}
        code = worker.main(spec, handoff)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("worker %d failed", os.getpid())
    finally:
        logging.shutdown()  # os._exit skips what exit would do: at least flush the logs
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _share_models(spec: WorkerSpec) -> None:
    """Make ``_shared`` the models a worker ordered with ``spec`` serves that can be built here
    once for every worker forked on them (the others each worker loads itself).

    Building a model runs much code (reading and checking the file, making the views), and
    CPython writes the reference counts of every object that code touches: in each worker that
    builds its own, some 0.6 MiB of pages shared with the template become private copies.
    Built here once, those pages stay shared. Only the built-in numpy models are built here:
    they hold no thread, which a fork would copy in a broken state, and read nothing but the
    file. A model no longer ordered, or of another generation, is dropped first, so the
    template maps one generation of each model at most.
    """
    keys = {model.name: _key(spec, model) for model in spec.models}
    for name in [name for name, (key, _) in _shared.items() if keys.get(name) != key]:
        del _shared[name]
    if spec.load != "mmap" or spec.remote:
        return
    built = False
    for model in spec.models:
        if model.name not in _shared:
            loaded = _shared_model(spec, model)
            if loaded is not None:
                _shared[model.name] = keys[model.name], loaded
                built = True
    if built:
        gc.collect()
        gc.freeze()  # the workers' collections never traverse the models' objects


def _key(spec: WorkerSpec, model: ModelSpec) -> tuple[Any, ...]:
    return (model.path, model.source, model.factory, spec.load, model.generation, model.expect, model.max_batch,
            model.truncate)


def _shared_model(spec: WorkerSpec, model: ModelSpec) -> LoadedModel | None:
    """``model`` built here for the workers, or None when it is not a built-in numpy model (or
    fails: each worker meets that itself and reports it)."""
    try:
        pack = burnpack.read(model.path, source=model.source)  # mapped, as --load mmap maps it
        # Named as choose_model would name it, without importing a module the file names.
        name = model.factory or pack.metadata.get(models.MODEL_KEY) or models.recognise(pack.tensors)
        if name not in SHARED_MODELS:
            return None
        return LoadedModel(model.path, model.factory, spec.load, model.generation, spec.threads,
                           spec.cache_dir, model.source, pack, max_rows=model.max_batch,
                           truncate=model.truncate)
    except Exception as exc:  # noqa: BLE001 - whatever it is, each worker meets it and reports it
        log.debug("template %d: not building generation %d of %s for its workers: %s", os.getpid(),
                  model.generation, model.name, exc)
        return None


def _keep_only(names: Any) -> None:
    """Let go of what was built for the workers of a model no longer served."""
    kept = set(names) if isinstance(names, list) else set()
    for name in [name for name in _shared if name not in kept]:
        del _shared[name]


def _drop_stale_models() -> None:
    """Unmap a model built for the workers once the supervisor has let go of its file (two
    newer generations came, or the model was removed and its file deleted): the template must
    not keep a replaced file's disk space."""
    for name, ((path, source, *_, expect, _), _) in list(_shared.items()):
        if not worker.is_identity(source or path, expect):
            del _shared[name]


def _ignore_the_supervisors_signals() -> None:
    """Only the supervisor stops the template (it closes the socket, or kills it): ``pkill -f``
    and the like must not reach it through a shared command line. A forked template inherits
    them blocked (the supervisor holds them back while it starts): ignored, those pending are
    dropped, and unblocked, none stays pending in the workers it forks."""
    supervisors = (*CONTROL_SIGNALS, STOP_SIGNAL)
    for signum in supervisors:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, supervisors)


def _wait_until_adopted(intermediate: int) -> None:
    """Wait for the intermediate to exit: the kernel reparents its child (us) to the supervisor
    before it reports the exit, which makes the pidfd readable."""
    try:
        pidfd = os.pidfd_open(intermediate)
    except ProcessLookupError:
        return  # gone, and reaped: adopted already
    try:
        select.select([pidfd], [], [], REPARENT_TIMEOUT)
    finally:
        os.close(pidfd)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """A template started as a fresh interpreter (``python -m workerpool.worker.child template``)."""
    parser = argparse.ArgumentParser(prog="workerpool-template",
                                     description="Forks workers on request; started by a supervisor.")
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket to the supervisor")
    parser.add_argument("--parent", type=int, required=True, help="the supervisor's pid")
    parser.add_argument("--model", action="append", default=[],
                        help="a served model (package.module:factory): its module is imported now")
    parser.add_argument("--log-level", choices=LEVELS, default="info")
    args = parser.parse_args(argv)
    controls.set_name("wp-template")
    if not controls.die_with_parent(args.parent):  # first: a model's import may hang
        sys.exit(1)
    _ignore_the_supervisors_signals()
    os.environ.pop("OPENBLAS_NUM_THREADS", None)  # read when numpy loaded; not the workers' setting
    setup_logging(args.log_level)
    for model in args.model:
        try:
            models.resolve(model)
        except models.ModelError as exc:
            log.error("template %d: %s", os.getpid(), exc)
            sys.exit(1)
    run(socket.socket(fileno=args.fd), args.parent)
