"""A gateway process: ``python -m workerpool.gateway``, started by the supervisor of a pool
served with ``--http``. It serves HTTP on the socket the supervisor bound and hands every
request to the router as a ZeroMQ client would. The supervisor's stop signal (SIGUSR1, as a
worker's) stops it taking connections; what it holds is answered first (the router answers
everything it took). It ignores the supervisor's control signals, a Ctrl-C among them, and
dies with the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import sys

from aiohttp import web

from .. import linux
from ..logs import setup_logging
from ..worker.spec import CONTROL_SIGNALS, STOP_SIGNAL
from .dataplane import DataPlane
from .ops import OpsProxy
from .server import Gateway, make_server
from .spec import GatewaySpec
from .upstream import REPLY_SLACK, RouterLink

log = logging.getLogger(__name__)


def main() -> int:
    for signum in CONTROL_SIGNALS:  # one pending since the spawn is dropped by this
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CONTROL_SIGNALS)  # blocked by Process.spawn
    spec = GatewaySpec.from_environment()
    setup_logging(spec.log_level)
    if not linux.die_with_parent(spec.supervisor_pid):
        return 1
    linux.set_name("workerpool-http")
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(spec))
    else:
        uvloop.run(serve(spec))
    return 0


async def serve(spec: GatewaySpec) -> None:
    link = RouterLink(spec.router, bytes.fromhex(spec.routing_id), max_message_size=spec.max_body)
    link.start()
    ops = OpsProxy(spec.ops_url)
    plane = DataPlane(link, spec.model_name, request_timeout=spec.request_timeout)
    plane.start()
    gateway = Gateway(plane, ops,
                      max_body=spec.max_body, max_buffered=spec.max_buffered, token=_token(spec),
                      client_timeout=spec.client_timeout)
    runner = web.ServerRunner(make_server(gateway, spec.max_connections), handle_signals=False,
                              shutdown_timeout=spec.request_timeout + REPLY_SLACK)
    await runner.setup()
    listening = socket.socket(fileno=spec.listen_fd)
    site = web.SockSite(runner, listening, ssl_context=_tls(spec))
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(STOP_SIGNAL, stop.set)
    await stop.wait()
    await runner.cleanup()
    await ops.close()
    link.close()


def _token(spec: GatewaySpec) -> bytes | None:
    if spec.token_file is None:
        return None
    with open(spec.token_file, "rb") as file:
        return file.read().strip()


def _tls(spec: GatewaySpec) -> ssl.SSLContext | None:
    if spec.cert_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(spec.cert_file, spec.key_file)
    return context


if __name__ == "__main__":
    sys.exit(main())
