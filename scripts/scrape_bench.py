#!/usr/bin/env python3
"""Does a Prometheus scrape slow routing? The same server, with and without /metrics scraped
every second, alternating, in the same run.

One ``workerpool serve --http`` on a 1 MiB mlp; each round drives K one-row requests in flight
(``benchlib.zmq_load.drive``) once with nobody scraping and once with a thread fetching ``/metrics``
every ``--interval`` seconds (which makes the loop build a snapshot and the endpoint's thread
read every worker's memory).

    python3 scripts/scrape_bench.py                 # 2 workers, K = 1 and 16, 5 s, 3 rounds
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import urllib.request
from typing import Any

from benchlib.arguments import load_arguments
from benchlib.runs import demo_model, load_average, print_load_averages
from benchlib.servers import free_port
from benchlib.zmq_load import drive

from workerpool.protocol import messages as protocol
from workerpool.testing import ServerProcess, serve_args
from workerpool.units import MiB


def scraping(url: str, interval: float, stop: threading.Event, scrapes: list[float]) -> None:
    while not stop.wait(interval):
        with urllib.request.urlopen(url, timeout=10) as reply:
            reply.read()
        scrapes.append(1.0)


def main() -> int:
    args = load_arguments(__doc__, workers=2, in_flight="1,16", seconds=5.0, repeat=3,
                          interval=(float, 1.0, "seconds between scrapes (default: 1)"))
    port = free_port()
    runs: dict[str, list[dict[int, dict[str, Any]]]] = {"quiet": [], "scraped": []}
    scrapes: list[float] = []
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix="wp-scrape-") as directory:
        model, _, row = demo_model(directory, MiB)
        frames = protocol.encode_request(0, row)
        serve = serve_args(model, args.workers, "--http", f"127.0.0.1:{port}", "--control",
                           f"ipc://{directory}/control", "--log-level", "warning")
        with ServerProcess(serve, log_path=os.path.join(directory, "serve.log")) as server:
            drive(server.endpoint, frames, 4, 1.0)  # warm up
            for _ in range(args.repeat):
                for mode in ("quiet", "scraped"):
                    stop = threading.Event()
                    scraper = threading.Thread(target=scraping, args=(
                        f"http://127.0.0.1:{port}/metrics", args.interval, stop, scrapes))
                    if mode == "scraped":
                        scraper.start()
                    runs[mode].append({k: drive(server.endpoint, frames, k, args.seconds) for k in args.in_flight})
                    stop.set()
                    if mode == "scraped":
                        scraper.join()
    print(f"{args.workers} workers, 1 MiB mlp, one-row requests; medians of {args.repeat} alternating "
          f"runs of {args.seconds:g} s; {len(scrapes)} scrapes of /metrics every {args.interval:g} s "
          f"in the scraped runs")
    for k in args.in_flight:
        quiet = [r[k] for r in runs["quiet"]]
        scraped = [r[k] for r in runs["scraped"]]
        rate = (statistics.median(r["rps"] for r in quiet), statistics.median(r["rps"] for r in scraped))
        p50 = (statistics.median(r["p50_us"] for r in quiet), statistics.median(r["p50_us"] for r in scraped))
        print(f"{k} in flight: {rate[0]:.0f} req/s quiet, {rate[1]:.0f} scraped ({rate[1] / rate[0]:.2f}x); "
              f"p50 {p50[0]:.0f} µs quiet, {p50[1]:.0f} µs scraped ({p50[1] / p50[0]:.2f}x)")
    print_load_averages((start_load, load_average()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
