"""The few Linux process controls the pool relies on, through ``prctl(2)`` (and glibc's
``malloc_trim``), reading a wake-up pipe empty, and what /proc says of processes: their
children, and which of them map a file.

Elsewhere they do nothing: the worker's loop still notices between requests that its
supervisor is gone.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from dataclasses import dataclass

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


_statm: tuple[int, int] | None = None  # (pid, descriptor): /proc/self names the process that opened it


def private_resident() -> int:
    """Resident private memory in bytes (RssAnon): resident less file-backed and shared pages,
    from ``/proc/self/statm``, kept open (one ``pread`` a call) as it is read after every
    request; reopened in a forked child. 0 elsewhere."""
    global _statm
    pid = os.getpid()
    try:
        if _statm is None or _statm[0] != pid:
            _statm = pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        fields = os.pread(_statm[1], 256, 0).split()
    except OSError:
        return 0
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def drain_pipe(fd: int) -> None:
    """Read the non-blocking pipe ``fd`` empty: its bytes are wake-ups, not data."""
    while True:
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            return


@dataclass(frozen=True)
class MappedFile:
    """How a file shows in /proc/<pid>/maps and smaps: device, inode and the path it was mapped
    under; the one rule for telling a mapping of it."""

    device: int
    inode: int
    size: int
    path: bytes

    @classmethod
    def of(cls, path: str) -> MappedFile | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_dev, st.st_ino, st.st_size, os.fsencode(os.path.realpath(path)))

    def mapped_in(self, line: bytes) -> bool:
        """Whether a line of /proc/<pid>/maps (or a mapping's first line in smaps) maps this
        file: the same inode, and the same device or path (overlayfs shows the backing device).

        An older file renamed away keeps its mapping under the old path plus " (deleted)", but
        not this inode, so a worker still running on it is not counted.
        """
        fields = line.split(None, 5)
        if len(fields) != 6 or int(fields[4]) != self.inode:
            return False
        major, minor = (int(part, 16) for part in fields[3].split(b":"))
        path = fields[5].rstrip(b"\n").removesuffix(b" (deleted)")
        return os.makedev(major, minor) == self.device or path == self.path


def processes_mapping(path: str) -> list[int]:
    """The processes (of those whose maps this one may read) that map the file at ``path``: a
    server's workers map the weights they serve."""
    found = MappedFile.of(path)
    if found is None:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps", "rb") as maps:
                if any(found.mapped_in(line) for line in maps):
                    pids.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def child_pids() -> set[int] | None:
    """This process's children, from each thread's ``/proc/self/task/*/children``: it costs as
    many reads as there are threads, where walking ``/proc`` (psutil) reads every process on
    the machine, once per child that exits. None where the kernel lists no children."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                pids.update(int(pid) for pid in children.read().split())
        except FileNotFoundError:
            if task == str(os.getpid()):  # the main thread is there: the kernel lists nothing
                return None
    return pids
