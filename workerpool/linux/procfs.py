"""What /proc says of processes: their memory, the mappings of a file, their children.

The pool reads a process's memory, mappings and children here alone, so a figure means the same
wherever it is shown and one rule (:meth:`MappedFile.mapped_in`) tells whether a mapping is the
model file. Figures are in bytes; a process is ``"self"`` or a pid. A process may exit while it
is read: that is an ``OSError`` for the caller to expect.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..units import KiB

Pid = int | str  # a pid, or "self"

_statm: tuple[int, int] | None = None  # (pid, descriptor): /proc/self names the process that opened it


def private_resident() -> int:
    """This process's resident private memory in bytes (RssAnon): resident less file-backed and
    shared pages, from ``/proc/self/statm``, kept open (one ``pread`` a call) as it is read
    after every request; reopened in a forked child. 0 elsewhere."""
    global _statm
    pid = os.getpid()
    try:
        if _statm is None or _statm[0] != pid:
            _statm = pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        fields = os.pread(_statm[1], 256, 0).split()
    except OSError:
        return 0
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def status_figures(pid: Pid = "self") -> dict[str, int]:
    """Every size in ``/proc/<pid>/status`` (VmData, VmPTE, RssAnon, RssFile, ...) by name."""
    with open(f"/proc/{pid}/status", "rb") as status:
        return _sizes(status)


def rollup_figures(pid: Pid = "self") -> dict[str, int]:
    """Every size in ``/proc/<pid>/smaps_rollup`` (Rss, Pss, Pss_Anon, Private_Dirty, Swap, ...)
    by name: the sums over all the process's mappings."""
    with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
        return _sizes(rollup)


def file_figures(pid: Pid, mapped: MappedFile | Iterable[MappedFile]) -> dict[str, int]:
    """The sizes of ``/proc/<pid>/smaps`` (Rss, Pss, ...) summed over the mappings of
    ``mapped`` (a file, or several: read in one pass); empty when the process maps none."""
    files = [mapped] if isinstance(mapped, MappedFile) else list(mapped)
    with open(f"/proc/{pid}/smaps", "rb") as smaps:
        return _sizes(_lines_of(smaps, files))


def _lines_of(smaps: Iterable[bytes], files: list[MappedFile]) -> Iterable[bytes]:
    """The lines of the mappings of ``files`` in a smaps file, without their first lines."""
    matching = False
    for line in smaps:
        if not line.split(None, 1)[0].endswith(b":"):  # a mapping's first line
            matching = any(mapped.mapped_in(line) for mapped in files)
        elif matching:
            yield line


def _sizes(lines: Iterable[bytes]) -> dict[str, int]:
    """``Name: <n> kB`` lines as {name: bytes}, summed where a name comes again."""
    sizes: dict[str, int] = {}
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and fields[2] == b"kB" and fields[0].endswith(b":"):
            name = fields[0][:-1].decode()
            sizes[name] = sizes.get(name, 0) + int(fields[1]) * KiB
    return sizes


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
        """The file now at ``path``; None when there is none."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_dev, st.st_ino, st.st_size, os.fsencode(os.path.realpath(path)))

    def mapped_in(self, line: bytes) -> bool:
        """Whether a line of /proc/<pid>/maps (or a mapping's first line in smaps) maps this
        file: the same inode, and the same device or path (overlayfs shows the backing device).

        An older file renamed away keeps its mapping under the old path plus " (deleted)", but
        not this inode, so a process still running on it is not counted.
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
    return [pid for pid, maps in _each_process("maps")
            if any(found.mapped_in(line) for line in maps.splitlines())]


def child_pids() -> set[int]:
    """This process's children, from each thread's ``/proc/self/task/*/children``: it costs as
    many reads as there are threads, where walking ``/proc`` reads every process on the
    machine, once per child that exits. The walk is left for a kernel that lists no children."""
    listed = _listed_children()
    return listed if listed is not None else _children_by_parent()


def _listed_children() -> set[int] | None:
    """The children the kernel lists for this process's threads; None where it lists none."""
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


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger): its state in ``/proc/<pid>/stat``
    is ``T`` or ``t``. One that is gone is not stopped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = _after_name(stat.read())[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


def _children_by_parent() -> set[int]:
    """The processes whose ``/proc/<pid>/stat`` names this one as their parent."""
    me = os.getpid()
    return {pid for pid, stat in _each_process("stat") if int(_after_name(stat)[1]) == me}


def _after_name(stat: bytes) -> list[bytes]:
    """The fields of a ``/proc/<pid>/stat`` after the name, which may hold anything: the
    state, then the parent's pid, ..."""
    return stat.rpartition(b")")[2].split()


def _each_process(name: str) -> Iterator[tuple[int, bytes]]:
    """Each process's pid and its ``/proc/<pid>/<name>``, read whole; those that are gone or not
    ours to read are passed over."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{name}", "rb") as file:
                content = file.read()
        except OSError:
            continue
        yield int(entry), content
