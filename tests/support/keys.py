"""CURVE key pairs and allow-lists for the tests of authenticated endpoints."""

from __future__ import annotations

from pathlib import Path

from workerpool import security


class CurveKeys:
    """A server's key pair and its two allow-lists (clients, worker hosts) under ``directory``;
    ``client`` and ``host`` add an allowed key pair and return its secret file."""

    def __init__(self, directory: Path) -> None:
        self.clients, self.hosts = directory / "clients", directory / "hosts"
        self.hosts.mkdir(parents=True)
        _, self.server_secret = security.generate(str(directory / "server"), "server")
        self.server_public = str(directory / "server" / "server.key")

    def client(self, name: str) -> str:
        return security.generate(str(self.clients), name)[1]

    def host(self, name: str) -> str:
        return security.generate(str(self.hosts), name)[1]

    def serve_args(self) -> tuple[str, ...]:
        return ("--curve-secret-key", self.server_secret, "--curve-client-keys", str(self.clients),
                "--curve-worker-keys", str(self.hosts))

    def host_args(self, secret: str) -> tuple[str, ...]:
        return ("--curve-key", secret, "--curve-server-key", self.server_public)
