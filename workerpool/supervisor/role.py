"""What the supervisor asks of the role it is composed with (``serve``'s router or ``workers``'
uplink): the one seam between supervising processes and serving requests.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Protocol

from ..errors import ErrorCode
from ..worker.spec import WorkerSpec
from .process import Child

if TYPE_CHECKING:
    from ..events.loop import Loop
    from ..weights.served import ServedModels
    from .model_changes import ModelChanges
    from .starters import Starter


class Pool(Protocol):
    """What a role may use of the supervisor it serves (``core.Supervisor`` is one): its loop,
    the models and their changes, the workers and how they start; the decisions on them stay
    the supervisor's (``manage_workers``, ``child_ready``, ``stop_child``)."""

    loop: Loop
    models: ServedModels
    changes: ModelChanges
    children: dict[int, Child]
    starter: Starter
    target: int
    stopping: bool
    announced: bool
    replacements: int
    threads_per_worker: int

    def helper_pids(self) -> list[int]: ...

    def child_ready(self, child: Child) -> None: ...

    def stop_child(self, child: Child) -> None: ...

    def manage_workers(self) -> int: ...


class Requests(Protocol):
    """The requests a role holds, as shutdown sees them."""

    @property
    def unfinished(self) -> int: ...

    def stop_accepting(self) -> None: ...

    def fail_all(self, code: ErrorCode, message: str) -> None: ...


class Role(Protocol):
    """What a supervisor is supervising for: ``serve``'s router or ``workers``' uplink."""

    @property
    def requests(self) -> Requests | None:
        """The requests this role holds, drained on shutdown; None when it holds none."""

    @property
    def leave_timeout(self) -> float:
        """Seconds stopped workers get to leave before they are killed."""

    @property
    def stop_patience(self) -> float:
        """Seconds a worker told to stop while the pool serves on (SIGTTOU, a rolling reload)
        may take: its request, then its goodbye. Past it the worker is killed."""

    @property
    def backend(self) -> str | None:
        """Where this role's workers connect to their router; None: each has a link to it."""

    @property
    def ready_pipe(self) -> bool:
        """Whether workers report a built model through a pipe (else the router hears of it)."""

    def prepare(self, spec: WorkerSpec) -> WorkerSpec:
        """``spec`` with what this role's workers need added."""

    def child_started(self, child: Child) -> None: ...

    def child_exited(self, child: Child, why: str) -> None: ...

    def roll_out(self, model: str) -> None:
        """A model's watcher accepted a new generation (or the model is new): move the workers
        to it."""

    def model_removed(self, model: str) -> None:
        """``model`` is no longer served: its workers let go of it."""

    @property
    def surge(self) -> int:
        """Workers wanted over the target for now (a rollout that starts new ones before the
        old ones leave)."""

    def reload_done(self) -> bool:
        """Whether every worker serves the newest generation."""

    def ready_line(self, path: str, size: str, model: str, workers: int) -> str:
        """The one line printed on stdout once every worker is ready (see ``ready_line.py``)."""


OpenRole = Callable[[Pool, ExitStack], Role]
"""Makes the role for a pool once the supervisor has loaded its models and opened its starter:
binds or checks endpoints, registers readers, pushes undo steps on the ``ExitStack``."""
