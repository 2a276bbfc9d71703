"""CURVE authentication and encryption for TCP endpoints, with pyzmq's own authenticator.

Keys are ZeroMQ certificate files: ``NAME.key`` (public, safe to hand out) and
``NAME.key_secret`` (public and secret key; keep it private). A server is given its secret
certificate and a directory of the public certificates it allows; a client or worker host is
given its own secret certificate and the server's public one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq
import zmq.auth

if TYPE_CHECKING:  # imported when used: it loads asyncio, which a pool without CURVE never needs
    from zmq.auth.thread import ThreadAuthenticator


class KeysError(Exception):
    """A key file or directory is missing or unreadable."""


def generate(directory: str, name: str) -> tuple[str, str]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (mode 0600) in ``directory``; return their paths."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return public, secret


def _load(path: str, need_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeysError(f"cannot read the key file {path}: {exc}") from exc
    if need_secret and secret is None:
        raise KeysError(f"{path} holds no secret key (use the NAME.key_secret file)")
    return public, secret


CLIENTS = "clients"
WORKER_HOSTS = "workers"


@dataclass
class ServerKeys:
    """A server's secret certificate and one allow-list per role: clients, and worker hosts.

    Each bound socket authenticates in its own ZAP domain, so a client's key never admits a
    worker host (which could otherwise answer other clients' requests) and the reverse.
    """

    secret_file: str
    allowed_dir: str  # clients' public keys
    worker_dir: str | None = None  # worker hosts' public keys; None: no worker host is admitted

    def start(self, context: zmq.Context) -> ThreadAuthenticator:
        """Start the authenticator that checks every CURVE peer against its role's allow-list."""
        for directory, role in ((self.allowed_dir, "client"), (self.worker_dir, "worker host")):
            if directory is not None and not os.path.isdir(directory):
                raise KeysError(f"{role} key directory {directory} does not exist")
        self.public, self.secret = _load(self.secret_file, need_secret=True)
        from zmq.auth.thread import ThreadAuthenticator

        authenticator = ThreadAuthenticator(context)
        authenticator.start()
        authenticator.configure_curve(domain=CLIENTS, location=self.allowed_dir)
        if self.worker_dir is not None:
            authenticator.configure_curve(domain=WORKER_HOSTS, location=self.worker_dir)
        return authenticator

    def apply(self, sock: zmq.Socket, domain: str = CLIENTS) -> None:
        """Make a bound socket a CURVE server: only peers allowed in ``domain`` connect, all
        traffic encrypted."""
        sock.zap_domain = domain.encode()
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True


@dataclass
class ClientKeys:
    """A client's (or worker host's) own secret certificate and the server's public one."""

    secret_file: str
    server_public_file: str

    def apply(self, sock: zmq.Socket) -> None:
        public, secret = _load(self.secret_file, need_secret=True)
        server_public, _ = _load(self.server_public_file, need_secret=False)
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_serverkey = server_public
