"""Channels from the gateway to the stage processes, and which replica gets a call.

A :class:`StageClient` holds one grpc.aio channel per target of a stage and hands out stubs:

* a list of ``host:port`` targets gets one channel each; :meth:`StageClient.acquire` (and
  :meth:`StageClient.lease`) picks the endpoint with the fewest requests this gateway has in
  flight on it, round-robin among ties, skipping replicas that failed their last health check,
  that just failed a call, or whose channel is in TRANSIENT_FAILURE, while a usable one exists;
* a single target URI (``dns:///talker:50052``, ``ipv4:...``, ``unix:...``) gets one channel with
  gRPC's ``round_robin`` load-balancing policy and client-side health checking: gRPC resolves the
  name, spreads calls over every address whose health service reports SERVING (re-resolving as
  replicas come and go: the stages' maximum connection age makes it happen periodically), per
  call for unary RPCs and per stream for streaming ones.

Health: :meth:`StageClient.start_health_checks` checks every endpoint periodically
(``grpc.health.v1`` Check of the stage's service; a server without the health service counts as
healthy since it answered). :attr:`StageClient.reachable` is whether any endpoint passed its last
check; :func:`tie_readiness` turns that into the gateway's readiness. A call failing for a
connection-level reason marks its endpoint failed at once (:meth:`StageClient.mark_failed`) and
has it re-checked right away, so failovers do not wait for the next periodic check.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tts_common.serving.health import ServingHealth

logger = logging.getLogger(__name__)

StubT = TypeVar("StubT")

_URI_PREFIXES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:")


def is_target_uri(target: str) -> bool:
    """Whether ``target`` is a gRPC name-resolver URI rather than a plain ``host:port``."""
    return "://" in target or target.startswith(_URI_PREFIXES)


def uri_service_config(health_service: str) -> str:
    """The service config of a resolver-URI channel: round_robin over the resolved addresses,
    each used only while its ``health_service`` reports SERVING (gRPC watches it)."""
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": health_service},
        }
    )


@dataclass(eq=False)
class Endpoint(Generic[StubT]):
    """One channel of a stage with its stub, this gateway's in-flight count on it and its
    health as last seen."""

    target: str
    channel: grpc.aio.Channel
    stub: StubT
    in_flight: int = 0
    healthy: bool | None = None
    """Result of the last health check or call (None: not checked yet)."""
    recheck: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def is_uri(self) -> bool:
        """Whether this channel spreads calls over several resolved addresses itself."""
        return is_target_uri(self.target)

    def state(self) -> grpc.ChannelConnectivity:
        """Current connectivity (does not trigger a connection attempt)."""
        return self.channel.get_state(try_to_connect=False)

    def usable(self) -> bool:
        """Worth sending a call to: not known unhealthy, channel not failing."""
        return self.healthy is not False and self.state() is not grpc.ChannelConnectivity.TRANSIENT_FAILURE


class StageClient(Generic[StubT]):
    """Channels and stubs of one stage (see the module doc for the routing rules)."""

    def __init__(
        self,
        stage: str,
        targets: Sequence[str],
        stub_factory: Callable[[grpc.aio.Channel], StubT],
        *,
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        health_service: str = "",
    ) -> None:
        """Create the channels (call from a coroutine: grpc.aio channels bind to the running
        loop). ``targets``: one URI or any number of ``host:port``; ``health_service``: the
        service name health checks ask about (``""`` = the server as a whole)."""
        if not targets:
            raise ValueError(f"no targets for the {stage} stage")
        uris = [t for t in targets if is_target_uri(t)]
        if uris and len(targets) > 1:
            raise ValueError(
                f"{stage} targets: a resolver URI ({uris[0]}) must be the only "
                "target; list plain host:port targets instead"
            )
        self.stage = stage
        self.targets: tuple[str, ...] = tuple(targets)
        self.health_service = health_service
        self._rr = itertools.count()
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._checks: list[asyncio.Task[None]] = []
        self._checked: set[int] = set()
        self.endpoints: list[Endpoint[StubT]] = []
        for target in targets:
            opts = list(options)
            if is_target_uri(target):
                opts.append(("grpc.service_config", uri_service_config(health_service)))
            channel = (
                grpc.aio.secure_channel(target, credentials, options=opts)
                if credentials is not None
                else grpc.aio.insecure_channel(target, options=opts)
            )
            self.endpoints.append(Endpoint(target, channel, stub_factory(channel)))

    # --- choosing a replica ---------------------------------------------------------------------
    def _ordered(self) -> list[Endpoint[StubT]]:
        n = len(self.endpoints)
        start = next(self._rr) % n if n > 1 else 0
        return self.endpoints[start:] + self.endpoints[:start]

    def _candidates(
        self, exclude: Collection[Endpoint[StubT]], *, usable_only: bool = False
    ) -> list[Endpoint[StubT]]:
        """The endpoints one call may go to, in round-robin order: the usable ones not in
        ``exclude``, else all usable ones, else (unless ``usable_only``: then none) all."""
        ordered = self._ordered()
        healthy = [e for e in ordered if e.usable()]
        preferred = [e for e in healthy if e not in exclude]
        return preferred or healthy or ([] if usable_only else ordered)

    @staticmethod
    def _take(candidates: Sequence[Endpoint[StubT]]) -> Endpoint[StubT]:
        """The candidate with the fewest calls in flight, counted as one more in flight."""
        endpoint = min(candidates, key=lambda e: e.in_flight)  # min keeps the first of ties
        endpoint.in_flight += 1
        return endpoint

    def acquire(self) -> Endpoint[StubT]:
        """An endpoint to run one request on (usable ones first), counted as in flight until
        :meth:`release`."""
        return self._take(self._candidates(()))

    def release(self, endpoint: Endpoint[StubT]) -> None:
        """End the in-flight count of an :meth:`acquire`."""
        endpoint.in_flight -= 1

    @contextlib.contextmanager
    def lease(self) -> Iterator[Endpoint[StubT]]:
        """An endpoint to run one request on, counted as in flight while the block runs."""
        endpoint = self.acquire()
        try:
            yield endpoint
        finally:
            self.release(endpoint)

    async def acquire_replacement(
        self, failed: Collection[Endpoint[StubT]], timeout: float
    ) -> Endpoint[StubT] | None:
        """A usable endpoint to move a call to after ``failed`` ones broke it: one not in
        ``failed`` when possible, else a failed one that passed a health check since. Waits up
        to ``timeout`` seconds for one to become usable; None if none did. Acquired: release it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed  # taken before looking, so no change can be missed
            candidates = self._candidates(failed, usable_only=True)
            if candidates:
                return self._take(candidates)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    @property
    def in_flight(self) -> int:
        """Requests this gateway has in flight on the stage (all endpoints)."""
        return sum(e.in_flight for e in self.endpoints)

    # --- health ---------------------------------------------------------------------------------
    @property
    def reachable(self) -> bool:
        """Whether some endpoint passed its last health check."""
        return any(e.healthy for e in self.endpoints)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the event loop) whenever an endpoint's health changes."""
        self._listeners.append(callback)

    def _set_health(self, endpoint: Endpoint[StubT], healthy: bool) -> None:
        if endpoint.healthy is healthy:
            return
        if endpoint.healthy is not None or not healthy:
            logger.log(
                logging.INFO if healthy else logging.WARNING,
                "%s replica %s is %s",
                self.stage,
                endpoint.target,
                "healthy again" if healthy else "unhealthy",
            )
        endpoint.healthy = healthy
        self._notify()
        for callback in self._listeners:
            callback()

    def _notify(self) -> None:
        """Wake every waiter on the current ``_changed`` event; later waiters get a fresh one."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def mark_failed(self, endpoint: Endpoint[StubT]) -> None:
        """A call on ``endpoint`` failed at the connection level: no new calls go to it until a
        health check passes (one runs at once). A resolver-URI endpoint is only re-checked: the
        failure concerns one of its addresses, which gRPC's own health checking takes out."""
        if not endpoint.is_uri:
            self._set_health(endpoint, False)
        endpoint.recheck.set()

    def start_health_checks(self, interval: float, timeout: float) -> None:
        """Check every endpoint now and then every ``interval`` seconds (call in the loop)."""
        if self._checks:
            return
        for index, endpoint in enumerate(self.endpoints):
            self._checks.append(
                asyncio.create_task(
                    self._check_loop(index, endpoint, interval, timeout),
                    name=f"{self.stage} health {endpoint.target}",
                )
            )

    async def first_checks_done(self, timeout: float) -> None:
        """Wait until every endpoint was checked once (at most ``timeout`` seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._checks and len(self._checked) < len(self.endpoints) and loop.time() < deadline:
            changed = self._changed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), max(deadline - loop.time(), 0))

    async def _check_loop(
        self, index: int, endpoint: Endpoint[StubT], interval: float, timeout: float
    ) -> None:
        stub = health_pb2_grpc.HealthStub(endpoint.channel)
        request = health_pb2.HealthCheckRequest(service=self.health_service)
        while True:
            endpoint.recheck.clear()
            healthy = await self._check(stub, request, timeout)
            first = index not in self._checked
            self._checked.add(index)
            self._set_health(endpoint, healthy)
            if first and endpoint.healthy is healthy:
                # Wake first_checks_done even when the first result changed nothing.
                self._notify()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(endpoint.recheck.wait(), interval)

    @staticmethod
    async def _check(
        stub: health_pb2_grpc.HealthStub, request: health_pb2.HealthCheckRequest, timeout: float
    ) -> bool:
        try:
            reply = await stub.Check(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            # It answered, just without a health service: reachable is all we can learn.
            return exc.code() is grpc.StatusCode.UNIMPLEMENTED
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        """Stop the health checks and close every channel (in-flight calls are cancelled)."""
        for task in self._checks:
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        self._checks.clear()
        for endpoint in self.endpoints:
            await endpoint.channel.close()


def tie_readiness(health: ServingHealth, clients: Sequence[StageClient[Any]]) -> None:
    """Make ``health``'s services report NOT_SERVING while no replica of a stage among
    ``clients`` passes its health checks (dependency ``"<stage> stage"``), SERVING again when one
    does. Clients of the same stage (the talkers of several models) count together: the stage is
    available while any of them is reachable."""
    by_stage: dict[str, list[StageClient[Any]]] = {}
    for client in clients:
        by_stage.setdefault(client.stage, []).append(client)
    for stage, group in by_stage.items():
        name = f"{stage} stage"

        def reachable(group: list[StageClient[Any]] = group) -> bool:
            return any(c.reachable for c in group)

        def update(reachable: Callable[[], bool] = reachable, name: str = name) -> None:
            now = reachable()
            if now != (name not in health.unmet_dependencies):
                logger.warning(
                    "readiness: %s %s",
                    name,
                    "reachable again" if now else "has no reachable replica: NOT_SERVING",
                )
            health.set_dependency(name, now)

        health.set_dependency(name, reachable())
        for client in group:
            client.add_listener(update)


__all__ = ["Endpoint", "StageClient", "is_target_uri", "tie_readiness", "uri_service_config"]
