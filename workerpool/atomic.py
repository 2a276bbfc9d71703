"""Replace a file so that readers see the old version or the new one, never a partial file.

Processes that have the old file mapped keep its inode, which is why workerpool publishes
weights by rename and never rewrites a served file in place.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

_counter = itertools.count()


@contextmanager
def replace_atomically(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a new temporary file beside ``path``; when the block succeeds, make it ``path``.

    Success: fsync the file, rename it over ``path``, fsync the directory, so the new version
    survives a crash. Failure (any exception): remove the temporary file; ``path`` is untouched.
    The new file keeps the permissions of the one it replaces, not the writer's umask: a
    service that could read the old weights can read the new ones.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}-{next(_counter)}.tmp")
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    try:
        with open(temp, "xb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    # Past the rename the new file is in place; syncing the directory makes that survive a crash.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
