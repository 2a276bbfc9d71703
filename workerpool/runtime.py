"""The private runtime directory that holds the supervisor's ipc sockets."""

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


def default_control_endpoint() -> str:
    return f"ipc://{os.path.join(runtime_dir(), 'control.sock')}"


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def is_local(endpoint: str) -> bool:
    """Whether only this machine can reach ``endpoint`` (ipc, inproc or loopback TCP)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")
