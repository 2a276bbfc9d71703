"""The supervisor and the workers never load asyncio or ssl; with ``--http`` the supervisor
loads httptools and prometheus_client (whose exposition module imports ssl), never asyncio: its
front door runs on the supervisor's own loop (it imports ``workerpool.gateway`` only then).

Either would cost every process of the pool some MiB (asyncio imports ssl, which maps OpenSSL)
for nothing: neither speaks TLS or runs an event loop of asyncio's. Checked in a fresh
interpreter that imports every module those processes run.
"""

from __future__ import annotations

import json
import subprocess
import sys

from support.server import Server
from support.sockets import free_port

from workerpool.control import client as control

SERVER_SIDE = [
    "workerpool.pool.run",  # serve and workers: supervisor, router, control socket
    "workerpool.worker.child",  # a spawned worker or template
    "workerpool.worker.main",
    "workerpool.worker.template",
]
FORBIDDEN = ["asyncio", "ssl", "_ssl"]


def test_supervisor_and_workers_load_neither_asyncio_nor_ssl() -> None:
    probe = (f"import importlib, json, sys\n"
             f"for name in {SERVER_SIDE!r}: importlib.import_module(name)\n"
             f"print(json.dumps(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


# What a running supervisor needs only for --http, or for other models, or never.
NOT_WITHOUT_HTTP = ["httptools", "prometheus_client", "http", "ssl"]
NEVER = ["aiohttp", "asyncio", "uvloop"]
NOT_FOR_AN_MLP = ["onnxruntime", "onnx", "tokenizers", "safetensors", "torch"]


def supervisor_packages(server: Server) -> set[str]:
    """The top-level packages of the modules the running supervisor has imported, once it has
    answered a ``status`` (so what answering one loads counts too)."""
    server.status()
    modules = control.call(server.control, "modules")["modules"]
    return {name.partition(".")[0] for name in modules}


def test_a_running_supervisor_imports_only_what_it_serves_with(small_model) -> None:
    """Read from the running supervisor (the ``modules`` control command), so whatever it
    imports on the way to serving counts, not only what its modules import."""
    with Server(small_model, workers=1) as server:
        plain = supervisor_packages(server)
    with Server(small_model, "--http", f"127.0.0.1:{free_port()}", workers=1) as server:
        with_http = supervisor_packages(server)
    assert {"workerpool", "zmq", "numpy"} <= plain  # numpy: the template it forks shares it
    unneeded = set(NOT_WITHOUT_HTTP + NEVER + NOT_FOR_AN_MLP)
    assert plain.isdisjoint(unneeded), plain & unneeded
    assert {"httptools", "prometheus_client"} <= with_http  # the front door's, then only
    assert with_http.isdisjoint(NEVER + NOT_FOR_AN_MLP), with_http & set(NEVER + NOT_FOR_AN_MLP)


def test_the_command_imports_nothing_before_it_holds_ctrl_c_back() -> None:
    """``python -m workerpool`` and the ``workerpool`` script import the package, then
    ``workerpool.command``, whose first lines block SIGINT: a Ctrl-C raised in an import before
    them can be dropped (an import lock's weakref callback prints it and goes on), and the pool
    then starts and serves on. So the package imports nothing of its own, nor anything new."""
    probe = ("import sys\nbefore = set(sys.modules)\nimport workerpool\n"
             "print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['workerpool']"]
