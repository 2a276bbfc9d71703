"""The ``workerpool`` console command.

Ctrl-C while the command starts is held back (SIGINT blocked from this module's first lines),
not raised: Python runs a signal handler at whichever bytecode comes next, and one that raises
there can land in a weakref callback (an import's module lock has one) or a finaliser, where
Python prints the exception and drops it, or in an extension's import, which turns it into an
ImportError. A dropped Ctrl-C let ``serve`` start and serve on. The command line releases it
once a command is about to run (``cli.main``: a Ctrl-C that came meanwhile then ends it, exit
130), a pool only once its loop takes its signals (``supervisor.signals``).
"""

from __future__ import annotations

import signal
import sys

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def main() -> int:
    from .cli.main import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
