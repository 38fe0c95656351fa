"""``grpc.health.v1.Health`` of a server: :class:`ServingHealth` holds the overall status and one
status per served service; they start NOT_SERVING and flip to SERVING on
:meth:`ServingHealth.mark_ready`.

The overall status (service ``""``: liveness, "the process is up and has started") and the
per-service statuses (readiness, "send me work") differ only through *dependencies*
(:meth:`ServingHealth.set_dependency`): a process whose work needs another one (the gateway needs
a reachable talker and decoder) reports its services NOT_SERVING while a dependency is down, and
keeps its overall status, so a liveness probe does not restart it for an outage elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tts_common import metrics


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
    served service (see the module doc). Methods must be called on the event loop's thread (from
    another thread use ``loop.call_soon_threadsafe(health.mark_ready)``)."""

    SERVING = health_pb2.HealthCheckResponse.SERVING
    NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

    def __init__(self, service_names: Iterable[str], *, stage: str = "", ready: bool = False) -> None:
        self.servicer = _HealthServicer()
        """The ``grpc.health.v1.Health`` servicer to add to the server."""
        self.service_names: tuple[str, ...] = ("", *service_names)
        self._stage = stage
        self._shutting_down = False
        self._marked_ready = ready
        self._dependencies: dict[str, bool] = {}
        self._publish()

    def _publish(self) -> None:
        up = self._marked_ready and not self._shutting_down
        self.servicer.set("", self.SERVING if up else self.NOT_SERVING)
        ready = self.services_ready
        for name in self.service_names[1:]:
            self.servicer.set(name, self.SERVING if ready else self.NOT_SERVING)
        if self._stage:
            metrics.READY.labels(stage=self._stage).set(1 if ready else 0)

    @property
    def ready(self) -> bool:
        """Whether the overall status is SERVING (started, not shutting down)."""
        return self.servicer.get("") == self.SERVING

    @property
    def services_ready(self) -> bool:
        """Whether the served services are SERVING (readiness): :attr:`ready` and every
        dependency available."""
        return self.ready and all(self._dependencies.values())

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def refusal_reason(self) -> str | None:
        """Why the server refuses work while not :attr:`ready` (the message of its UNAVAILABLE
        answers, gRPC and HTTP alike); None while ready."""
        if self.ready:
            return None
        if self._shutting_down:
            return "server shutting down"
        return "server not serving (starting up or unhealthy)"

    @property
    def unmet_dependencies(self) -> tuple[str, ...]:
        """Names of the dependencies that are down now."""
        return tuple(name for name, ok in self._dependencies.items() if not ok)

    def status(self, service: str = "") -> int | None:
        """The current status of ``service`` (None if unknown)."""
        return self.servicer.get(service)

    def mark_ready(self) -> None:
        """Report SERVING for the server and (dependencies permitting) every service; ignored
        once shutting down."""
        self._marked_ready = True
        self._publish()

    def mark_not_serving(self) -> None:
        """Report NOT_SERVING everywhere; :meth:`mark_ready` undoes it."""
        self._marked_ready = False
        self._publish()

    def set_dependency(self, name: str, available: bool) -> None:
        """Record whether dependency ``name`` is available: the services report SERVING only
        while every dependency is (the overall status does not depend on them)."""
        self._dependencies[name] = available
        self._publish()

    def enter_graceful_shutdown(self) -> None:
        """Report NOT_SERVING permanently (later :meth:`mark_ready` calls are ignored)."""
        self._shutting_down = True
        self._publish()


__all__ = ["ServingHealth"]
