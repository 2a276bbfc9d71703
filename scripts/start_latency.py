#!/usr/bin/env python3
"""How soon does a worker added by SIGTTIN serve? ``--start fork`` against ``--start spawn``.

In the same run, on one generated mlp model, alternating ``workerpool serve --start fork``
(workers forked from a warm template process) and ``--start spawn`` (each worker a fresh
interpreter), each started with N workers. Each server is sent A SIGTTINs, one after another,
each once the worker the previous one added has answered, while one DEALER socket keeps
2 * (workers + 1) one-row requests in flight, so that a request is always queued for the new
worker. For each added worker:

- ready: from the supervisor's "SIGTTIN: adding a worker" log line to the router's "worker PID
  ... ready" line (both from the server's own log, so one clock; milliseconds, as logged);
- serves: from just before ``os.kill(SIGTTIN)`` to the first reply from a worker pid not seen
  before (this script's monotonic clock).

And per server run, startup: from launching ``workerpool serve`` to its ready line on stdout.

    python3 scripts/start_latency.py                    # 256 MiB mlp, 8 workers, 5 adds, 2 runs
    python3 scripts/start_latency.py --size 16MiB --workers 2 --adds 2 --repeat 1
    python3 scripts/start_latency.py --json start_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import numpy as np
import zmq
from benchlib.arguments import add_count, add_json, add_mlp_pool, parser_for
from benchlib.runs import load_average, print_load_averages, scratch_run, write_figures
from benchlib.zmq_load import REPLY_TIMEOUT

from workerpool import models
from workerpool.protocol import messages as protocol
from workerpool.testing import NotReady, ServerProcess, serve_args
from workerpool.units import format_size

STARTS = ("fork", "spawn")
STARTUP_TIMEOUT = 120.0  # seconds for a whole pool to print its ready line
ADD_TIMEOUT = 60.0  # seconds for an added worker to answer, or its ready line to be logged
SETTLE = 0.25  # seconds of load between one added worker answering and the next SIGTTIN

LOG_TIME = r"(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[(?P<pid>\d+)\] INFO "
TTIN_LINE = re.compile(LOG_TIME + r"workerpool\.supervisor[.\w]*: SIGTTIN: adding a worker")
READY_LINE = re.compile(LOG_TIME + r"workerpool\.router[.\w]*: worker (?P<worker>\d+) on \S+ ready ")


def log_time(text: str) -> float:
    """A log line's timestamp (logging's asctime: local time, milliseconds) in seconds."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class Log:
    """What the supervisor logged: when each SIGTTIN was handled, when each worker got ready."""

    ttins: list[float]
    ready: dict[int, float]  # worker pid: its first ready line

    @classmethod
    def read(cls, path: str, supervisor: int) -> Log:
        ttins: list[float] = []
        ready: dict[int, float] = {}
        with open(path, errors="replace") as f:
            for line in f:
                if (m := TTIN_LINE.match(line)) and int(m["pid"]) == supervisor:
                    ttins.append(log_time(m["time"]))
                elif (m := READY_LINE.match(line)) and int(m["pid"]) == supervisor:
                    ready.setdefault(int(m["worker"]), log_time(m["time"]))
        return cls(ttins, ready)


def logged_ready(path: str, supervisor: int, worker: int) -> bool:
    """Whether the supervisor has logged ``worker`` ready."""
    return worker in Log.read(path, supervisor).ready


class Driver:
    """One DEALER socket keeping ``in_flight`` one-row requests outstanding; notes the pids."""

    def __init__(self, endpoint: str, frames: list, in_flight: int) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.route, self.header, self.arrays = frames[1], json.loads(frames[2]), frames[3:]
        self.seen: set[int] = set()
        self.last_reply = time.monotonic()
        for _ in range(in_flight):
            self.send()

    def send(self) -> None:
        self.header["id"] += 1
        self.sock.send_multipart([b"", self.route, protocol.encode_header(self.header), *self.arrays])

    def saw_more_than(self, count: int) -> bool:
        return len(self.seen) > count

    def pump(self, timeout: float) -> list[tuple[float, int]]:
        """Take the replies that arrive within ``timeout`` s, sending one request for each;
        (arrival time, pid) of each reply from a pid not seen before."""
        new: list[tuple[float, int]] = []
        if self.sock.poll(int(timeout * 1000)):
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                now = time.monotonic()
                reply = json.loads(frames[1])
                if reply["status"] != "ok":
                    raise RuntimeError(f"workerpool answered {reply}")
                self.send()
                self.last_reply = now
                if reply["worker_pid"] not in self.seen:
                    self.seen.add(reply["worker_pid"])
                    new.append((now, reply["worker_pid"]))
        elif time.monotonic() - self.last_reply > REPLY_TIMEOUT:
            raise RuntimeError(f"no reply in {REPLY_TIMEOUT:g} s")
        return new

    def run_until(self, done: Callable[[], bool], timeout: float,
                  what: str) -> list[tuple[float, int]]:
        """Pump until ``done()`` is true; the new pids seen meanwhile."""
        deadline = time.monotonic() + timeout
        new: list[tuple[float, int]] = []
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout:g} s")
            new += self.pump(0.01)
        return new

    def pump_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.run_until(lambda: time.monotonic() >= end, seconds + REPLY_TIMEOUT, "pumping")

    def close(self) -> None:
        self.sock.close()
        self.context.term()


def run_server(model: str, start: str, workers: int, adds: int, row: np.ndarray,
               directory: str, index: int) -> dict[str, Any]:
    """One ``workerpool serve --start START`` run: its startup, then ``adds`` SIGTTINs."""
    args = serve_args(model, workers, "--start", start,
                      "--control", f"ipc://{directory}/c-{index}.sock", "--log-level", "info")
    log_path = os.path.join(directory, f"serve-{index}-{start}.log")
    server = ServerProcess(args, log_path=log_path, timeout=STARTUP_TIMEOUT)
    launched = time.monotonic()
    try:
        with server:
            startup = time.monotonic() - launched
            assert server.proc is not None
            supervisor = server.proc.pid
            driver = Driver(server.endpoint, protocol.encode_request(0, row), 2 * (workers + 1))
            try:
                driver.run_until(lambda: len(driver.seen) >= workers, ADD_TIMEOUT,
                                 f"all {workers} workers answering")
                initial = set(driver.seen)
                added: list[dict[str, Any]] = []
                for i in range(adds):
                    driver.pump_for(SETTLE)
                    known = len(driver.seen)
                    sent = time.monotonic()
                    os.kill(supervisor, signal.SIGTTIN)
                    new = driver.run_until(partial(driver.saw_more_than, known),
                                           ADD_TIMEOUT, f"SIGTTIN {i + 1} answered")
                    if len(new) != 1:
                        raise RuntimeError(f"SIGTTIN {i + 1}: more than one new pid {new}")
                    at, pid = new[0]
                    driver.run_until(partial(logged_ready, log_path, supervisor, pid),
                                     ADD_TIMEOUT, f"worker {pid}'s ready line")
                    added.append({"pid": pid, "serves_ms": (at - sent) * 1e3})
            finally:
                driver.close()
    except NotReady as exc:
        raise RuntimeError(str(exc)) from None
    log = Log.read(log_path, supervisor)
    if len(log.ttins) != adds:
        raise RuntimeError(f"{len(log.ttins)} SIGTTIN lines in {log_path}, not {adds}")
    for add, ttin in zip(added, log.ttins, strict=True):
        add["ready_ms"] = (log.ready[add["pid"]] - ttin) * 1e3
    return {"start": start, "startup_s": startup, "initial_workers": sorted(initial),
            "added": added}


def run_alternating(model: str, workers: int, adds: int, repeat: int, row: np.ndarray,
                    directory: str) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {start: [] for start in STARTS}
    index = 0
    for round_number in range(1, repeat + 1):
        for start in STARTS:
            index += 1
            runs[start].append(run_server(model, start, workers, adds, row, directory, index))
            print(f"  run {round_number}/{repeat}: {start} done", file=sys.stderr, flush=True)
    return runs


def figures(runs: list[dict[str, Any]]) -> dict[str, float]:
    ready = [a["ready_ms"] for r in runs for a in r["added"]]
    serves = [a["serves_ms"] for r in runs for a in r["added"]]
    startup = [r["startup_s"] for r in runs]
    return {"ready_median_ms": statistics.median(ready), "ready_max_ms": max(ready),
            "serves_median_ms": statistics.median(serves), "serves_max_ms": max(serves),
            "startup_median_s": statistics.median(startup), "startup_max_s": max(startup),
            "adds": len(ready)}


def print_table(generated: models.GeneratedMlp, args: argparse.Namespace,
                result: dict[str, dict[str, float]], loads: tuple[str, str]) -> None:
    cpus = len(os.sched_getaffinity(0))
    dims = "x".join(str(d) for d in generated.dims)
    print(f"{format_size(generated.size_bytes)} mlp ({dims}), {args.workers} initial workers on "
          f"{cpus} CPUs, {args.adds} SIGTTINs per run, {2 * (args.workers + 1)} one-row requests "
          f"in flight; {args.repeat} alternating runs of each")
    print("ready: supervisor log, SIGTTIN handled -> router logs the worker ready (1 ms "
          "resolution); serves: client, os.kill -> first reply from the new pid; startup: "
          "launch -> ready line on stdout")
    print()
    print("| figure | fork | spawn | spawn / fork |")
    print("| --- | ---: | ---: | ---: |")
    n = result["fork"]["adds"]
    for label, key, unit, scale in (
            (f"ready, median of {n}", "ready_median_ms", "ms", 1), ("ready, max", "ready_max_ms", "ms", 1),
            (f"serves, median of {n}", "serves_median_ms", "ms", 1),
            ("serves, max", "serves_max_ms", "ms", 1),
            (f"startup ({args.workers} workers), median of {args.repeat}", "startup_median_s",
             "ms", 1e3),
            ("startup, max", "startup_max_s", "ms", 1e3)):
        fork, spawn = result["fork"][key] * scale, result["spawn"][key] * scale
        ratio = f"{spawn / fork:.1f}x" if fork else "—"
        print(f"| {label} | {fork:.1f} {unit} | {spawn:.1f} {unit} | {ratio} |")
    print()
    print_load_averages(loads)


def build_parser() -> argparse.ArgumentParser:
    parser = parser_for(__doc__)
    add_mlp_pool(parser, "256MiB", 8, "workers each server starts with")
    add_count(parser, "--adds", 5, "SIGTTINs per server run, one after another")
    add_count(parser, "--repeat", 2, "runs of each start method, alternating")
    add_json(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with scratch_run("start_latency", args.size) as run:
        runs = run_alternating(run.model, args.workers, args.adds, args.repeat, run.row, run.directory)
    generated = run.generated
    result = {start: figures(runs[start]) for start in STARTS}
    loads = (run.start_load, load_average())
    print_table(generated, args, result, loads)
    if args.json:
        write_figures(args.json, "start_latency.py", {
            "workers": args.workers, "adds": args.adds, "repeat": args.repeat,
            "model_size": generated.size_bytes, "dims": generated.dims,
            "cpus": len(os.sched_getaffinity(0)), "load_average": loads,
            "figures": result, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
