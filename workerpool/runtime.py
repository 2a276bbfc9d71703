"""The private runtime directory that holds the default control socket, and the cache folder.

Local workers talk to the router over socket pairs, which leave nothing in it.
"""

from __future__ import annotations

import os
import stat
import tempfile


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
