"""nginx and HAProxy in front of pools, run from the configurations deploy/ ships, and a load
of KServe requests through them whose every answer is checked."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from support.paths import ROOT

NGINX_FILE = ROOT / "deploy" / "nginx" / "workerpool.conf"
HAPROXY_FILE = ROOT / "deploy" / "haproxy" / "workerpool.cfg"
STARTUP = 10.0  # seconds a balancer may take to listen


def _servers(text: str, pattern: str, lines: Sequence[str]) -> str:
    """``text`` with its example server lines (those matching ``pattern``) replaced by ``lines``."""
    examples = list(re.finditer(pattern, text, re.MULTILINE))
    assert examples, f"no server line matches {pattern!r}"
    start, end = examples[0].start(), examples[-1].end()
    indent = re.match(r"\s*", examples[0].group(0)).group(0)
    return text[:start] + "\n".join(indent + line for line in lines) + text[end:]


def nginx_config(workdir: str, port: int, upstreams: Sequence[int]) -> str:
    """The shipped conf.d file with our listen port and replicas, in an nginx.conf that keeps
    every path nginx writes in ``workdir`` (so it runs without root)."""
    shipped = NGINX_FILE.read_text()
    template = re.search(r"server 10\.0\.0\.\d+:8002( .*);", shipped).group(1)
    shipped = _servers(shipped, r"^\s*server 10\.0\.0\.\d+:8002.*;$",
                       [f"server 127.0.0.1:{p}{template};" for p in upstreams])
    shipped = shipped.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    paths = "".join(f"    {kind}_temp_path {workdir}/{kind};\n"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"daemon off;\nmaster_process on;\nworker_processes 1;\npid {workdir}/nginx.pid;\n"
            f"error_log {workdir}/error.log info;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n    access_log {workdir}/access.log;\n{paths}{shipped}}}\n")


def haproxy_config(workdir: str, port: int, upstreams: Sequence[int]) -> str:
    """The shipped sections with our listen port and replicas, after a global section with an
    admin socket (for the servers' states)."""
    shipped = HAPROXY_FILE.read_text()
    shipped = _servers(shipped, r"^\s*server pool\d+ 10\.0\.0\.\d+:8002$",
                       [f"server pool{n} 127.0.0.1:{p}" for n, p in enumerate(upstreams, 1)])
    shipped = shipped.replace("bind :8080", f"bind 127.0.0.1:{port}")
    return (f"global\n    stats socket {workdir}/admin.sock mode 600 level admin\n    log stdout format raw local0\n\n"
            + shipped.replace("defaults\n", "defaults\n    log global\n    option httplog\n", 1))


class Balancer:
    """A load balancer in a session of its own, listening on ``port`` once started."""

    def __init__(self, command: list[str], port: int, workdir: str) -> None:
        self.command, self.port, self.workdir = command, port, workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        with open(os.path.join(self.workdir, "balancer.log"), "wb") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._await_listening()
        except BaseException:
            self.stop()
            raise
        return self

    def _await_listening(self) -> None:
        deadline = time.monotonic() + STARTUP
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.command[0]} exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.command[0]} does not listen: {self.log()}") from None
                time.sleep(0.02)

    def log(self) -> str:
        texts = []
        for name in ("balancer.log", "error.log"):
            path = os.path.join(self.workdir, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    texts.append(f.read())
        return "\n".join(texts)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nginx(workdir: str, port: int, upstreams: Sequence[int]) -> Balancer:
    path = os.path.join(workdir, "nginx.conf")
    with open(path, "w") as f:
        f.write(nginx_config(workdir, port, upstreams))
    return Balancer([shutil.which("nginx") or "nginx", "-p", workdir, "-c", path], port, workdir)


def haproxy(workdir: str, port: int, upstreams: Sequence[int]) -> Balancer:
    path = os.path.join(workdir, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(haproxy_config(workdir, port, upstreams))
    return Balancer([shutil.which("haproxy") or "haproxy", "-db", "-f", path], port, workdir)


def haproxy_up(workdir: str) -> dict[str, bool]:
    """Each backend server's name and whether HAProxy has it in rotation, from its admin socket."""
    with socket.socket(socket.AF_UNIX) as admin:
        admin.connect(os.path.join(workdir, "admin.sock"))
        admin.sendall(b"show stat\n")
        data = b""
        while chunk := admin.recv(65536):
            data += chunk
    rows = [line.split(",") for line in data.decode().splitlines() if line and not line.startswith("#")]
    return {row[1]: row[17].startswith("UP") for row in rows
            if row[0] == "workerpool" and row[1] not in {"FRONTEND", "BACKEND"}}


@dataclass
class Load:
    """``connections`` clients sending KServe requests through ``port`` until stopped; each
    answer must be 200 and equal ``expected[model_version](x)``."""

    port: int
    model: str
    width: int
    expected: dict[str, Callable[[np.ndarray], np.ndarray]]
    connections: int = 16
    answers: dict[str, int] = field(default_factory=dict)  # by model_version
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Self:
        for seed in range(self.connections):
            thread = threading.Thread(target=self._client, args=(seed,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    @property
    def answered(self) -> int:
        with self._lock:
            return sum(self.answers.values())

    def _client(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        path = f"/v2/models/{self.model}/infer"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self._stop.is_set():
            x = rng.standard_normal((1, self.width)).astype(np.float32)
            body = json.dumps({"inputs": [{"name": "input", "shape": [1, self.width], "datatype": "FP32",
                                           "data": x.ravel().tolist()}]})
            try:
                connection.request("POST", path, body, {"Content-Type": "application/json"})
                reply = connection.getresponse()
                outcome = self._check(reply.status, reply.read(), x)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                outcome = f"{type(exc).__name__}: {exc}"
            with self._lock:
                if isinstance(outcome, str):
                    self.failures.append(outcome)
                else:
                    self.answers[outcome[0]] = self.answers.get(outcome[0], 0) + 1
        connection.close()

    def _check(self, status: int, body: bytes, x: np.ndarray) -> tuple[str] | str:
        if status != 200:
            return f"{status}: {body[:200]!r}"
        document: dict[str, Any] = json.loads(body)
        version = document["model_version"]
        if version not in self.expected:
            return f"answered by unknown generation {version}"
        output = np.asarray(document["outputs"][0]["data"], np.float32)
        if not np.allclose(output, self.expected[version](x).ravel(), rtol=1e-4, atol=1e-5):
            return f"a wrong answer for generation {version}"
        return (version,)
