"""Memory behaviour, measured in fresh subprocesses so the numbers are not polluted by pytest.

* Reading a 128 MiB model with mmap and touching every weight must not add anonymous memory
  (the pages are file-backed and shared), while ``mmap=False`` must add about the model size.
* The same holds for the Burn-written fixture (about 1 MiB).
* Writing 8 Deferred tensors of 16 MiB must peak near one tensor, not near the whole model.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from support.commands import python

pytestmark = pytest.mark.xdist_group("timing")  # measures time or memory: in turn with the others

MiB = 1024 * 1024

_STATUS = textwrap.dedent(
    """
    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise SystemExit(f"no {field} in /proc/self/status")
    """
)

_READ = _STATUS + textwrap.dedent(
    """
    import gc, json, os, sys
    import numpy as np
    from workerpool import burnpack

    path = sys.argv[1]
    count, shape = 16, (2048, 1024)  # 16 x 8 MiB of float32

    def loader(i):
        return lambda: np.random.default_rng(i).standard_normal(shape, dtype=np.float32)

    burnpack.write(path, [(f"layer.{i}.weight", burnpack.Deferred(np.float32, shape, loader(i)))
                          for i in range(count)])
    gc.collect()
    size = os.path.getsize(path)
    burnpack.read(path)  # warm up the code path

    def touch(pack):
        return sum(float(a.sum(dtype=np.float64)) for a in pack.tensors.values())

    before = status("RssAnon")
    pack = burnpack.read(path)
    mapped_total = touch(pack)
    mapped_growth = status("RssAnon") - before
    first_ok = bool(np.array_equal(pack.tensors["layer.3.weight"], loader(3)()))
    del pack
    gc.collect()

    before = status("RssAnon")
    pack = burnpack.read(path, mmap=False)
    copied_total = touch(pack)
    copied_growth = status("RssAnon") - before
    print(json.dumps(dict(size=size, mapped_growth=mapped_growth, copied_growth=copied_growth,
                          same=mapped_total == copied_total, first_ok=first_ok,
                          copied_mapped=pack.mapped)))
    """
)

_WRITE = _STATUS + textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from workerpool import burnpack

    path = sys.argv[1]
    count, elements = 8, 4 * 1024 * 1024  # 8 x 16 MiB of float32
    burnpack.write(path + ".warm", {"w": np.ones(1024, dtype=np.float32)})  # warm up
    try:  # reset the high-water mark to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        baseline = status("VmRSS")
    except OSError:
        baseline = status("VmHWM")
    tensors = [(f"t{i}", burnpack.Deferred(np.float32, (elements,),
                                           lambda i=i: np.full(elements, i, dtype=np.float32)))
               for i in range(count)]
    burnpack.write(path, tensors)
    print(json.dumps(dict(peak_growth=status("VmHWM") - baseline, size=os.path.getsize(path))))
    """
)


_FIXTURE = _STATUS + textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from workerpool import burnpack

    path = sys.argv[1]
    burnpack.read(path)  # warm up the code path
    before = status("RssAnon")
    pack = burnpack.read(path)
    total = sum(float(a.sum(dtype=np.float64)) for a in pack.tensors.values())
    mapped_growth = status("RssAnon") - before
    copy = burnpack.read(path, mmap=False)
    copied_growth = status("RssAnon") - before
    print(json.dumps(dict(size=os.path.getsize(path), mapped_growth=mapped_growth,
                          copied_growth=copied_growth, finite=bool(np.isfinite(total)))))
    """
)


def run(script: str, path) -> dict:
    result = python("-c", script, path, timeout=100)
    if result.returncode != 0 and "no RssAnon" in result.stdout + result.stderr:
        pytest.skip("/proc/self/status has no RssAnon")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_mmap_read_of_128MiB_model_adds_no_anonymous_memory(tmp_path):
    """Touching every weight of a mapped 128 MiB model leaves RssAnon flat; a copy adds ~128 MiB."""
    stats = run(_READ, tmp_path / "big.bpk")
    size = stats["size"]
    assert size >= 128 * MiB
    assert stats["same"] and stats["first_ok"]
    assert stats["copied_mapped"] is False
    assert stats["mapped_growth"] < 8 * MiB, stats
    assert stats["copied_growth"] > 0.9 * size, stats


def test_fixture_read_adds_no_anonymous_memory(burn_mnist_path):
    """Reading and summing every MNIST weight adds no anonymous memory; a copy adds ~1 MiB."""
    stats = run(_FIXTURE, burn_mnist_path)
    assert stats["finite"]
    assert stats["mapped_growth"] < stats["size"] // 4, stats
    assert stats["copied_growth"] > 0.9 * stats["size"], stats


def test_write_peak_memory_is_about_one_tensor(tmp_path):
    """Writing 8 Deferred 16 MiB tensors peaks near one tensor, far below the 128 MiB model."""
    stats = run(_WRITE, tmp_path / "out.bpk")
    tensor = 16 * MiB
    assert stats["size"] >= 8 * tensor
    assert stats["peak_growth"] < 3 * tensor, stats
    assert stats["peak_growth"] > tensor // 2, stats  # the measurement does see a tensor
