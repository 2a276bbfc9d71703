#!/usr/bin/env python3
"""Hot-reload latency: from the rename of new weights to every worker serving them.

Two ways to notice the new file: the server's own watcher (polling every --watch-interval)
and `workerpool reload` right after the rename (the server started with --no-watch).

    python scripts/reload_latency.py                       # 256 MiB mlp, 8 workers, 5 reloads each
    python scripts/reload_latency.py --size 1GiB --workers 4 --repeat 3
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from benchlib.arguments import add_count, add_mlp_pool, parser_for

from workerpool import models
from workerpool.control import client as control
from workerpool.testing import NotReady, ServerProcess, serve_args


def all_on(control_endpoint: str, generation: int, workers: int) -> bool:
    status = control.call(control_endpoint, "status", memory=False)
    return len(status["workers"]) == workers and all(
        w["generation"] == generation and w["state"] in ("ready", "busy") for w in status["workers"]
    )


def measure(versions: list[str], served: str, workers: int, tmp: str, watch: bool) -> list[float]:
    """Seconds from each rename to the whole pool on the new generation."""
    shutil.copyfile(versions[0], served)
    endpoint = f"ipc://{tmp}/control-{'watch' if watch else 'reload'}"
    args = serve_args(served, workers, "--control", endpoint, "--log-level", "warning",
                      *([] if watch else ["--no-watch"]))
    latencies = []
    with ServerProcess(args):
        for generation, version in enumerate(versions[1:], start=2):
            incoming = os.path.join(tmp, "incoming.bpk")
            shutil.copyfile(version, incoming)
            start = time.perf_counter()
            os.rename(incoming, served)
            if watch:
                while not all_on(endpoint, generation, workers):
                    time.sleep(0.002)
            else:
                answer = control.call(endpoint, "reload", timeout=120)
                assert answer["generation"] == generation, answer
            latencies.append(time.perf_counter() - start)
    return latencies


def main() -> None:
    parser = parser_for(__doc__)
    add_mlp_pool(parser, "256MiB", 8, "workers")
    add_count(parser, "--repeat", 5, "reloads per way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wp-reload-") as tmp:
        versions = []
        for seed in range(args.repeat + 1):
            path = os.path.join(tmp, f"v{seed}.bpk")
            models.generate_mlp(path, args.size, seed=seed)
            versions.append(path)
        served = os.path.join(tmp, "served.bpk")
        try:
            results = {
                "watching": measure(versions, served, args.workers, tmp, watch=True),
                "workerpool reload": measure(versions, served, args.workers, tmp, watch=False),
            }
        except NotReady as exc:
            raise SystemExit(str(exc)) from None
    print(f"{args.workers} workers, {args.size / 2**20:.0f} MiB mlp, {args.repeat} reloads each: "
          "rename -> every worker on the new generation")
    print(f"{'noticed by':<18} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    for way, values in results.items():
        ms = [v * 1000 for v in values]
        print(f"{way:<18} {statistics.median(ms):>10.0f} {min(ms):>8.0f} {max(ms):>8.0f}")


if __name__ == "__main__":
    main()
