#!/usr/bin/env python3
"""Far more workers than CPUs: how long ``workerpool serve`` takes to start and to stop, the
CPU its supervisor spends, and what its log says while stopping.

For each worker count, one server on a 1 MiB mlp: start is from launch to the ready line; stop
is from SIGTERM to exit. CPU is the supervisor's own (utime + stime from /proc) during the stop
and over the whole run. The last two columns count what a stop should not need: workers killed
after the leave timeout, and log lines calling a worker lost or killing one for the router.

    python3 scripts/checks/crowded_pool.py [--workers 100 500 1000]
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

from workerpool.testing import ServerProcess
from workerpool.units import MiB

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/, for benchlib
from benchlib.arguments import parser_for
from benchlib.cpu import process_cpu
from benchlib.runs import load_average, scratch_run
from benchlib.servers import free_port


def measure(model: str, workers: int, directory: str) -> dict[str, float | int]:
    control = os.path.join(directory, f"control-{workers}")
    os.mkdir(control, 0o700)
    log_path = os.path.join(directory, f"serve-{workers}.log")
    server = ServerProcess(["serve", model, "--workers", str(workers), "--bind", f"tcp://127.0.0.1:{free_port()}",
                            "--control", f"ipc://{control}/control.sock"], log_path=log_path, timeout=600)
    launched = time.monotonic()
    with server:  # starts it, waiting for the ready line
        started = time.monotonic() - launched
        proc = server.proc
        assert proc is not None
        before = process_cpu(proc.pid)
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        total_cpu = before
        while proc.poll() is None:
            try:
                total_cpu = process_cpu(proc.pid)
            except OSError:  # reaped between the poll and the read
                break
            time.sleep(0.01)
        stopped = time.monotonic() - stopping
    with open(log_path) as log:
        text = log.read()
    killed = sum(int(count or 1) for count in re.findall(r"(?:(\d+) workers|worker \d+) did not stop in", text))
    return {"start_s": started, "stop_s": stopped, "stop_cpu_s": total_cpu - before, "run_cpu_s": total_cpu,
            "killed": killed, "lost": text.count(" lost (") + text.count("killing worker")}


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[100, 500, 1000])
    args = parser.parse_args()
    print(f"CPUs: {len(os.sched_getaffinity(0))}; load average at start: {load_average()}")
    print(f"{'workers':>8} {'start s':>8} {'stop s':>7} {'stop CPU s':>10} {'run CPU s':>9} {'killed':>6} {'lost':>5}")
    with scratch_run("crowded_pool.py", MiB) as scratch:
        for workers in args.workers:
            row = measure(scratch.model, workers, scratch.directory)
            print(f"{workers:>8} {row['start_s']:>8.1f} {row['stop_s']:>7.2f} {row['stop_cpu_s']:>10.2f} "
                  f"{row['run_cpu_s']:>9.2f} {row['killed']:>6} {row['lost']:>5}", flush=True)


if __name__ == "__main__":
    main()
