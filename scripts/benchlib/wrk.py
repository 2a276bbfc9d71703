"""wrk, the HTTP load generator the HTTP benchmarks drive servers with: its Lua scripts, its
command line, and the figures it prints."""

from __future__ import annotations

import re
import subprocess
from typing import Any

UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}  # as wrk prints a latency


def wrk_post_script(path: str, body: bytes, headers: dict[str, str]) -> str:
    """A wrk Lua script that POSTs ``body`` (kept in a file beside it) with ``headers``."""
    with open(path + ".body", "wb") as file:
        file.write(body)
    lines = [f'local f = io.open("{path}.body", "rb"); wrk.body = f:read("*all"); f:close()',
             'wrk.method = "POST"']
    lines += [f'wrk.headers["{name}"] = "{value}"' for name, value in headers.items()]
    with open(path, "w") as file:
        file.write("\n".join(lines) + "\n")
    return path


def wrk_bodies_script(path: str, lines: list[str]) -> str:
    """A wrk Lua script whose ``request()`` POSTs JSON bodies in turn (kept one a line beside it)."""
    with open(path + ".bodies", "w") as file:
        file.write("\n".join(lines) + "\n")
    with open(path, "w") as file:
        file.write(f"""local requests, turn = {{}}, 0
function init(args)
  for line in io.lines("{path}.bodies") do
    requests[#requests + 1] = wrk.format("POST", nil, {{["Content-Type"] = "application/json"}}, line)
  end
end
function request()
  turn = turn % #requests + 1
  return requests[turn]
end
""")
    return path


def wrk_command(url: str, script: str, connections: int, seconds: float,
                timeout: float | None = None) -> list[str]:
    """wrk on one thread with ``--latency``; ``timeout``: its per-request timeout (default 2 s)."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", script, "--latency", url]
    return command if timeout is None else [*command, "--timeout", f"{timeout:g}s"]


def run_wrk(url: str, script: str, connections: int, seconds: float) -> dict[str, Any]:
    done = subprocess.run(wrk_command(url, script, connections, seconds), capture_output=True, text=True,
                          check=True)
    return wrk_figures(done.stdout)


def wrk_figures(out: str) -> dict[str, Any]:
    """What wrk printed: requests/s and their count, p50 and p99 latency (microseconds), the
    answers that were not 2xx or 3xx, and the socket errors (timeouts among them); latencies
    are 0 when no request completed."""

    def found(pattern: str) -> re.Match[str]:
        match = re.search(pattern, out, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no {pattern!r} in wrk's output:\n{out}")
        return match

    def latency(percent: str) -> float:
        value, unit = found(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s|m|h)\s*$").groups()
        return float(value) * UNITS[unit]

    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(found(r"Requests/sec:\s+([\d.]+)").group(1)),
            "requests": int(found(r"(\d+) requests in").group(1)),
            "p50_us": latency("50"), "p99_us": latency("99"),
            "failed": int(failed.group(1)) if failed else 0, "socket_errors": errors.group(1) if errors else ""}


def socket_error_count(text: str) -> int:
    """The sum of wrk's ``Socket errors: connect 0, read 0, write 0, timeout 0``."""
    return sum(int(part.split()[-1]) for part in text.split(",") if part.strip())
