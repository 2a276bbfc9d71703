"""The scripts still run: every entry point in ``scripts/`` and ``scripts/checks/`` answers
``--help``, and ``bench.py --quick`` and ``scale_out_bench.py --quick`` measure their figures.

Nothing else runs them in CI; a script that imports something renamed or gone would otherwise
be found only by the next person who needs its figures.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import ROOT

pytestmark = pytest.mark.process

SCRIPTS = ROOT / "scripts"
ENTRY_POINTS = sorted([*SCRIPTS.glob("*.py"), *(SCRIPTS / "checks").glob("*.py")])
QUICK_BENCH_SECONDS = 30.0
SCALE_OUT_COMMANDS = ("wrk", "nginx", "haproxy")


def run(script: Path, *args: str) -> subprocess.Popen[str]:
    """``python scripts/X.py ARGS`` from the checkout, as the docs say to run it."""
    return subprocess.Popen([sys.executable, str(script.relative_to(ROOT)), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_there_are_entry_points_in_both_folders():
    names = {path.relative_to(SCRIPTS).as_posix() for path in ENTRY_POINTS}
    assert {"bench.py", "measure_rss.py", "checks/reliability_check.py"} <= names


def test_every_entry_point_answers_help():
    """All at once, then each waited for: a few seconds in all."""
    started = {script: run(script, "--help") for script in ENTRY_POINTS}
    failed = []
    for script, proc in started.items():
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0 or not out.startswith("usage: "):
            failed.append(f"{script.relative_to(ROOT)}: exit {proc.returncode}\n{out}{err}")
    assert failed == []


def test_bench_quick_measures_requests_per_second_in_seconds():
    began = time.monotonic()
    proc = run(SCRIPTS / "bench.py", "--quick")
    out, err = proc.communicate(timeout=2 * QUICK_BENCH_SECONDS)
    took = time.monotonic() - began
    assert proc.returncode == 0, err
    rows = [line for line in out.splitlines() if re.match(r"\s*\d+ \|", line)]
    assert len(rows) == 1, out  # one level
    cells = rows[0].split("|")
    pool_rps = float(cells[3].split()[0])  # in flight | bare | bare+model | pool req/s p50 p99 | ratios
    assert pool_rps > 0, out
    assert took < QUICK_BENCH_SECONDS, f"bench.py --quick took {took:.1f} s"


@pytest.mark.xdist_group("timing")  # seconds of wrk at full load: in turn with the timing tests
@pytest.mark.skipif(not all(shutil.which(command) for command in SCALE_OUT_COMMANDS),
                    reason="needs wrk, nginx and haproxy")
def test_scale_out_bench_quick_drives_every_layout():
    """Four layouts at two levels each (some 16 s), every answer a 2xx: the shipped balancer
    configurations, rendered, proxy to the pools."""
    proc = run(SCRIPTS / "scale_out_bench.py", "--quick")
    out, err = proc.communicate(timeout=4 * QUICK_BENCH_SECONDS)
    assert proc.returncode == 0, err
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| [a-z+]+ \| \d+ \|", line)]
    assert [(cells[0].strip(), int(cells[1])) for cells in rows] == [
        (layout, k) for layout in ("pool", "nginx", "haproxy", "router+hosts") for k in (16, 64)], out
    assert all(float(cells[2]) > 0 and cells[5].split("/")[0].strip() == "0" for cells in rows), out
    assert "router (router+hosts):" in out and "supervisor (pool):" in out, out
