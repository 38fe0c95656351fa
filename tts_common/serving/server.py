"""Building a grpc.aio server (:func:`build_server`) and the gRPC core options of servers and of
the channels between stages.

Every server gets the standard health service, server reflection (so ``grpcurl -plaintext
HOST:PORT list`` / ``describe`` work without .proto files), UNAVAILABLE answers for its own
services until ready (health and reflection always answer), message size limits, and
``SO_REUSEPORT`` off so a second process on the same port fails loudly instead of silently
sharing it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tts_common import metrics

from .config import ServerConfig
from .health import ServingHealth
from .interceptors import ReadinessInterceptor
from .names import HEALTH_SERVICE_NAME, PLUMBING_METHOD_PREFIXES, REFLECTION_SERVICE_NAME

_BOUND_PORTS: weakref.WeakKeyDictionary[grpc.aio.Server, int] = weakref.WeakKeyDictionary()


KEEPALIVE_SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    # The gateway pings its stage connections every few seconds (keepalive_channel_options) to
    # notice a hung replica; gRPC servers answer frequent pings with GOAWAY "too_many_pings" by
    # default (and the client then backs its pings off), so accept them, idle connections too.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
)
"""Server options that accept the stage channels' keepalive pings (every server has them)."""

_UNLIMITED_MS = 2**31 - 1


def server_options(config: ServerConfig) -> list[tuple[str, Any]]:
    """gRPC core options for a server built from ``config``."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
        # Without this, Linux lets a second process bind the same port and silently share it.
        ("grpc.so_reuseport", 0),
        *KEEPALIVE_SERVER_OPTIONS,
    ]
    if config.max_connection_age_seconds > 0:
        grace = config.max_connection_age_grace_seconds
        options += [
            ("grpc.max_connection_age_ms", _milliseconds(config.max_connection_age_seconds)),
            ("grpc.max_connection_age_grace_ms", _milliseconds(grace) if grace > 0 else _UNLIMITED_MS),
        ]
    return options


def _milliseconds(seconds: float) -> int:
    return max(1, min(int(seconds * 1000), _UNLIMITED_MS))


def channel_options(config: ServerConfig | None = None) -> list[tuple[str, Any]]:
    """Options for client channels between stages (same message limits as the server)."""
    config = config or ServerConfig()
    return [
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
    ]


def keepalive_channel_options(interval_seconds: float, timeout_seconds: float) -> list[tuple[str, Any]]:
    """Client channel options that ping the server every ``interval_seconds`` (also with no call
    in flight) and fail the connection, and every call on it, when a ping is not answered within
    ``timeout_seconds``: a hung or partitioned peer is noticed within their sum instead of the
    kernel's TCP timeouts (minutes). 0 ``interval_seconds`` = no keepalive pings."""
    if interval_seconds <= 0:
        return []
    timeout_ms = _milliseconds(timeout_seconds)
    return [
        ("grpc.keepalive_time_ms", _milliseconds(interval_seconds)),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Any ping in flight (gRPC's own bandwidth probes included) times out after this, and a
        # keepalive ping is not sent while another ping is outstanding: without it a stalled peer
        # is only noticed after the default ping timeout of one minute.
        ("grpc.http2.ping_timeout_ms", timeout_ms),
    ]


def build_server(
    config: ServerConfig,
    add_servicers: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    *,
    ready: bool = False,
    reject_until_ready: bool = True,
    always_available: Sequence[str] = (),
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    options: Sequence[tuple[str, Any]] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, ServingHealth]:
    """Create (not start) a grpc.aio server bound to ``config.address``.

    ``credentials``: serve TLS on the port (``grpc.ssl_server_credentials``); plaintext if None.

    ``add_servicers(server)`` registers the process's servicers; ``service_names`` are their
    fully-qualified names (see :func:`.names.service_name`). The server also gets health, reflection and
    — with ``reject_until_ready`` — UNAVAILABLE answers for the listed services' RPCs until
    ``health.mark_ready()`` (``always_available``: method prefixes such as
    ``"/qwen3tts.internal.v1.Talker/GetStats"`` exempt from that). Health starts SERVING only
    with ``ready=True``. Call from a coroutine (grpc.aio binds to the running loop). Raises
    RuntimeError if the port cannot be bound.
    """
    health = ServingHealth(service_names, stage=config.stage, ready=ready)
    all_interceptors: list[grpc.aio.ServerInterceptor] = []
    if reject_until_ready:
        all_interceptors.append(ReadinessInterceptor(health, (*PLUMBING_METHOD_PREFIXES, *always_available)))
    all_interceptors.extend(interceptors)
    server = grpc.aio.server(interceptors=all_interceptors, options=[*server_options(config), *options])
    add_servicers(server)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    reflection.enable_server_reflection(
        [*service_names, HEALTH_SERVICE_NAME, REFLECTION_SERVICE_NAME], server
    )
    try:
        if credentials is None:
            port = server.add_insecure_port(config.address)
        else:
            port = server.add_secure_port(config.address, credentials)
    except RuntimeError as exc:  # grpc raises on bind failure (older versions returned 0)
        raise RuntimeError(f"cannot bind gRPC server to {config.address}: {exc}") from exc
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC server to {config.address}")
    _BOUND_PORTS[server] = port
    if config.stage:
        metrics.init_stage(config.stage)
    return server, health


def bound_port(server: grpc.aio.Server) -> int:
    """The port a server made by :func:`build_server` is bound to (resolves port 0)."""
    return _BOUND_PORTS[server]


__all__ = [
    "KEEPALIVE_SERVER_OPTIONS",
    "bound_port",
    "build_server",
    "channel_options",
    "keepalive_channel_options",
    "server_options",
]
