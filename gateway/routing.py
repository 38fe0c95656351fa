"""Channels from the gateway to the stage processes.

A :class:`StageClient` holds one grpc.aio channel per target of a stage and hands out stubs:

* a list of ``host:port`` targets gets one channel each; :meth:`StageClient.lease` picks the
  endpoint with the fewest requests this gateway has in flight on it, round-robin among ties,
  skipping channels in TRANSIENT_FAILURE while a healthier one exists (so a dead replica is
  avoided without waiting for a health check);
* a single target URI (``dns:///talker:50052``, ``ipv4:...``, ``unix:...``) gets one channel with
  gRPC's ``round_robin`` load-balancing policy: gRPC resolves the name and spreads calls over
  every address (re-resolving as replicas come and go), per call for unary RPCs and per stream
  for streaming ones.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

logger = logging.getLogger(__name__)

StubT = TypeVar("StubT")

_URI_PREFIXES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:")


def is_target_uri(target: str) -> bool:
    """Whether ``target`` is a gRPC name-resolver URI rather than a plain ``host:port``."""
    return "://" in target or target.startswith(_URI_PREFIXES)


@dataclass
class Endpoint(Generic[StubT]):
    """One channel of a stage with its stub and this gateway's in-flight count on it."""

    target: str
    channel: grpc.aio.Channel
    stub: StubT
    in_flight: int = 0

    def state(self) -> grpc.ChannelConnectivity:
        """Current connectivity (does not trigger a connection attempt)."""
        return self.channel.get_state(try_to_connect=False)


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
    ) -> None:
        """Create the channels (call from a coroutine: grpc.aio channels bind to the running
        loop). ``targets``: one URI or any number of ``host:port``."""
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
        self._rr = itertools.count()
        self.endpoints: list[Endpoint[StubT]] = []
        for target in targets:
            opts = list(options)
            if is_target_uri(target):
                opts.append(("grpc.lb_policy_name", "round_robin"))
            channel = (
                grpc.aio.secure_channel(target, credentials, options=opts)
                if credentials is not None
                else grpc.aio.insecure_channel(target, options=opts)
            )
            self.endpoints.append(Endpoint(target, channel, stub_factory(channel)))

    def _choose(self) -> Endpoint[StubT]:
        n = len(self.endpoints)
        if n == 1:
            return self.endpoints[0]
        start = next(self._rr) % n
        ordered = self.endpoints[start:] + self.endpoints[:start]
        healthy = [e for e in ordered if e.state() is not grpc.ChannelConnectivity.TRANSIENT_FAILURE]
        candidates = healthy or ordered
        return min(candidates, key=lambda e: e.in_flight)  # min keeps the first of ties

    @contextlib.contextmanager
    def lease(self) -> Iterator[Endpoint[StubT]]:
        """An endpoint to run one request on, counted as in flight while the block runs."""
        endpoint = self._choose()
        endpoint.in_flight += 1
        try:
            yield endpoint
        finally:
            endpoint.in_flight -= 1

    @property
    def in_flight(self) -> int:
        """Requests this gateway has in flight on the stage (all endpoints)."""
        return sum(e.in_flight for e in self.endpoints)

    async def close(self) -> None:
        """Close every channel (in-flight calls are cancelled)."""
        for endpoint in self.endpoints:
            await endpoint.channel.close()


__all__ = ["Endpoint", "StageClient", "is_target_uri"]
