"""The contract between a supervisor and the worker processes it starts.

A worker is a fresh interpreter (``python -m workerpool.worker.child worker``), so everything it needs to
know crosses a command line. :class:`WorkerSpec` is that command line, typed: the supervisor
builds one and calls :meth:`WorkerSpec.to_argv`; the worker calls :meth:`WorkerSpec.from_argv`.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.pool import (
    DEFAULT_LOAD,
    DEFAULT_LOG_LEVEL,
    HEARTBEAT_SECONDS,
    LIVENESS_BEATS,
    LOAD_MODES,
)

# Exit codes by which a worker tells its supervisor why it stopped.
EXIT_LOAD_FAILED = 3  # the file or the model is unusable
EXIT_FILE_CHANGED = 4  # the file was replaced while the worker started: validate the new one
EXIT_REFUSED = 5  # the router refused the worker: its model does not fit
TOKEN_ENV = "WORKERPOOL_WORKER_TOKEN"  # the secret a local worker registers with
EXIT_RECYCLED = 6  # the worker's private memory passed --max-worker-memory: replace it
# How a supervisor tells a worker to leave the pool. Not SIGTERM: a forked worker shares the
# supervisor's command line, and ``pkill -f`` or a service manager's SIGTERM to every process
# must drain the pool through the supervisor, not make each worker walk away from its queue.
STOP_SIGNAL = signal.SIGUSR1
# The supervisor's own control signals: a template or worker that shares its command line (so
# ``pkill -HUP -f 'workerpool serve'`` reaches it) must neither die nor stop on them.
CONTROL_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGTTIN, signal.SIGTTOU)


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What one worker serves and how it reaches its router."""

    path: str
    backend: str
    model: str | None = None
    load: str = DEFAULT_LOAD
    generation: int = 1
    expect: list[int] | None = None  # the file identity the supervisor validated
    heartbeat: float = HEARTBEAT_SECONDS
    liveness: int = LIVENESS_BEATS
    log_level: str = DEFAULT_LOG_LEVEL
    remote: bool = False  # the router is on another host: wait for it instead of exiting
    ready_fd: int | None = None  # an inherited pipe, written once the model is built
    curve_key: str | None = None  # this host's secret key file
    curve_server_key: str | None = None  # the router's public key file
    max_memory: int | None = None  # private memory (bytes) past which the worker recycles itself
    parent: int | None = None  # the supervisor's pid: the worker must not outlive it
    threads: int | None = None  # BLAS/OpenMP threads; None leaves the libraries' defaults

    def to_argv(self) -> list[str]:
        argv = [
            self.path,
            "--backend", self.backend,
            "--load", self.load,
            "--generation", str(self.generation),
            "--heartbeat", str(self.heartbeat),
            "--liveness", str(self.liveness),
            "--log-level", self.log_level,
        ]
        if self.model is not None:
            argv += ["--model", self.model]
        if self.expect is not None:
            argv += ["--expect", json.dumps(self.expect)]
        if self.remote:
            argv.append("--remote")
        if self.ready_fd is not None:
            argv += ["--ready-fd", str(self.ready_fd)]
        if self.curve_key is not None:
            argv += ["--curve-key", self.curve_key]
        if self.curve_server_key is not None:
            argv += ["--curve-server-key", self.curve_server_key]
        if self.max_memory is not None:
            argv += ["--max-memory", str(self.max_memory)]
        if self.parent is not None:
            argv += ["--parent", str(self.parent)]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> WorkerSpec:
        parser = build_parser()
        args = parser.parse_args(argv)
        if bool(args.curve_key) != bool(args.curve_server_key):
            parser.error("--curve-key and --curve-server-key go together")
        return cls(**vars(args))


@functools.cache  # built once in a template, shared by the workers it forks
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workerpool-worker",
                                     description="One worker process; started by a supervisor.")
    parser.add_argument("path")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--load", choices=LOAD_MODES, default=DEFAULT_LOAD)
    parser.add_argument("--generation", type=int, default=1)
    parser.add_argument("--expect", type=json.loads, default=None,
                        help="the file identity the supervisor validated, as a JSON list")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT_SECONDS)
    parser.add_argument("--liveness", type=int, default=LIVENESS_BEATS)
    parser.add_argument("--log-level", default=DEFAULT_LOG_LEVEL)
    parser.add_argument("--remote", action="store_true",
                        help="the router is on another host: wait for it instead of exiting")
    parser.add_argument("--ready-fd", type=int, default=None,
                        help="write to this inherited pipe once the model is built")
    parser.add_argument("--curve-key", default=None, help="this host's secret key file")
    parser.add_argument("--curve-server-key", default=None, help="the router's public key file")
    parser.add_argument("--max-memory", type=int, default=None,
                        help="bytes of private memory past which the worker recycles itself")
    parser.add_argument("--parent", type=int, default=None,
                        help="the supervisor's pid: exit at once if it is already gone")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for numpy's BLAS and OpenMP pools")
    return parser
