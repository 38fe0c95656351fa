"""The lifecycle of a server process: :func:`serve` (metrics endpoint, build, start, startup,
ready, serve, graceful stop, shutdown) and :func:`serve_until_signal`.

Graceful shutdown: on SIGTERM/SIGINT health turns NOT_SERVING, the server stops accepting RPCs,
in-flight RPCs (streams included) get ``grace`` seconds to finish, then the remaining ones are
cancelled; a second signal cancels them at once.

A process may run other servers on the same event loop, :class:`Companion`s (the gateway's HTTP
API): they start once the gRPC server listens, share its health, and stop with it, gracefully
and within the same ``grace``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc

from tts_common import metrics

from .config import ServerConfig
from .health import ServingHealth
from .server import bound_port, build_server

logger = logging.getLogger(__name__)


class Companion(Protocol):
    """Another server of the process (e.g. HTTP), living and dying with the gRPC server."""

    async def start(self, health: ServingHealth) -> None:
        """Start listening (the gRPC server already does); ``health`` is the process's
        readiness (NOT_SERVING until startup is done, and again once shutting down)."""

    async def stop(self, grace: float) -> None:
        """Stop accepting, give in-flight requests up to ``grace`` seconds, then end them."""


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


async def _stop_all(server: grpc.aio.Server, companions: Sequence[Companion], grace: float) -> None:
    """The gRPC server and the companions, stopped together (each within ``grace``)."""
    results = await asyncio.gather(
        server.stop(grace), *(c.stop(grace) for c in companions), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            logger.error("error while stopping: %s", result, exc_info=result)


async def _graceful_stop(
    server: grpc.aio.Server,
    health: ServingHealth,
    grace: float,
    drain_seconds: float,
    signals: _StopSignals,
    companions: Sequence[Companion] = (),
) -> None:
    health.enter_graceful_shutdown()
    if drain_seconds > 0:  # let load balancers observe NOT_SERVING before refusing RPCs
        await asyncio.sleep(drain_seconds)
    signals.on_repeat = lambda: asyncio.ensure_future(_stop_all(server, companions, 0))
    started = time.monotonic()
    await _stop_all(server, companions, grace)
    logger.info("server stopped (%.2fs after shutdown began)", time.monotonic() - started)


async def _run_until_stopped(
    server: grpc.aio.Server,
    health: ServingHealth,
    grace: float,
    drain_seconds: float,
    signals: _StopSignals,
    companions: Sequence[Companion] = (),
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
        await _stop_all(server, companions, 0)
        return
    await _graceful_stop(server, health, grace, drain_seconds, signals, companions)


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
    companions: Sequence[Companion] = (),
    on_health: Callable[[ServingHealth], None] | None = None,
    **build_kwargs: Any,
) -> None:
    """Whole lifecycle of a server process: metrics endpoint, :func:`build_server`, start (and
    the ``companions``), run ``startup()`` (e.g. load the model; health says NOT_SERVING
    meanwhile, and a signal cancels it), ``mark_ready()``, serve until SIGTERM/SIGINT (or
    ``stop_event``), graceful stop of the server and the companions (:func:`serve_until_signal`),
    then ``shutdown()`` (release resources). Exceptions from ``startup`` stop the server and
    propagate (the process exits non-zero). ``on_health`` gets the server's
    :class:`ServingHealth` once it is built, before the companions start (e.g. to tie readiness
    to downstream stages with :meth:`ServingHealth.set_dependency`). ``build_kwargs`` go to
    :func:`build_server`."""
    metrics_server = metrics.start_metrics_server(config.metrics_port, config.metrics_host)
    try:
        server, health = build_server(config, add_servicers, service_names, **build_kwargs)
        if on_health is not None:
            on_health(health)
        await server.start()
        logger.info(
            "%s listening on %s (port %d)", config.stage or "server", config.address, bound_port(server)
        )
        started: list[Companion] = []
        try:
            for companion in companions:
                await companion.start(health)
                started.append(companion)
            with _StopSignals(stop_event or asyncio.Event(), (signal.SIGTERM, signal.SIGINT)) as sigs:
                if startup is not None and not await _startup(startup, sigs.stop):
                    logger.info("stopped during startup")
                    await _graceful_stop(server, health, 0.0, 0.0, sigs, started)
                    return
                health.mark_ready()
                logger.info("ready")
                await _run_until_stopped(server, health, config.grace_seconds, drain_seconds, sigs, started)
        except BaseException:
            await _stop_all(server, started, 0)
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


__all__ = ["Companion", "serve", "serve_until_signal"]
