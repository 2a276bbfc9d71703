"""The few Linux process controls the pool relies on, through ``prctl(2)`` and glibc's
``malloc_trim``.

Elsewhere they do nothing: the worker's loop still notices between requests that its
supervisor is gone.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
NAME_MAX = 15  # bytes of a process name (the kernel's comm), without the terminating NUL


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, argument: int | bytes, what: str) -> None:
    if not sys.platform.startswith("linux"):
        return
    value = ctypes.c_char_p(argument) if isinstance(argument, bytes) else ctypes.c_ulong(argument)
    unused = ctypes.c_ulong(0)
    if _libc().prctl(ctypes.c_int(option), value, unused, unused, unused):
        raise OSError(ctypes.get_errno(), f"prctl({what}) failed")


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process as soon as its parent dies, even in the middle of a
    request. False when the parent is no longer ``parent``: it died before this took effect,
    and nothing would kill this process."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "PR_SET_PDEATHSIG")
    return os.getppid() == parent


def become_subreaper() -> None:
    """Have orphaned descendants reparented to this process instead of init: a worker forked by
    the template (through a short-lived intermediate) becomes the supervisor's own child."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")


def set_name(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and ``pgrep`` show: forked processes share their
    command line with the supervisor, so this is what tells them apart."""
    _prctl(PR_SET_NAME, name.encode()[:NAME_MAX], "PR_SET_NAME")


def release_free_memory() -> None:
    """Give the pages the C heap holds free back to the system (glibc's ``malloc_trim``): what
    a large pass freed otherwise stays the process's private memory. Elsewhere nothing."""
    trim = getattr(_libc(), "malloc_trim", None) if sys.platform.startswith("linux") else None
    if trim is not None:
        trim(ctypes.c_size_t(0))
