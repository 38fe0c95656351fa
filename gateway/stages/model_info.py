"""The talker's model info as the gateway knows it: fetched at startup (the gateway reports
NOT_SERVING until the talker answers), cached, and refreshed when older than a TTL or after a
talker failure (a restarted talker may serve another model)."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc

from .errors import StageError
from .routing import StageClient

logger = logging.getLogger(__name__)

REFRESH_TIMEOUT_S = 3.0
"""Deadline of a refresh while serving (the cached copy is used if it fails)."""
STARTUP_PROBE_TIMEOUT_S = 5.0
"""Deadline of each startup probe."""


class TalkerInfoCache:
    """``Talker.GetModelInfo``, cached (see the module doc)."""

    def __init__(
        self,
        talker: StageClient[stages_pb2_grpc.TalkerStub],
        *,
        ttl_seconds: float,
        refresh_timeout_seconds: float = REFRESH_TIMEOUT_S,
    ) -> None:
        self._talker = talker
        self._ttl = ttl_seconds
        self._refresh_timeout = refresh_timeout_seconds
        self._info: stages_pb2.TalkerInfo | None = None
        self._fetched_at = 0.0
        self._stale = True
        self._lock = asyncio.Lock()

    async def wait_until_available(self, timeout_seconds: float = 0.0) -> stages_pb2.TalkerInfo:
        """Probe until the talker answers (``timeout_seconds`` 0 = forever; RuntimeError after it)."""
        started = time.monotonic()
        delay = 0.25
        targets = ", ".join(self._talker.targets)
        while True:
            try:
                return await self._fetch(STARTUP_PROBE_TIMEOUT_S, wait_for_ready=True)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
                waited = time.monotonic() - started
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "timeout"
                if timeout_seconds and waited >= timeout_seconds:
                    raise RuntimeError(
                        f"talker {targets} not reachable after {waited:.0f} s: {detail}"
                    ) from exc
                logger.warning("waiting for the talker at %s (%.0f s): %s", targets, waited, detail)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _fetch(self, timeout: float, *, wait_for_ready: bool = False) -> stages_pb2.TalkerInfo:
        with self._talker.lease() as endpoint:
            info: stages_pb2.TalkerInfo = await endpoint.stub.GetModelInfo(
                stages_pb2.GetModelInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
            )
        self._info, self._fetched_at, self._stale = info, time.monotonic(), False
        return info

    @property
    def cached(self) -> stages_pb2.TalkerInfo | None:
        """The last info fetched (None before the first), however old."""
        return self._info

    def invalidate(self) -> None:
        """Re-fetch before the next request (e.g. after a talker failure)."""
        self._stale = True

    def _fresh(self) -> stages_pb2.TalkerInfo | None:
        if self._stale or time.monotonic() - self._fetched_at >= self._ttl:
            return None
        return self._info

    async def get(self) -> stages_pb2.TalkerInfo:
        """The cached info, refreshed when stale; if the refresh fails the cached copy is used
        (UNAVAILABLE naming the talker if there is none)."""
        if (info := self._fresh()) is not None:
            return info
        async with self._lock:
            if (info := self._fresh()) is not None:
                return info  # refreshed by a concurrent request
            try:
                return await self._fetch(self._refresh_timeout)
            except grpc.aio.AioRpcError as exc:
                if self._info is None:
                    raise StageError.from_rpc_error("talker", exc) from exc
                logger.warning("model info refresh failed (using the cached copy): %s", exc.details())
                self._fetched_at = time.monotonic()  # retry after the TTL, not on every request
                return self._info
