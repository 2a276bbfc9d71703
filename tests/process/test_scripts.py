"""The scripts still run: every entry point in ``scripts/`` and ``scripts/checks/`` answers
``--help``, ``bench.py --quick`` and ``scale_out_bench.py --quick`` measure their figures, and
``measure_rss.py`` measures a model it is given (Burn's MNIST, a tiny ONNX text encoder).

Nothing else runs them in CI; a script that imports something renamed or gone would otherwise
be found only by the next person who needs its figures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import onnx_texts
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


def measure_rss(tmp_path: Path, model: str) -> tuple[dict, str]:
    """``measure_rss.py --model MODEL`` at N = 1 and 2, forked and copied: its JSON figures and
    its printout."""
    figures = tmp_path / "memory.json"
    proc = run(SCRIPTS / "measure_rss.py", "--model", model, "--workers", "1,2", "--start", "fork",
               "--answered", "2", "--json", str(figures))
    out, err = proc.communicate(timeout=4 * QUICK_BENCH_SECONDS)
    assert proc.returncode == 0, err
    assert "total PSS" in out and "per added worker" in out, out
    return json.loads(figures.read_text()), out


def check_memory(figures: dict, model: str) -> None:
    """Every run read what its pool holds: each worker answered, the pool's PSS adds up, the
    shares of a file resident are fractions."""
    assert figures["model"] == model and figures["model_size"] == os.path.getsize(model)
    assert [(r["pool"], r["workers"]) for r in figures["runs"]] == [
        ("fork", 1), ("fork", 2), ("copy", 1), ("copy", 2)]
    for pool in figures["runs"]:
        tree = pool["processes"]
        assert tree["workers"] == len(pool["loaded"]) == pool["workers"]
        assert pool["requests"] >= 2 * pool["workers"]
        assert 0 < tree["workers_pss"] < tree["pss"] < 2**30
        assert tree["pss"] == tree["root_pss"] + tree["others_pss"] + tree["workers_pss"]
        resident = pool["resident"]
        assert all(0 <= share <= 1 for share in resident["file"] + resident["prepacked"])


def test_measure_rss_reads_burn_mnist_once_every_worker_touched_its_weights(burn_mnist_path, tmp_path):
    figures, out = measure_rss(tmp_path, str(burn_mnist_path))
    check_memory(figures, str(burn_mnist_path))
    assert "model burn-mnist" in out and "touched all its weights" in out, out
    mapped = [pool for pool in figures["runs"] if pool["mode"] == "mmap"]
    assert all(min(pool["resident"]["file"]) >= 0.95 for pool in mapped)


def test_measure_rss_sends_texts_to_a_text_model_and_says_what_it_holds(tmp_path, cache_dir):
    """A model that takes texts gets sentences; it need not read every weight, so the memory is
    read once each worker has answered, and the prepacked copy found is the pool's own."""
    model = onnx_texts.converted(tmp_path / "st", onnx_texts.encoder())
    figures, out = measure_rss(tmp_path, model)
    check_memory(figures, model)
    assert "model onnx" in out and "answered 2 requests or more" in out, out
    assert "touched all its weights" not in out, out
    for pool in figures["runs"]:
        files = pool["resident"]["prepacked_files"]
        assert all(Path(path).is_relative_to(cache_dir) for path in files)
        assert (files != []) == (pool["mode"] == "mmap"), files  # --load copy: views of the copy


def test_measure_rss_refuses_a_model_that_is_not_there(tmp_path):
    proc = run(SCRIPTS / "measure_rss.py", "--model", str(tmp_path / "absent.bpk"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "absent.bpk: no such file" in err and "Traceback" not in err, err
