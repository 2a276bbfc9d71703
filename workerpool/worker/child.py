"""How a spawned worker or template starts: ``python -m workerpool.worker.child worker|template ARGS``.

A terminal's Ctrl-C goes to its whole process group, spawned children included. The supervisor
alone handles it. A child is started with those signals blocked (``Process.spawn``), so one
that arrives while the interpreter starts waits; here, its first lines, it ignores them (which
drops one waiting) and unblocks them. Before, a Ctrl-C then printed a traceback from each child.
"""

from __future__ import annotations

import signal
import sys

from .spec import CONTROL_SIGNALS, WorkerSpec


def main() -> None:
    for signum in CONTROL_SIGNALS:  # one pending since the spawn is dropped by this
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CONTROL_SIGNALS)  # blocked by Process.spawn
    role, *argv = sys.argv[1:]
    if role == "worker":
        from .main import main as run_worker

        sys.exit(run_worker(WorkerSpec.from_argv(argv)))
    from .template import main as run_template

    run_template(argv)


if __name__ == "__main__":
    main()
