"""What a gateway process is started with, as the supervisor hands it over: a JSON object in
its environment (:data:`ENVIRONMENT`), which holds its secret routing id, so not on a command
line that every local user can read."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

ENVIRONMENT = "WORKERPOOL_GATEWAY"


@dataclass(frozen=True)
class GatewaySpec:
    listen_fd: int  # the HTTP socket, bound by the supervisor and inherited
    router: str  # the router's private gateway endpoint
    routing_id: str  # hex; the router knows this gateway by it
    ops_url: str  # the supervisor's operations endpoint, on loopback
    model_name: str
    max_body: int  # bytes; a larger request body is answered 413 before it is read
    max_buffered: int  # bytes of request bodies held at once, over every connection
    max_connections: int
    request_timeout: float
    client_timeout: float  # seconds: --http-timeout
    supervisor_pid: int
    log_level: str
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def environment(self) -> dict[str, str]:
        return {ENVIRONMENT: json.dumps(asdict(self))}

    @classmethod
    def from_environment(cls) -> GatewaySpec:
        return cls(**json.loads(os.environ[ENVIRONMENT]))
