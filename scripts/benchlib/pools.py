"""workerpool servers as the benchmarks start them: a control socket and a log of their own in
the run's scratch directory, warned-only logging, and every worker warmed before anything is
timed or read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from workerpool.protocol import messages as protocol
from workerpool.testing import NotReady, ServerProcess, serve_args

from .runs import Load
from .zmq_load import Frames, warm_workerpool


@dataclass(frozen=True)
class WarmPool:
    """A running pool every worker of which has answered."""

    server: ServerProcess
    control: str  # its control endpoint
    workers: set[int]  # the pids that answered

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def pid(self) -> int:
        """The supervisor's."""
        assert self.server.proc is not None
        return self.server.proc.pid


@contextlib.contextmanager
def warmed_pool(model: str | list[str], workers: int, directory: str, name: str, request: Frames, *options: str,
                env: Mapping[str, str] | None = None) -> Iterator[WarmPool]:
    """``workerpool serve`` of ``model`` (or several) with ``options``, its control socket ``control-NAME.sock`` (never the
    default one, which another server on this machine may hold) and its log ``NAME.log`` in
    ``directory``, once each of the workers its ready line counts has answered ``request``.
    A pool that does not start raises RuntimeError, as a failed run does."""
    control = f"ipc://{directory}/control-{name}.sock"
    args = serve_args(model, workers, "--control", control, "--log-level", "warning", *options)
    try:
        with ServerProcess(args, env=env, log_path=os.path.join(directory, f"{name}.log")) as server:
            assert server.ready is not None
            answered = warm_workerpool(server.endpoint, request, server.ready.workers)
            yield WarmPool(server, control, answered)
    except NotReady as exc:
        raise RuntimeError(str(exc)) from None


@contextlib.contextmanager
def http_pool(load: Load, port: int, *options: str, tree: str | None = None) -> Iterator[WarmPool]:
    """A warmed pool on ``load`` with its HTTP front door open on ``port``, the model named
    ``mlp``, and ``options``; ``tree``: run the workerpool of that checkout instead of this one."""
    frames = protocol.encode_request(0, load.row)
    env = None if tree is None else {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    with warmed_pool(load.model, load.workers, load.directory, "baseline" if tree else "workerpool", frames,
                     "--http", f"127.0.0.1:{port}", "--model-name", "mlp",
                     "--threads-per-worker", str(load.blas_threads), *options, env=env) as pool:
        yield pool
