"""A stage's verdict that ends its call while the gateway still writes into it (grpc/grpc#36066).

grpc.aio's client answers a message grpc-core could not send into an ended call with a status of
its own, INTERNAL "Internal error from Core" (``_StreamRequestMixin._write`` ->
``set_internal_error``), over the status the stage had sent: the gateway, still streaming text
to a talker that rejected it, read that instead of the talker's verdict, took it for a broken
connection, failed over (a healthy replica marked failed, the request generated again) and told
the client UNAVAILABLE. The gateway now reports the status the stage sent
(``gateway.stages.stage_call.StageCall.error``).

Unwidened the race went wrong in about 95 of 100 pipelines and 1 in 6 StreamingSynthesize calls.
:func:`writes_racing_the_talkers_end` makes it happen every time, in the order that loses the
talker's status: the fake talker (``hold_reject``) ends the call only once the gateway writes the
next text message, whose send is held until the talker's status has arrived (grpc-core then fails
it and ``_write`` overwrites the status), and the talker call's end of responses reaches the
gateway's reader only after that. It wraps grpc.aio's private Cython call, for these tests only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc.aio import _call as aio_call

from gateway.config import FailoverPolicy
from gateway.stages import stage_call
from gateway.stages.errors import LOCAL_SEND_FAILURE
from gateway.stages.pipeline import StageError, SynthesisPipeline
from gateway.stages.stage_call import PinnedStub, StageCall
from tests.helpers.fake_stages import FakeTalker, Harness, expect_streaming_error, run
from tests.unit.gateway.test_failover import Replicas, _failovers
from tests.unit.gateway.test_streaming_synthesize import config, text
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2


class _SendsAfterTheEnd:
    """Stands in for a talker call's Cython call (``call._cython_call``). Once :attr:`armed`,
    a message is sent only after the call's status has arrived, and the end of the responses
    reaches the reader only after that send failed."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.armed = False
        self.send_failed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def send_serialized_message(self, message: bytes) -> None:
        if not self.armed:
            return await self._real.send_serialized_message(message)
        await self._real.status()  # the talker's status arrives while the message is on its way
        try:
            await self._real.send_serialized_message(message)  # grpc-core fails it
        finally:
            self.send_failed.set()  # the reader resumes after _write's set_internal_error

    async def receive_serialized_message(self) -> Any:
        message = await self._real.receive_serialized_message()
        if message is grpc.aio.EOF and self.armed:
            await self.send_failed.wait()
        return message


@contextlib.contextmanager
def writes_racing_the_talkers_end(talker: FakeTalker) -> Iterator[list[grpc.aio.StreamStreamCall]]:
    """Make the gateway's next write after an AppendText "talker-reject" race the talker's end
    of the call (see the module doc); yields the talker calls, once made."""
    release = talker.hold_reject = asyncio.Event()
    calls: list[grpc.aio.StreamStreamCall] = []
    original = aio_call._StreamRequestMixin._write

    async def write(self: Any, request: Any) -> None:
        if not isinstance(request, stages_pb2.TalkerClientMessage):
            return await original(self, request)
        if not isinstance(self._cython_call, _SendsAfterTheEnd):  # the request: nothing read yet
            self._cython_call = _SendsAfterTheEnd(self._cython_call)
            calls.append(self)
        wrapped = self._cython_call
        if wrapped.armed:
            release.set()  # the talker ends the call, with this message on its way
        await original(self, request)
        if "talker-reject" in request.append_text.text:
            wrapped.armed = True

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(aio_call._StreamRequestMixin, "_write", write)
        yield calls


async def _lost_status(call: grpc.aio.StreamStreamCall) -> bool:
    """Whether grpc replaced the talker's status with its own (the race went the bad way)."""
    return await call.code() is grpc.StatusCode.INTERNAL and await call.details() == LOCAL_SEND_FAILURE


def test_a_talker_verdict_while_text_streams_is_not_failed_over() -> None:
    async def main() -> None:
        async def text_messages() -> AsyncIterator[stages_pb2.TalkerClientMessage]:
            for piece in ("talker-reject ", "and more "):
                yield stages_pb2.TalkerClientMessage(append_text=stages_pb2.AppendText(text=piece))
            yield stages_pb2.TalkerClientMessage(end_text=stages_pb2.EndText())

        before = _failovers("talker", "ok")
        async with Replicas() as stack:
            pipeline = SynthesisPipeline(
                stack.talker,
                stack.decoder,
                stages_pb2.TalkerRequest(request_id="req-r", text_open=True),
                stages_pb2.DecodeStart(request_id="req-r"),
                failover=FailoverPolicy(attempts=2, wait_seconds=2.0),
                text=text_messages(),
            )
            busy = stack.talkers[0]  # the first of equally loaded replicas takes the call
            with writes_racing_the_talkers_end(busy) as calls, pytest.raises(StageError) as info:
                async with pipeline:
                    await pipeline.start()
                    async for _ in pipeline.pcm_chunks():
                        pass
            assert len(calls) == 1 and await _lost_status(calls[0])
            error = info.value
            assert error.stage == "talker" and error.code is grpc.StatusCode.INVALID_ARGUMENT
            assert not error.connection_failure
            assert str(error) == "talker stage: fake talker rejects this"
            assert pipeline.failovers == {"talker": 0, "decoder": 0}
            assert [len(t.requests) for t in stack.talkers] == [1, 0]
            assert all(e.healthy is not False for e in stack.talker.endpoints)  # none marked failed
        assert _failovers("talker", "ok") == before

    run(main())


def test_streaming_synthesize_reports_the_talkers_verdict_given_while_text_streams() -> None:
    async def main() -> None:
        # The talker's first frame would take 10 s: its call ends before it sends any.
        async with Harness(frames=3, delay=10.0) as h:
            messages = [config(), text("Hello "), text("talker-reject "), text("more text.")]
            with writes_racing_the_talkers_end(h.talker) as calls:
                error = await expect_streaming_error(h, messages)
            assert len(calls) == 1 and await _lost_status(calls[0])
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert error.details() == "talker stage: fake talker rejects this"
            assert len(h.talker.requests) == 1  # not generated again

    run(main())


class _Call:
    """A stream call whose status the test sets (grpc.aio's order: done callbacks run once, on
    the first status)."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None
        self.callbacks: list[Any] = []

    def set_status(self, code: grpc.StatusCode, details: str) -> None:
        first, self.status = self.status is None, (code, details)
        if first:
            for callback in self.callbacks:
                callback(self)

    def add_done_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def done(self) -> bool:
        return self.status is not None

    def cancel(self) -> bool:
        return False

    async def code(self) -> grpc.StatusCode:
        assert self.status is not None
        return self.status[0]

    async def details(self) -> str:
        assert self.status is not None
        return self.status[1]

    async def debug_error_string(self) -> str:
        return "debug"


def _local_send_failure() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), LOCAL_SEND_FAILURE, "debug"
    )


def test_the_stages_status_is_found_in_every_order_and_none_is_not_a_failover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stage's status set first and then replaced by grpc's (the order seen in practice),
    grpc's first and the stage's a moment later, or none at all."""
    monkeypatch.setattr(stage_call, "SEND_FAILURE_SETTLE_S", 0.2)

    async def main() -> None:
        side: StageCall[Any] = StageCall("talker", PinnedStub("talker", object()))
        endpoint = side.client.acquire()

        call = _Call()
        side.replace(endpoint, call)  # type: ignore[arg-type]
        call.set_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "talker queue full")
        call.set_status(grpc.StatusCode.INTERNAL, LOCAL_SEND_FAILURE)
        error = await side.error(call, _local_send_failure())  # type: ignore[arg-type]
        assert (error.code, error.details, error.connection_failure) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "talker queue full",
            False,
        )
        own = await side.error(call)  # type: ignore[arg-type]  # the status the call holds now
        assert own.code is grpc.StatusCode.RESOURCE_EXHAUSTED

        later = _Call()
        side.replace(endpoint, later)  # type: ignore[arg-type]
        later.set_status(grpc.StatusCode.INTERNAL, LOCAL_SEND_FAILURE)
        asyncio.get_running_loop().call_later(
            0.05, later.set_status, grpc.StatusCode.FAILED_PRECONDITION, "EndText twice"
        )
        error = await side.error(later, _local_send_failure())  # type: ignore[arg-type]
        assert (error.code, error.details) == (grpc.StatusCode.FAILED_PRECONDITION, "EndText twice")

        broken = _Call()
        side.replace(endpoint, broken)  # type: ignore[arg-type]
        broken.set_status(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        broken.set_status(grpc.StatusCode.INTERNAL, LOCAL_SEND_FAILURE)
        error = await side.error(broken, _local_send_failure())  # type: ignore[arg-type]
        assert error.code is grpc.StatusCode.UNAVAILABLE and error.connection_failure  # fails over

        silent = _Call()
        side.replace(endpoint, silent)  # type: ignore[arg-type]
        silent.set_status(grpc.StatusCode.INTERNAL, LOCAL_SEND_FAILURE)
        error = await side.error(silent, _local_send_failure())  # type: ignore[arg-type]
        assert error.code is grpc.StatusCode.UNAVAILABLE and not error.connection_failure
        assert "the talker stage is unavailable" in str(error)

    run(main())
