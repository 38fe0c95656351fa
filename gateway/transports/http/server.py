"""The HTTP listener: uvicorn serving the app on the gateway's own event loop, next to the gRPC
server (a :class:`tts_common.serving.lifecycle.Companion`: started once gRPC listens, stopped with
it, gracefully, within the same grace period).

uvicorn's own ``serve()`` would install SIGTERM/SIGINT handlers over the process's (and re-raise
the signals when it ends): the process lifecycle owns the signals, so that part is switched off.
The socket is bound here rather than by uvicorn so that ``[::]`` means what it means for the gRPC
port (every interface, IPv4 included, IPv4 alone where IPv6 is off) and port 0 reports the port it
got. TLS follows the gRPC port's settings (``--tls-cert``/``--tls-key``, ``--tls-client-ca``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator

import uvicorn

from tts_common.serving.health import ServingHealth

from ...config import GatewayConfig
from ...core import Gateway
from .app import HttpApi, create_app
from .limits import PARSER_HEAD_FACTOR

logger = logging.getLogger(__name__)

ALL_INTERFACES = ("", "::", "[::]", "0.0.0.0")


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handling (the process's lifecycle handles the signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket; ``host`` "[::]"/"::"/"" = every interface,
    dual-stack where the machine has IPv6."""
    if host in ALL_INTERFACES:
        if host != "0.0.0.0" and socket.has_ipv6:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(("::", port))
                return sock
            except OSError:
                sock.close()  # no IPv6 here: IPv4 only
        host = "0.0.0.0"
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class HttpServer:
    """The HTTP API of one gateway process (see the module doc)."""

    def __init__(self, gateway: Gateway, config: GatewayConfig, host: str, port: int) -> None:
        """``host``/``port``: where to listen (port 0: any free port, see :attr:`port`)."""
        self.api = HttpApi(gateway, config)
        self.app = create_app(self.api)
        self.host = host
        self.requested_port = port
        self.port = 0
        """The bound port, once started."""
        tls: dict[str, object] = {}
        if config.tls_cert and config.tls_key:
            tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
            if config.tls_client_ca:
                tls.update(ssl_ca_certs=config.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        self._uvicorn = _EmbeddedServer(
            uvicorn.Config(
                self.app,
                lifespan="off",
                log_config=None,  # the process's logging setup
                access_log=False,
                server_header=False,
                http="h11",  # the parser the head limits are made for (never httptools if installed)
                h11_max_incomplete_event_size=config.http_max_header_bytes * PARSER_HEAD_FACTOR,
                ws="websockets-sansio",  # /v1/audio/speech/stream (websockets' current API)
                ws_max_size=config.http_max_body_bytes,  # one text message at most like a body
                **tls,  # type: ignore[arg-type]
            )
        )
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self._uvicorn.config.ssl_certfile else "http"

    async def start(self, health: ServingHealth | None = None) -> None:
        """Bind and serve (returns once listening); RuntimeError if the port cannot be bound."""
        self.api.health = health
        try:
            self._sock = bind_socket(self.host, self.requested_port)
        except OSError as exc:
            raise RuntimeError(
                f"cannot bind the HTTP API to {self.host}:{self.requested_port}: {exc}"
            ) from exc
        self.port = self._sock.getsockname()[1]
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[self._sock]), name="http-api")
        while not self._uvicorn.started:
            if self._task.done():  # failed to start: report why
                await self._task
                raise RuntimeError("the HTTP API stopped during start-up")
            await asyncio.sleep(0.01)
        logger.info("HTTP API listening on %s://%s:%d (playground at /)", self.scheme, self.host, self.port)

    async def stop(self, grace: float) -> None:
        """Refuse new connections, let in-flight requests (streams included) finish for up to
        ``grace`` seconds, then cancel them. A second call while stopping cancels them at once."""
        task = self._task
        if task is None or task.done():
            return
        server = self._uvicorn
        if server.should_exit:  # already stopping (a repeated signal): now
            server.force_exit = True
            for request_task in list(server.server_state.tasks):
                request_task.cancel()
        else:
            # uvicorn cancels the requests still running after this (0 would time out before
            # even looking, and log a cancellation of nothing).
            server.config.timeout_graceful_shutdown = max(grace, 0.05)
            server.should_exit = True
        # The margin covers uvicorn's 0.1 s ticks and its pause before waiting.
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), max(grace, 0.05) + 2.0)
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


__all__ = ["HttpServer", "bind_socket"]
