"""One stage's side of a :class:`~gateway.stages.pipeline.SynthesisPipeline`: its current stream
call, the replica serving it (a :class:`~gateway.stages.routing.StageClient`'s, or the one stub
given), the replicas that failed it, and the :class:`StageError` a failed call means: the stage's
own status, which grpc's failed send can hide (:meth:`StageCall.error`, grpc/grpc#36066)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import grpc

from .errors import LOCAL_SEND_FAILURE, StageError
from .routing import Endpoint, StageClient

StubT = TypeVar("StubT")

SEND_FAILURE_SETTLE_S = 1.0
"""How long a stage call that grpc could not send a message on, and that had no status of its
own yet, may take to report the stage's status (:meth:`StageCall.error`)."""


class PinnedStub(Generic[StubT]):
    """A bare stub handed to a pipeline (its interface before failover existed):
    the one replica there is, with nothing to fail over to."""

    def __init__(self, stage: str, stub: StubT) -> None:
        self.stage = stage
        # The channel is never looked at: only StageClient checks connectivity.
        self._endpoint = Endpoint(f"{stage} (stub)", cast(grpc.aio.Channel, None), stub)

    def acquire(self) -> Endpoint[StubT]:
        return self._endpoint

    def release(self, endpoint: Endpoint[StubT]) -> None:
        pass

    def mark_failed(self, endpoint: Endpoint[StubT]) -> None:
        pass

    async def acquire_replacement(self, failed: Sequence[Endpoint[StubT]], timeout: float) -> None:
        return None


def stage_replicas(stage: str, given: StageClient[StubT] | StubT) -> StageClient[StubT] | PinnedStub[StubT]:
    """The replicas of ``stage``: a StageClient as given, a bare stub pinned."""
    return given if isinstance(given, StageClient) else PinnedStub(stage, given)


def _status_now(call: grpc.aio.StreamStreamCall) -> tuple[grpc.StatusCode, str] | None:
    """``call``'s status as grpc.aio holds it now, read without yielding to the event loop (its
    ``code()`` and ``details()`` return without waiting when it has one); None while it has none."""
    status: list[Any] = []
    for read in (call.code, call.details):
        coroutine = read()
        try:
            coroutine.send(None)
        except StopIteration as done:
            status.append(done.value)
            continue
        except Exception:  # noqa: BLE001 - called from grpc's done callbacks: never raise there
            return None
        coroutine.close()  # it would wait: no status yet
        return None
    return status[0], status[1]


def _is_local_send_failure(code: grpc.StatusCode, details: str) -> bool:
    return code is grpc.StatusCode.INTERNAL and details == LOCAL_SEND_FAILURE


@dataclass(eq=False)
class StageCall(Generic[StubT]):
    """The current call of one stage for a stream, its replica, and the replicas that failed it."""

    stage: str
    client: StageClient[StubT] | PinnedStub[StubT]
    endpoint: Endpoint[StubT] | None = None
    call: grpc.aio.StreamStreamCall | None = None
    generation: int = 0
    """Bumped by every new call (the first one included)."""
    failed: list[Endpoint[StubT]] = field(default_factory=list)
    failovers: int = 0
    first_status: tuple[grpc.aio.StreamStreamCall, grpc.StatusCode, str] | None = None
    """The status the latest call ended with first (see :meth:`error`), and that call."""

    def replace(self, endpoint: Endpoint[StubT], call: grpc.aio.StreamStreamCall) -> None:
        self.drop()
        self.endpoint, self.call = endpoint, call
        self.generation += 1
        call.add_done_callback(self._ended)

    def _ended(self, call: grpc.aio.StreamStreamCall) -> None:
        # grpc.aio runs a call's done callbacks once, when its first status is set.
        status = _status_now(call)
        if status is not None:
            self.first_status = (call, *status)

    async def error(
        self, call: grpc.aio.StreamStreamCall, exc: grpc.aio.AioRpcError | None = None
    ) -> StageError:
        """The StageError of ``call``, which failed with ``exc`` (None: it ended, with the
        non-OK status it holds).

        grpc/grpc#36066: where grpc.aio's client cannot send a message into a call the stage has
        just ended (e.g. text still streamed to a talker that rejected the request), its
        ``_write`` gives the call a status of its own, INTERNAL "Internal error from Core"
        (``set_internal_error``), over the stage's status if that already arrived; the write and
        every later read report it. Taken for a broken connection (``StageError.from_rpc_error``),
        a stage's verdict would be failed over to another replica (a healthy one marked failed,
        the request run again) and reach the client as UNAVAILABLE. So the stage's own status is
        used: the call's first one (its done callback records it; a replica that died gives
        UNAVAILABLE there, and fails over), or else the one that replaces grpc's within
        :data:`SEND_FAILURE_SETTLE_S` (the stage's status arriving after the failed send). Where
        none comes, the stage said nothing to go by: UNAVAILABLE, not failed over."""
        if exc is None:
            code, details, debug = await call.code(), await call.details(), await call.debug_error_string()
        else:
            code, details, debug = exc.code(), exc.details() or "", exc.debug_error_string()
        if _is_local_send_failure(code, details):
            status = await self._status_sent(call)
            if status is None:
                return StageError(
                    self.stage,
                    grpc.StatusCode.UNAVAILABLE,
                    f"sending to it failed and it sent no status ({debug})",
                    connection_failure=False,
                )
            code, details = status
            if code is grpc.StatusCode.OK:
                return StageError(self.stage, grpc.StatusCode.UNAVAILABLE, "the call ended early")
        return StageError(self.stage, code, details or code.name)

    async def _status_sent(self, call: grpc.aio.StreamStreamCall) -> tuple[grpc.StatusCode, str] | None:
        """The status the stage ended ``call`` with, not grpc's own (see :meth:`error`)."""
        deadline = time.monotonic() + SEND_FAILURE_SETTLE_S
        while True:
            first = self.first_status
            if first is not None and first[0] is call and not _is_local_send_failure(*first[1:]):
                return first[1], first[2]
            code, details = await call.code(), await call.details()
            if not _is_local_send_failure(code, details):
                return code, details
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.01)

    def drop(self) -> None:
        """Cancel the current call (if still running) and end its replica's in-flight count."""
        if self.call is not None and not self.call.done():
            self.call.cancel()
        if self.endpoint is not None:
            self.client.release(self.endpoint)
            self.endpoint = None


__all__ = ["SEND_FAILURE_SETTLE_S", "PinnedStub", "StageCall", "stage_replicas"]
