"""The supervisor and the workers never load asyncio or ssl (the supervisor does for
``--http``, whose front door is asyncio's: it imports ``workerpool.gateway`` only then).

Either would cost every process of the pool some MiB (asyncio imports ssl, which maps OpenSSL)
for nothing: neither speaks TLS or runs an event loop of asyncio's. Checked in a fresh
interpreter that imports every module those processes run.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
