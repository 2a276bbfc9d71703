"""The ``serve`` role: the router, its control socket and what they report.

Composed with a :class:`~workerpool.supervisor.core.Supervisor`, it gives each worker the
supervisor starts a link of its own to the router, serves each model the supervisor serves
(added and removed while it runs too), moves workers to new weights through each model's
rolling reload, and answers ``status``, ``reload``, ``check`` and ``models`` (``commands.py``).
It is made over parts already bound (``serving_build.py``).
"""

from __future__ import annotations

import signal

from ..config.pool import STOP_TIMEOUT_SECONDS
from ..protocol import messages as protocol
from ..router.core import Router
from ..supervisor.process import Child
from ..supervisor.ready_line import serve_line
from ..weights.served import ServedModel
from ..worker.spec import WorkerSpec
from .commands import ControlCommands
from .serving_parts import ServingParts


class ServingRole:
    """The local router with its control socket, for ``workerpool serve``."""

    leave_timeout = STOP_TIMEOUT_SECONDS  # local workers leave at once: the router holds nothing
    backend = None  # local workers talk over links (``router/local_links.py``), not an endpoint
    ready_pipe = False  # the router hears it: the worker registers
    surge = 0  # workers switch to new weights in place, one at a time: none starts for it

    def __init__(self, parts: ServingParts, commands: ControlCommands) -> None:
        self.parts = parts
        self.commands = commands

    @property
    def requests(self) -> Router:
        """The router holds the requests: shutdown drains it."""
        return self.parts.router

    def prepare(self, spec: WorkerSpec) -> WorkerSpec:
        return spec

    @property
    def stop_patience(self) -> float:
        return self.parts.config.request_timeout + self.leave_timeout

    def child_started(self, child: Child) -> None:
        """The router reads the worker's link from now on (what it sent before waits there)."""
        assert child.link is not None, "a local worker is started with a link"
        child.address = self.parts.links.local.attach(child.link)
        child.link = None

    def child_exited(self, child: Child, why: str) -> None:
        self.parts.router.worker_exited(child.token, why, asked=child.stopping,
                                        outside=child.returncode in (-signal.SIGKILL, -signal.SIGBUS))
        if child.address is not None:
            self.parts.links.local.detach(child.address)

    def roll_out(self, model: str) -> None:
        """Move every worker to ``model``'s newest generation (a model new to the router is
        served from now on, each worker loading it in turn)."""
        self.parts.switch_failures.pop(model, None)
        served = self.parts.pool.models[model]
        if model not in self.parts.router.policies:
            serve_model(self.parts.router, served)
        order = protocol.encode_header({"model": served.spec().to_data()})
        self.parts.router.begin_rollout(model, served.current.generation, order)

    def model_removed(self, model: str) -> None:
        self.parts.switch_failures.pop(model, None)
        self.parts.router.remove_model(model)

    def reload_done(self) -> bool:
        return self.parts.router.reload_complete()

    def ready_line(self, path: str, size: str, model: str, workers: int) -> str:
        return serve_line(path, size, model, workers, self.parts.links.endpoint)


def serve_model(router: Router, served: ServedModel) -> None:
    """Have ``router`` serve ``served`` with its own settings."""
    entry = served.entry
    router.add_model(served.name, served.current.signature, max_rows=entry.max_batch, wait=entry.batch_wait,
                     budget=entry.pass_budget, limit=entry.workers)
