"""The ``workerpool`` console command.

The command-line module imports numpy and ZeroMQ; importing it here, inside the guard, lets
Ctrl-C pressed while they load end the command quietly (exit 130) instead of with a traceback.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
