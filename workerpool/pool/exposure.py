"""What a pool's settings leave open to the network, said once at start for both doors: the
ZeroMQ endpoints without CURVE keys, the HTTP port without a token. Decided from the settings
alone, so it is tested without opening anything to the network."""

from __future__ import annotations

from .. import runtime
from ..config.pool import ServeConfig


def open_doors(config: ServeConfig) -> list[str]:
    """A warning for each endpoint anyone who can reach it may use."""
    warnings = []
    if config.server_keys is None:
        for endpoint in (config.bind, config.backend):
            if endpoint and not runtime.is_local(endpoint):
                warnings.append(f"{endpoint} is open to the network without CURVE keys: anyone who "
                                "can reach it can use it (see --curve-secret-key and --curve-client-keys)")
        if config.backend and runtime.is_local(config.backend):
            warnings.append(f"worker hosts join {config.backend} without CURVE keys: any local user "
                            "can register there as a worker and answer clients' requests (see "
                            "--curve-worker-keys)")
    if config.http and config.http_token_file is None and not _local_http(config.http):
        clear = "" if config.http_cert else ", and --http-cert so that the token is not sent in clear"
        warnings.append(f"--http {config.http} is open to the network without a token: anyone who can "
                        f"reach it can run the model (see --http-token-file{clear})")
    return warnings


def _local_http(address: str) -> bool:
    from ..ops.http import parse_address  # with prometheus_client: only for a pool serving HTTP

    try:
        host, _ = parse_address(address)
    except ValueError:  # refused when the pool opens it
        return True
    return runtime.is_local(f"tcp://[{host}]:0")
