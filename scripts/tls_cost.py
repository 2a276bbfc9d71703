"""What TLS in the supervisor costs: one pool over HTTPS (``--http-cert``/``--http-key``, the
standard library's ``ssl`` on the supervisor's loop) against the same pool over plain HTTP.

Same model and load as ``http_bench.py`` (a 4 MiB ``mlp``, 2 workers, one-row binary KServe v2
bodies, wrk over keep-alive connections, so the handshake is paid once per connection); the
two alternate round by round. The table gives medians of req/s, p50 and the supervisor's CPU
per request (from /proc), and their ratios. A self-signed P-256 certificate is made with
``openssl``.

    python3 scripts/tls_cost.py [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import os
import statistics
import subprocess
from functools import partial
from typing import Any

from benchlib.arguments import rounds_arguments
from benchlib.cpu import with_supervisor_cpu
from benchlib.http_load import kserve_body
from benchlib.pools import http_pool
from benchlib.runs import Load, load_average, require_commands, scratch_run
from benchlib.servers import free_port
from benchlib.wrk import run_wrk, wrk_post_script

LEVELS = (1, 16, 64)


def self_signed(directory: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def run(load: Load, script: str, seconds: float, tls: tuple[str, str] | None) -> list[dict[str, Any]]:
    """One pool over HTTP, or HTTPS with ``tls`` (certificate, key), driven by wrk at each level."""
    port = free_port()
    extra = ("--http-cert", tls[0], "--http-key", tls[1]) if tls else ()
    with http_pool(load, port, *extra) as pool:
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/v2/models/mlp/infer"
        run_wrk(url, script, 16, 1)  # warm the gateway and its connections
        return [with_supervisor_cpu(pool.pid, partial(run_wrk, url, script, k, seconds), seconds) for k in LEVELS]


def main() -> int:
    args = rounds_arguments(__doc__, rounds=3, seconds=5.0)
    require_commands("tls_cost", "wrk", "openssl")
    with scratch_run("tls_cost", 4 * 1024 * 1024) as scratch:
        load = Load.of(scratch, 2, list(LEVELS), args.seconds, blas_threads=1, gthreads=4)
        body, headers = kserve_body(scratch.row)
        script = wrk_post_script(os.path.join(scratch.directory, "kserve.lua"), body, headers)
        tls = self_signed(scratch.directory)
        runs: dict[str, list[list[dict[str, Any]]]] = {"http": [], "https": []}
        for round_number in range(args.rounds):
            order = ["http", "https"] if round_number % 2 == 0 else ["https", "http"]
            for name in order:
                runs[name].append(run(load, script, args.seconds, tls if name == "https" else None))
        before, after = scratch.start_load, load_average()
    print(f"4 MiB mlp, 2 workers, one-row binary KServe v2 bodies, keep-alive; {args.rounds} rounds of "
          f"{args.seconds:g} s per level, medians; load average {before} before, {after} after\n")
    print("| connections | HTTP: req/s, p50, supervisor µs/request | HTTPS | HTTPS ÷ HTTP: req/s, p50, "
          "supervisor CPU |")
    print("| ---: | ---: | ---: | ---: |")
    for index, k in enumerate(LEVELS):
        cells = {name: tuple(statistics.median(r[index][key] for r in runs[name])
                             for key in ("rps", "p50_us", "supervisor_us")) for name in runs}
        text = {name: f"{rps:.0f}, {p50 / 1e3:.2f} ms, {cpu:.0f}" for name, (rps, p50, cpu) in cells.items()}
        ratios = ", ".join(f"{cells['https'][i] / cells['http'][i]:.2f}x" for i in range(3))
        print(f"| {k} | {text['http']} | {text['https']} | {ratios} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
