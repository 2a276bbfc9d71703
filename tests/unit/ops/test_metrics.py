"""``pool_memory`` against this process (as a worker mapping the weights) and a real child (as
a helper that maps nothing)."""

from __future__ import annotations

import mmap
import os
import subprocess

from workerpool.ops.metrics import MEMORY_FIELDS, pool_memory
from workerpool.units import KiB


def test_the_figures_of_a_process_mapping_the_weights_and_of_one_gone(tmp_path):
    weights = tmp_path / "weights.bpk"
    weights.write_bytes(os.urandom(128 * KiB))
    gone = subprocess.Popen(["true"])
    gone.wait()
    helper = subprocess.Popen(["sleep", "30"])
    try:
        with open(weights, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as view:
            view[:].count(b"\0")  # every page read: resident
            memory = pool_memory([os.getpid(), gone.pid], str(weights), helpers=[helper.pid])
    finally:
        helper.kill()
        helper.wait()
    mine, other = memory.workers[os.getpid()], memory.helpers[helper.pid]
    assert mine is not None and other is not None and memory.workers[gone.pid] is None
    assert set(mine) == set(MEMORY_FIELDS)
    assert mine["weights_resident"] == 128 * KiB and other["weights_resident"] == 0
    assert mine["rss"] >= mine["pss"] > 0 and mine["anon"] > 0 and mine["shared"] > 0
    assert mine["uss"] <= mine["rss"]
    assert memory.totals == {"pss": mine["pss"] + other["pss"], "workers_pss": mine["pss"],
                             "model_size": 128 * KiB, "workers": 1}
