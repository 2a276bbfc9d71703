"""How many CPUs a process may use: the cgroup quota read from real files laid out as each
cgroup version lays them out, and the affinity a real child process is given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workerpool.linux.cpus import cpu_quota, usable_cpus


def cgroups(tmp_path: Path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup hierarchy under ``tmp_path`` holding ``files``, and a /proc/self/cgroup saying ``own``."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    (tmp_path / "own").write_text(own)
    return root, tmp_path / "own"


@pytest.mark.parametrize("own, files, quota", [
    ("0::/\n", {"cpu.max": "max 100000"}, None),  # v2, no limit
    ("0::/\n", {"cpu.max": "150000 100000"}, 1.5),  # v2 in a container's namespace: its root
    ("0::/kubepods/pod1\n", {"kubepods/pod1/cpu.max": "200000 100000", "cpu.max": "max 100000"}, 2.0),
    ("1:cpu,cpuacct:/\n0::/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
     None),  # v1, no limit
    ("1:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/cpu.cfs_quota_us": "50000",
                                     "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0.5),  # its own, at the root
    ("0::/\n", {}, None),  # no controller files at all
    ("0::/\n", {"cpu.max": "garbage 0"}, None),
])
def test_the_quota_is_read_from_either_cgroup_version(tmp_path, own, files, quota):
    root, own_file = cgroups(tmp_path, own, files)
    assert cpu_quota(root, own_file) == quota


def test_the_usable_cpus_are_the_affinitys_capped_by_the_quota_rounded_up(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    assert usable_cpus(*cgroups(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000"})) == cpus
    assert usable_cpus(*cgroups(tmp_path / "half", "0::/\n", {"cpu.max": "50000 100000"})) == 1
    assert usable_cpus(*cgroups(tmp_path / "many", "0::/\n", {"cpu.max": "6400000 100000"})) == cpus
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                             "from workerpool.linux.cpus import usable_cpus; print(usable_cpus())"],
                            capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"  # what os.cpu_count() would not say
