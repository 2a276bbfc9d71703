"""The command line and Python as a user runs them, output captured."""

from __future__ import annotations

import os
import subprocess
import sys


def python(*args: str | os.PathLike, timeout: float = 120, env: dict[str, str] | None = None,
           cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with this interpreter, output captured as text; the exit code is checked
    by the caller. ``env``: variables set on top of ``os.environ``, which is then all it gets
    (not the COLUMNS and LINES that readline, once imported, puts in the process's own);
    ``cwd``: the directory it runs in."""
    return subprocess.run(
        [sys.executable, *map(str, args)], check=False, capture_output=True, text=True, timeout=timeout,
        env=None if env is None else os.environ | env, cwd=cwd,
    )


def cli(*args: str | os.PathLike, timeout: float = 120, env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess[str]:
    """``workerpool ARGS``, as a user runs it."""
    return python("-m", "workerpool", *args, timeout=timeout, env=env, cwd=cwd)
