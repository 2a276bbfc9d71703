"""The private runtime directory that holds the supervisor's ipc sockets, and the cache folder.

Each server makes its own ``pool-*`` directory there, with an ``owner`` file naming its pid
and that process's start time. A server killed with SIGKILL cannot remove its directory, so the
next server removes every ``pool-*`` directory whose owner is gone (and only those: other
servers may share the runtime directory).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time

import psutil

from .atomic import replace_atomically

log = logging.getLogger(__name__)

UNOWNED_GRACE = 60.0  # seconds a pool directory may exist without its owner file
POOL_PREFIX = "pool-"
OWNER_FILE = "owner"


def runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/workerpool`` or ``/tmp/workerpool-<uid>``, created 0700 and checked ours."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(base, "workerpool") if base else os.path.join(
        tempfile.gettempdir(), f"workerpool-{os.getuid()}"
    )
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must be a directory owned by uid {os.getuid()} with mode 0700")
    return path


def default_cache_dir() -> str:
    """Where models keep what they prepare once per machine: ``$XDG_CACHE_HOME/workerpool``,
    else ``~/.cache/workerpool``. On disk, unlike the runtime directory (often in memory)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "workerpool")


def make_pool_dir() -> str:
    """A new private directory for this server's sockets, after removing stale ones."""
    base = runtime_dir()
    _remove_stale_pool_dirs(base)
    path = tempfile.mkdtemp(prefix=POOL_PREFIX, dir=base)
    me = psutil.Process()
    # Whole or absent: a server starting meanwhile must not read half of it and take the
    # directory for a dead one's (absent, it waits out UNOWNED_GRACE).
    with replace_atomically(os.path.join(path, OWNER_FILE)) as f:
        f.write(json.dumps({"pid": me.pid, "started": me.create_time()}).encode())
    return path


def _remove_stale_pool_dirs(base: str) -> None:
    for entry in os.scandir(base):
        if entry.name.startswith(POOL_PREFIX) and entry.is_dir(follow_symlinks=False) \
                and not _owner_alive(entry.path):
            log.info("removing %s, left by a server that is gone", entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)


def _owner_alive(path: str) -> bool:
    """False when the owner file names a process that is gone (a reused pid counts as gone:
    its start time differs). A directory being created has no owner file yet: alive for
    ``UNOWNED_GRACE`` seconds, then a leftover (of a version that wrote none, say)."""
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            owner = json.load(f)
        pid, started = int(owner["pid"]), float(owner["started"])
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - os.stat(path).st_mtime < UNOWNED_GRACE
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).create_time() == started
    return False


def default_control_endpoint() -> str:
    return f"ipc://{os.path.join(runtime_dir(), 'control.sock')}"


def ipc_path(endpoint: str) -> str | None:
    """The socket file an ``ipc://`` endpoint names; None for any other endpoint, and for Linux's
    abstract ``ipc://@name``, which is no file and has no permissions."""
    path = endpoint.removeprefix("ipc://")
    return path if endpoint.startswith("ipc://") and path and not path.startswith("@") else None


def socket_address(path: str) -> str:
    """What the kernel takes for a Unix socket path: a leading ``@`` names Linux's abstract
    namespace (a NUL byte there), which has no file."""
    return "\0" + path[1:] if path.startswith("@") else path


def is_local(endpoint: str) -> bool:
    """Whether only this machine can reach ``endpoint`` (ipc, inproc or loopback TCP)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")
