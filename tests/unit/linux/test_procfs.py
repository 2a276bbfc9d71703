"""``linux.procfs`` against this process's own /proc: real mappings of temporary files, a real
child process."""

from __future__ import annotations

import mmap
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from workerpool.linux import procfs
from workerpool.linux.procfs import MappedFile
from workerpool.units import KiB

SIZE = 256 * KiB


@contextmanager
def mapped(path: Path) -> Iterator[mmap.mmap]:
    """``path`` mapped read-only, every page of it read (so resident)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as view:
        for offset in range(0, len(view), mmap.PAGESIZE):
            view[offset]
        yield view


@pytest.fixture
def weights(tmp_path) -> Path:
    path = tmp_path / "weights.bpk"
    path.write_bytes(os.urandom(SIZE))
    return path


def test_a_mapped_file_is_found_in_this_process_with_its_resident_pages(weights):
    file = MappedFile.of(str(weights))
    assert file is not None and file.size == SIZE
    assert procfs.file_figures("self", file) == {}
    with mapped(weights):
        figures = procfs.file_figures(os.getpid(), file)
        assert os.getpid() in procfs.processes_mapping(str(weights))
    assert figures["Size"] == SIZE and figures["Rss"] == SIZE
    assert 0 < figures["Pss"] <= figures["Rss"]
    assert os.getpid() not in procfs.processes_mapping(str(weights))


def test_the_figures_of_every_mapping_of_the_file_are_summed(weights):
    file = MappedFile.of(str(weights))
    assert file is not None
    with mapped(weights), mapped(weights):
        assert procfs.file_figures("self", file)["Rss"] == 2 * SIZE


def test_a_file_replaced_by_rename_is_not_the_mapping_of_the_old_one(weights, tmp_path):
    """The rule is the inode: the old file keeps its mapping, under the same path."""
    old = MappedFile.of(str(weights))
    assert old is not None
    with mapped(weights):
        newer = tmp_path / "newer.bpk"
        newer.write_bytes(os.urandom(SIZE))
        os.replace(newer, weights)
        new = MappedFile.of(str(weights))
        assert new is not None and new.path == old.path and new.inode != old.inode
        assert procfs.file_figures("self", new) == {}
        assert procfs.file_figures("self", old)["Rss"] == SIZE  # shown as "... (deleted)" now
        assert os.getpid() not in procfs.processes_mapping(str(weights))


def test_a_file_that_is_gone_maps_nowhere(tmp_path):
    assert MappedFile.of(str(tmp_path / "absent.bpk")) is None
    assert procfs.processes_mapping(str(tmp_path / "absent.bpk")) == []


def test_memory_figures_of_this_process_are_read_in_bytes():
    status, rollup = procfs.status_figures(), procfs.rollup_figures(os.getpid())
    assert status["VmData"] > 0 and status["RssAnon"] > 0 and "VmPTE" in status
    assert rollup["Rss"] >= rollup["Pss"] > 0 and "Private_Dirty" in rollup
    assert status["VmRSS"] % KiB == 0
    assert 0 < procfs.private_resident() < rollup["Rss"]


def test_a_process_that_is_gone_cannot_be_read():
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(OSError):
        procfs.rollup_figures(child.pid)


def test_a_running_child_is_listed_and_a_reaped_one_is_not():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in procfs.child_pids()
        # The walk of /proc, for a kernel that lists no children, finds the same.
        assert procfs._children_by_parent() == procfs.child_pids()
    finally:
        child.kill()
        child.wait()
    assert child.pid not in procfs.child_pids()
