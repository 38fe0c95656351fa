"""gRPC serving plumbing shared by the four processes (grpc.aio).

A process's ``__main__`` reduces to::

    config, args = parse_server_args(stage="talker", default_port=50052)
    setup_logging(config.log_level, stage=config.stage)

    async def main() -> None:
        servicer = TalkerServicer(args)                  # model not loaded yet
        await serve(
            config,
            lambda server: stages_pb2_grpc.add_TalkerServicer_to_server(servicer, server),
            [service_name(stages_pb2, "Talker")],
            startup=servicer.load,                       # runs while health says NOT_SERVING
        )

    asyncio.run(main())                                  # returns (exit 0) after SIGTERM/SIGINT

What every server gets (:func:`build_server`):

* the standard health service ``grpc.health.v1.Health``: the overall status ``""`` and each
  listed service start NOT_SERVING and flip to SERVING on :meth:`ServingHealth.mark_ready`;
* server reflection (``grpc.reflection.v1alpha``) listing the services, health and reflection,
  so ``grpcurl -plaintext HOST:PORT list`` / ``describe`` work without .proto files;
* until ready, RPCs of the listed services fail fast with UNAVAILABLE (health and reflection
  always answer);
* message size limits, and ``SO_REUSEPORT`` off so a second process on the same port fails
  loudly instead of silently sharing it.

Graceful shutdown (:func:`serve_until_signal`): on SIGTERM/SIGINT health turns NOT_SERVING, the
server stops accepting RPCs, in-flight RPCs (streams included) get ``grace`` seconds to finish,
then the remaining ones are cancelled; a second signal cancels them at once.

Errors: raise the exceptions of :mod:`tts_common.errors`; decorate servicer methods with
:func:`handle_rpc_errors` (or call :func:`abort_for_exception`) to report them with the matching
status code.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import inspect
import logging
import os
import signal
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tts_common import metrics
from tts_common.errors import TTSError
from tts_common.logging_setup import request_context, setup_logging

logger = logging.getLogger(__name__)

ENV_PREFIX = "QWEN3TTS_"
"""Prefix of the environment variables that provide defaults for the server flags."""

HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_SERVICE_NAME: str = reflection.SERVICE_NAME
REQUEST_ID_METADATA_KEY = "x-request-id"
"""Call metadata key carrying a request id (used when the message has none)."""

_MiB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass
class ServerConfig:
    """Network and lifecycle settings of one server process."""

    stage: str = ""
    """Process role ("gateway", "talker", "decoder", "speaker"): metrics ``stage`` label, log
    tag, and the stage part of the environment variable names."""

    host: str = "[::]"
    """gRPC bind address ("[::]" = all interfaces, IPv4 included; "127.0.0.1" = loopback)."""

    port: int = 50051
    """gRPC port; 0 picks a free port (read it back with :func:`bound_port`)."""

    metrics_host: str = "0.0.0.0"
    """Bind address of the Prometheus HTTP endpoint."""

    metrics_port: int = 0
    """Prometheus ``/metrics`` HTTP port; 0 disables the endpoint."""

    max_receive_message_bytes: int = 64 * _MiB
    """Largest accepted gRPC message (reference audio uploads are the big ones)."""

    max_send_message_bytes: int = 64 * _MiB
    """Largest gRPC message this server sends."""

    grace_seconds: float = 30.0
    """On SIGTERM/SIGINT, how long in-flight RPCs may run before they are cancelled."""

    log_level: str = "INFO"
    """Root log level name (DEBUG, INFO, WARNING, ...)."""

    @property
    def address(self) -> str:
        """``host:port`` as gRPC expects it (IPv6 literals bracketed)."""
        return format_address(self.host, self.port)


def format_address(host: str, port: int) -> str:
    """``host:port``, bracketing bare IPv6 literals (``::1`` → ``[::1]:port``)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


# (dataclass field, flag, type, help, has a stage-independent env var); ports have none on purpose:
# one QWEN3TTS_PORT shared by four processes on a host would make them collide.
_FLAGS: tuple[tuple[str, str, Callable[[str], Any], str, bool], ...] = (
    ("host", "--host", str, "gRPC bind address", True),
    ("port", "--port", int, "gRPC port (0 = any free port)", False),
    ("metrics_host", "--metrics-host", str, "Prometheus endpoint bind address", True),
    ("metrics_port", "--metrics-port", int, "Prometheus /metrics port (0 = disabled)", False),
    ("max_receive_message_bytes", "--max-receive-message-bytes", int, "largest accepted gRPC message", True),
    ("max_send_message_bytes", "--max-send-message-bytes", int, "largest sent gRPC message", True),
    ("grace_seconds", "--grace-seconds", float, "seconds in-flight RPCs may run after SIGTERM", True),
    ("log_level", "--log-level", str, "log level", True),
)


def env_names(stage: str, field: str, *, stage_independent: bool = True) -> list[str]:
    """Environment variables consulted for ``field``, most specific first, e.g. for stage
    "talker" and field "grace_seconds": ``QWEN3TTS_TALKER_GRACE_SECONDS``,
    ``QWEN3TTS_GRACE_SECONDS``."""
    key = field.upper()
    names = [f"{ENV_PREFIX}{stage.upper()}_{key}"] if stage else []
    if stage_independent or not stage:
        names.append(f"{ENV_PREFIX}{key}")
    return names


def env_value(names: Sequence[str], environ: Mapping[str, str], default: Any) -> Any:
    """The first of ``names`` set (non-empty) in ``environ``, as a string (argparse converts it
    with the flag's type, so a malformed value is a usage error), else ``default``."""
    for name in names:
        if environ.get(name, "") != "":
            return environ[name]
    return default


def add_server_arguments(
    parser: argparse.ArgumentParser,
    *,
    stage: str,
    default_port: int,
    env: Mapping[str, str] | None = None,
    default_host: str | None = None,
) -> None:
    """Add the :class:`ServerConfig` flags to ``parser``.

    ``default_host`` overrides the bind address default (stages use loopback by default so that
    only the gateway is reachable from outside unless a deployment says otherwise).

    Precedence: command-line flag > ``QWEN3TTS_<STAGE>_<FIELD>`` > ``QWEN3TTS_<FIELD>`` (not for
    ports) > built-in default (``default_port`` for the port). Environment values are parsed
    like flag values, so a malformed one is reported as a usage error.
    """
    environ = os.environ if env is None else env
    defaults = ServerConfig(stage=stage, port=default_port)
    if default_host is not None:
        defaults.host = default_host
    group = parser.add_argument_group("server")
    for field, flag, type_, help_text, stage_independent in _FLAGS:
        names = env_names(stage, field, stage_independent=stage_independent)
        default: Any = env_value(names, environ, getattr(defaults, field))
        group.add_argument(
            flag,
            dest=field,
            type=type_,
            default=default,
            help=f"{help_text} (env {' / '.join(names)}; default %(default)s)",
        )
    parser.set_defaults(_qwen3tts_stage=stage)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build the :class:`ServerConfig` from a namespace parsed with :func:`add_server_arguments`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig) if f.name != "stage"}
    return ServerConfig(stage=getattr(args, "_qwen3tts_stage", ""), **values)


def parse_server_args(
    argv: Sequence[str] | None = None,
    *,
    stage: str,
    default_port: int,
    parser: argparse.ArgumentParser | None = None,
    env: Mapping[str, str] | None = None,
    default_host: str | None = None,
) -> tuple[ServerConfig, argparse.Namespace]:
    """Parse ``argv`` (default ``sys.argv[1:]``) with the server flags added to ``parser`` (a new
    one if None; add the process's own flags to it first). Returns the config and the full
    namespace."""
    parser = parser or argparse.ArgumentParser(description=f"qwen3-tts {stage} server")
    add_server_arguments(parser, stage=stage, default_port=default_port, env=env, default_host=default_host)
    args = parser.parse_args(argv)
    return config_from_args(args), args


# ---------------------------------------------------------------------------------------------
# Health


class _HealthServicer(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health`` for grpc.aio with synchronous setters.

    (grpc_health's own aio servicer only has ``async`` setters, which cannot be called while
    building a server outside a coroutine.) Statuses change on the event loop thread; watchers
    wait on an event that is replaced on every change.
    """

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._changed = asyncio.Event()

    def get(self, service: str) -> int | None:
        return self._status.get(service)

    def set(self, service: str, status: int) -> None:
        if self._status.get(service) == status:
            return
        self._status[service] = status
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = None
        while True:
            changed = self._changed  # taken before reading, so no update can be missed
            status = self._status.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await changed.wait()


class ServingHealth:
    """Health state of one server: the overall status (service ``""``) and one status per
    served service. Methods must be called on the event loop's thread (from another thread use
    ``loop.call_soon_threadsafe(health.mark_ready)``)."""

    SERVING = health_pb2.HealthCheckResponse.SERVING
    NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

    def __init__(self, service_names: Iterable[str], *, stage: str = "", ready: bool = False) -> None:
        self.servicer = _HealthServicer()
        """The ``grpc.health.v1.Health`` servicer to add to the server."""
        self.service_names: tuple[str, ...] = ("", *service_names)
        self._stage = stage
        self._shutting_down = False
        self._set_all(ready)

    def _set_all(self, serving: bool) -> None:
        status = self.SERVING if serving else self.NOT_SERVING
        for name in self.service_names:
            self.servicer.set(name, status)
        if self._stage:
            metrics.READY.labels(stage=self._stage).set(1 if serving else 0)

    @property
    def ready(self) -> bool:
        """Whether the overall status is SERVING."""
        return self.servicer.get("") == self.SERVING

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def status(self, service: str = "") -> int | None:
        """The current status of ``service`` (None if unknown)."""
        return self.servicer.get(service)

    def mark_ready(self) -> None:
        """Report SERVING for the server and every service (ignored once shutting down)."""
        if not self._shutting_down:
            self._set_all(True)

    def mark_not_serving(self) -> None:
        """Report NOT_SERVING (e.g. lost a downstream stage); :meth:`mark_ready` undoes it."""
        if not self._shutting_down:
            self._set_all(False)

    def enter_graceful_shutdown(self) -> None:
        """Report NOT_SERVING permanently (later :meth:`mark_ready` calls are ignored)."""
        self._set_all(False)
        self._shutting_down = True


# ---------------------------------------------------------------------------------------------
# Server construction


_BOUND_PORTS: weakref.WeakKeyDictionary[grpc.aio.Server, int] = weakref.WeakKeyDictionary()

_ALWAYS_AVAILABLE = (
    f"/{HEALTH_SERVICE_NAME}/",
    f"/{REFLECTION_SERVICE_NAME}/",
    "/grpc.reflection.v1.ServerReflection/",
)


class RefusingInterceptor(grpc.aio.ServerInterceptor):
    """Base of interceptors that refuse calls with a status before the servicer runs.

    Methods under the ``exempt`` prefixes always pass; for the others :meth:`refusal` decides.
    """

    def __init__(self, exempt: Sequence[str]) -> None:
        self._exempt = tuple(exempt)

    def refusal(self, details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        """``(code, message)`` to fail the call with, or None to let it through."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(self._exempt):
            return handler
        refused = self.refusal(handler_call_details)
        return handler if refused is None else aborting_handler(handler, *refused)


class _ReadinessInterceptor(RefusingInterceptor):
    """Fails RPCs with UNAVAILABLE while the health status is not SERVING, except for the
    health and reflection services and the ``always_available`` method prefixes."""

    def __init__(self, health: ServingHealth, always_available: Sequence[str]) -> None:
        super().__init__(always_available)
        self._health = health

    def refusal(self, details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        if self._health.ready:
            return None
        reason = "shutting down" if self._health.shutting_down else "not serving (starting up or unhealthy)"
        return grpc.StatusCode.UNAVAILABLE, f"server {reason}"


def aborting_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str
) -> grpc.RpcMethodHandler:
    """A handler of the same RPC type as ``handler`` that fails every call with ``code``."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, details)

    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def server_options(config: ServerConfig) -> list[tuple[str, Any]]:
    """gRPC core options for a server built from ``config``."""
    return [
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
        # Without this, Linux lets a second process bind the same port and silently share it.
        ("grpc.so_reuseport", 0),
    ]


def channel_options(config: ServerConfig | None = None) -> list[tuple[str, Any]]:
    """Options for client channels between stages (same message limits as the server)."""
    config = config or ServerConfig()
    return [
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
    ]


def service_name(pb2_module: ModuleType, service: str) -> str:
    """Fully-qualified name of ``service`` defined in a generated ``*_pb2`` module, e.g.
    ``service_name(tts_pb2, "TextToSpeech") == "qwen3tts.v1.TextToSpeech"``."""
    return pb2_module.DESCRIPTOR.services_by_name[service].full_name


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
    fully-qualified names (see :func:`service_name`). The server also gets health, reflection and
    — with ``reject_until_ready`` — UNAVAILABLE answers for the listed services' RPCs until
    ``health.mark_ready()`` (``always_available``: method prefixes such as
    ``"/qwen3tts.internal.v1.Talker/GetStats"`` exempt from that). Health starts SERVING only
    with ``ready=True``. Call from a coroutine (grpc.aio binds to the running loop). Raises
    RuntimeError if the port cannot be bound.
    """
    health = ServingHealth(service_names, stage=config.stage, ready=ready)
    all_interceptors: list[grpc.aio.ServerInterceptor] = []
    if reject_until_ready:
        all_interceptors.append(_ReadinessInterceptor(health, (*_ALWAYS_AVAILABLE, *always_available)))
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


# ---------------------------------------------------------------------------------------------
# Lifecycle


class _StopSignals:
    """Installs SIGTERM/SIGINT handlers on the running loop: the first sets ``stop``, later ones
    call ``on_repeat``. Where handlers cannot be installed (non-main thread, Windows) only the
    event works."""

    def __init__(self, stop: asyncio.Event, signals: Sequence[signal.Signals]) -> None:
        self.stop = stop
        self.on_repeat: Callable[[], None] | None = None
        self._signals = signals
        self._installed: list[signal.Signals] = []

    def _handle(self, sig: signal.Signals) -> None:
        if not self.stop.is_set():
            logger.info("received %s: shutting down gracefully", sig.name)
            self.stop.set()
        elif self.on_repeat is not None:
            logger.warning("received %s again: cancelling in-flight RPCs", sig.name)
            self.on_repeat()

    def __enter__(self) -> _StopSignals:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            try:
                loop.add_signal_handler(sig, self._handle, sig)
                self._installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                logger.debug("cannot install a handler for %s here", sig.name)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        self._installed.clear()


async def _graceful_stop(
    server: grpc.aio.Server, health: ServingHealth, grace: float, drain_seconds: float, signals: _StopSignals
) -> None:
    health.enter_graceful_shutdown()
    if drain_seconds > 0:  # let load balancers observe NOT_SERVING before refusing RPCs
        await asyncio.sleep(drain_seconds)
    signals.on_repeat = lambda: asyncio.ensure_future(server.stop(0))
    started = time.monotonic()
    await server.stop(grace)
    logger.info("server stopped (%.2fs after shutdown began)", time.monotonic() - started)


async def _run_until_stopped(
    server: grpc.aio.Server, health: ServingHealth, grace: float, drain_seconds: float, signals: _StopSignals
) -> None:
    # Shielded: without a timeout, grpc's wait_for_termination awaits the server's own shutdown
    # future directly, and cancelling it would cancel that future and break server.stop().
    termination = asyncio.ensure_future(asyncio.shield(server.wait_for_termination()))
    stop_wait = asyncio.ensure_future(signals.stop.wait())
    try:
        await asyncio.wait({termination, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (termination, stop_wait):
            task.cancel()
        await asyncio.gather(termination, stop_wait, return_exceptions=True)
    if not signals.stop.is_set():
        logger.info("server terminated")
        return
    await _graceful_stop(server, health, grace, drain_seconds, signals)


async def serve_until_signal(
    server: grpc.aio.Server,
    health: ServingHealth,
    grace: float,
    *,
    stop_event: asyncio.Event | None = None,
    drain_seconds: float = 0.0,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """Run a started server until SIGTERM/SIGINT (or ``stop_event`` is set), then stop
    gracefully: health → NOT_SERVING, wait ``drain_seconds``, refuse new RPCs and give in-flight
    ones up to ``grace`` seconds (a repeated signal cancels them at once). Returns once the
    server has stopped (also if it terminates by other means); the caller then exits 0."""
    with _StopSignals(stop_event or asyncio.Event(), signals) as sigs:
        await _run_until_stopped(server, health, grace, drain_seconds, sigs)


async def serve(
    config: ServerConfig,
    add_servicers: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    *,
    startup: Callable[[], Awaitable[None]] | None = None,
    shutdown: Callable[[], Awaitable[None]] | None = None,
    stop_event: asyncio.Event | None = None,
    drain_seconds: float = 0.0,
    **build_kwargs: Any,
) -> None:
    """Whole lifecycle of a server process: metrics endpoint, :func:`build_server`, start, run
    ``startup()`` (e.g. load the model; health says NOT_SERVING meanwhile, and a signal cancels
    it), ``mark_ready()``, serve until SIGTERM/SIGINT (or ``stop_event``), graceful stop
    (:func:`serve_until_signal`), then ``shutdown()`` (release resources). Exceptions from
    ``startup`` stop the server and propagate (the process exits non-zero). ``build_kwargs`` go
    to :func:`build_server`."""
    metrics_server = metrics.start_metrics_server(config.metrics_port, config.metrics_host)
    try:
        server, health = build_server(config, add_servicers, service_names, **build_kwargs)
        await server.start()
        logger.info(
            "%s listening on %s (port %d)", config.stage or "server", config.address, bound_port(server)
        )
        try:
            with _StopSignals(stop_event or asyncio.Event(), (signal.SIGTERM, signal.SIGINT)) as sigs:
                if startup is not None and not await _startup(startup, sigs.stop):
                    logger.info("stopped during startup")
                    await _graceful_stop(server, health, 0.0, 0.0, sigs)
                    return
                health.mark_ready()
                logger.info("ready")
                await _run_until_stopped(server, health, config.grace_seconds, drain_seconds, sigs)
        except BaseException:
            await server.stop(0)
            raise
        finally:
            if shutdown is not None:
                await shutdown()
    finally:
        if metrics_server is not None:
            metrics_server.close()


async def _startup(startup: Callable[[], Awaitable[None]], stop: asyncio.Event) -> bool:
    """Run ``startup()`` unless ``stop`` is set first (then cancel it and return False).
    Startup exceptions propagate."""
    started = asyncio.ensure_future(startup())
    stop_wait = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({started, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_wait.cancel()
        if not started.done():
            started.cancel()
        await asyncio.gather(started, stop_wait, return_exceptions=True)
    if started.cancelled():
        return False
    started.result()  # re-raise a startup failure
    return True


# ---------------------------------------------------------------------------------------------
# Errors and request ids


def grpc_status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code an exception is reported as: the project errors by their declared code,
    a downstream stage's error by its code, timeouts as DEADLINE_EXCEEDED, cancellation as
    CANCELLED, NotImplementedError as UNIMPLEMENTED, anything else INTERNAL."""
    if isinstance(exc, TTSError):
        return grpc.StatusCode[exc.grpc_status]
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, asyncio.TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    return grpc.StatusCode.INTERNAL


def _details_for(exc: BaseException, code: grpc.StatusCode) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.details() or code.name
    text = str(exc) or type(exc).__name__
    return f"internal error: {type(exc).__name__}: {text}" if code is grpc.StatusCode.INTERNAL else text


async def abort_for_exception(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Log ``exc`` (with traceback if it is an internal error) and fail the RPC with the
    matching status (:func:`grpc_status_for`). Never returns."""
    code = grpc_status_for(exc)
    details = _details_for(exc, code)
    if code is grpc.StatusCode.INTERNAL:
        logger.error("RPC failed: %s", details, exc_info=exc)
    else:
        logger.info("RPC failed: %s: %s", code.name, details)
    await context.abort(code, details)
    raise AssertionError("unreachable")  # context.abort always raises


_F = TypeVar("_F", bound=Callable[..., Any])


def handle_rpc_errors(func: _F | None = None, *, stage: str | None = None) -> Any:
    """Decorator for servicer methods (``async def`` or ``async def`` generators): exceptions
    become gRPC statuses via :func:`abort_for_exception`. With ``stage``, the final status of
    every call is counted in ``qwen3tts_requests_total{stage, status}``. Usable bare
    (``@handle_rpc_errors``) or with arguments (``@handle_rpc_errors(stage="talker")``)."""

    def count(status: str) -> None:
        if stage:
            metrics.REQUESTS.labels(stage=stage, status=status).inc()

    def decorate(fn: _F) -> _F:
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def gen_wrapper(
                self: Any, request: Any, context: grpc.aio.ServicerContext, *args: Any, **kwargs: Any
            ) -> AsyncIterator[Any]:
                try:
                    async for item in fn(self, request, context, *args, **kwargs):
                        yield item
                except grpc.aio.AbortError:
                    count(_abort_status(context))
                    raise
                except (asyncio.CancelledError, GeneratorExit):
                    count(grpc.StatusCode.CANCELLED.name)
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    count(grpc_status_for(exc).name)
                    await abort_for_exception(context, exc)
                else:
                    count(grpc.StatusCode.OK.name)

            return gen_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        async def wrapper(
            self: Any, request: Any, context: grpc.aio.ServicerContext, *args: Any, **kwargs: Any
        ) -> Any:
            try:
                result = await fn(self, request, context, *args, **kwargs)
            except grpc.aio.AbortError:
                count(_abort_status(context))
                raise
            except asyncio.CancelledError:
                count(grpc.StatusCode.CANCELLED.name)
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                count(grpc_status_for(exc).name)
                await abort_for_exception(context, exc)
            count(grpc.StatusCode.OK.name)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate


def _abort_status(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return grpc.StatusCode.UNKNOWN.name


def new_request_id() -> str:
    """A fresh random request id (32 hex digits)."""
    return uuid.uuid4().hex


def resolve_request_id(explicit: str, context: grpc.aio.ServicerContext | None = None) -> str:
    """The request id to use: ``explicit`` (the message field) if set, else the
    ``x-request-id`` call metadata, else a new random id."""
    if explicit:
        return explicit
    if context is not None:
        for key, value in context.invocation_metadata() or ():
            if key == REQUEST_ID_METADATA_KEY and value:
                return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return new_request_id()


__all__ = [
    "ENV_PREFIX",
    "HEALTH_SERVICE_NAME",
    "REFLECTION_SERVICE_NAME",
    "REQUEST_ID_METADATA_KEY",
    "RefusingInterceptor",
    "ServerConfig",
    "ServingHealth",
    "abort_for_exception",
    "aborting_handler",
    "add_server_arguments",
    "bound_port",
    "build_server",
    "channel_options",
    "config_from_args",
    "env_names",
    "env_value",
    "format_address",
    "grpc_status_for",
    "handle_rpc_errors",
    "new_request_id",
    "parse_server_args",
    "request_context",
    "resolve_request_id",
    "serve",
    "serve_until_signal",
    "server_options",
    "service_name",
    "setup_logging",
]
