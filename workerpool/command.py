"""The ``workerpool`` console command.

The command-line module imports numpy and ZeroMQ, a tenth of a second or more. Ctrl-C pressed
meanwhile ends the command quietly (exit 130) instead of with a traceback: the handler below is
in place from this module's first lines until the commands, which handle Ctrl-C themselves, run.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def _quit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(INTERRUPTED)


signal.signal(signal.SIGINT, _quit_quietly)


def main() -> int:
    from .cli.main import main as run

    signal.signal(signal.SIGINT, signal.default_int_handler)
    return run()


if __name__ == "__main__":
    sys.exit(main())
