"""nginx and HAProxy in front of replicas, from the configurations deploy/ ships: each rendered
to run unprivileged on loopback, its paths in a scratch directory, in a session of its own.

The shipped files are used as they are but for their example server lines (one per replica
here) and their listen address; what they leave to the host's main configuration is set as a
stock install sets it (nginx: ``worker_processes auto``; HAProxy: its default threads), with
access logs off so that a benchmark weighs the proxying alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence

from .paths import SCRIPTS_DIR
from .servers import stop_session, wait_listening

DEPLOY_DIR = os.path.join(os.path.dirname(SCRIPTS_DIR), "deploy")
NGINX_FILE = os.path.join(DEPLOY_DIR, "nginx", "workerpool.conf")
HAPROXY_FILE = os.path.join(DEPLOY_DIR, "haproxy", "workerpool.cfg")
BALANCERS = ("nginx", "haproxy")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _servers(text: str, pattern: str, lines: Sequence[str]) -> str:
    """``text`` with its example server lines (those matching ``pattern``) replaced by ``lines``."""
    examples = list(re.finditer(pattern, text, re.MULTILINE))
    if not examples:
        raise RuntimeError(f"no server line matches {pattern!r} in the shipped configuration")
    start, end = examples[0].start(), examples[-1].end()
    first = examples[0].group(0)
    indent = first[:len(first) - len(first.lstrip())]
    return text[:start] + "\n".join(indent + line for line in lines) + text[end:]


def nginx_config(workdir: str, port: int, upstreams: Sequence[int]) -> str:
    """The shipped conf.d file with our listen port and replicas, in an nginx.conf that keeps
    every path nginx writes in ``workdir``."""
    shipped = _read(NGINX_FILE)
    template = re.search(r"server 10\.0\.0\.\d+:8002( .*);", shipped)
    if template is None:
        raise RuntimeError(f"{NGINX_FILE}: no example server line")
    shipped = _servers(shipped, r"^\s*server 10\.0\.0\.\d+:8002.*;$",
                       [f"server 127.0.0.1:{p}{template.group(1)};" for p in upstreams])
    shipped = shipped.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    paths = "".join(f"    {kind}_temp_path {workdir}/{kind};\n"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root;\n" if os.geteuid() == 0 else ""  # else its workers could not reach workdir
    return (f"daemon off;\nmaster_process on;\nworker_processes auto;\n{user}pid {workdir}/nginx.pid;\n"
            f"error_log {workdir}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n    access_log off;\n{paths}{shipped}}}\n")


def haproxy_config(workdir: str, port: int, upstreams: Sequence[int]) -> str:
    """The shipped sections with our listen port and replicas, after a global section with an
    admin socket in ``workdir`` (``haproxy_up`` reads the servers' states there)."""
    shipped = _read(HAPROXY_FILE)
    shipped = _servers(shipped, r"^\s*server pool\d+ 10\.0\.0\.\d+:8002$",
                       [f"server pool{n} 127.0.0.1:{p}" for n, p in enumerate(upstreams, 1)])
    if "bind :8080" not in shipped:
        raise RuntimeError(f"{HAPROXY_FILE}: no 'bind :8080'")
    return (f"global\n    stats socket {workdir}/admin.sock mode 600 level admin\n\n"
            + shipped.replace("bind :8080", f"bind 127.0.0.1:{port}"))


def balancer_command(kind: str, workdir: str, port: int, upstreams: Sequence[int]) -> list[str]:
    """Write ``kind``'s configuration in ``workdir``; the command that runs it in the foreground."""
    if kind == "nginx":
        path = os.path.join(workdir, "nginx.conf")
        text = nginx_config(workdir, port, upstreams)
        command = [shutil.which("nginx") or "nginx", "-p", workdir, "-c", path]
    elif kind == "haproxy":
        path = os.path.join(workdir, "haproxy.cfg")
        text = haproxy_config(workdir, port, upstreams)
        command = [shutil.which("haproxy") or "haproxy", "-db", "-f", path]
    else:
        raise ValueError(f"no balancer {kind!r}: one of {', '.join(BALANCERS)}")
    with open(path, "w") as f:
        f.write(text)
    return command


def balancer_log(workdir: str) -> str:
    """What the balancer running in ``workdir`` logged (its output, then nginx's error log)."""
    paths = [os.path.join(workdir, name) for name in ("balancer.log", "error.log")]
    return "\n".join(_read(path) for path in paths if os.path.exists(path))


def haproxy_up(workdir: str) -> dict[str, bool]:
    """Each backend server's name and whether HAProxy, running in ``workdir``, has it in
    rotation (from its admin socket)."""
    with socket.socket(socket.AF_UNIX) as admin:
        admin.connect(os.path.join(workdir, "admin.sock"))
        admin.sendall(b"show stat\n")
        data = b""
        while chunk := admin.recv(65536):
            data += chunk
    header, *lines = data.decode().splitlines()
    columns = header.removeprefix("# ").split(",")
    rows = [dict(zip(columns, line.split(","), strict=False)) for line in lines if line]
    return {row["svname"]: row["status"].startswith("UP") for row in rows
            if row["pxname"] == "workerpool" and row["svname"] not in {"FRONTEND", "BACKEND"}}


@contextlib.contextmanager
def balancer(kind: str, workdir: str, port: int, upstreams: Sequence[int]) -> Iterator[subprocess.Popen[bytes]]:
    """nginx or HAProxy (``kind``) listening on loopback ``port`` in front of the loopback
    ``upstreams``, its files in ``workdir``; stopped with its whole session."""
    os.makedirs(workdir, exist_ok=True)
    command = balancer_command(kind, workdir, port, upstreams)
    with open(os.path.join(workdir, "balancer.log"), "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        try:
            wait_listening(proc, port, kind)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{balancer_log(workdir)}") from None
        yield proc
    finally:
        stop_session(proc)
