"""Talker.Generate with incremental text (text_open + AppendText/EndText) over in-process gRPC:
the streamed call's codes equal the whole-text call's, TalkerDone reports the text wait, and
every out-of-order client message fails with FAILED_PRECONDITION and a precise message."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from talker_service.engine import EngineConfig
from talker_service.model import unicode_boundaries
from talker_service.server import TalkerServicer
from tests.helpers.fixtures import CKPT_DIR
from tts_common.codes import codes_from_proto
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2

Msg = stages_pb2.TalkerClientMessage
TEXT = "She said she would be here by noon."


def _request(text: str, text_open: bool) -> Msg:
    return Msg(
        request=stages_pb2.TalkerRequest(
            request_id="r",
            text=text,
            language="english",
            speaker="serena",
            text_feeding=tts_pb2.TEXT_FEEDING_STREAMING,
            sampling=tts_pb2.SamplingOptions(do_sample=False, subtalker_do_sample=False, max_new_tokens=10),
            text_open=text_open,
        )
    )


def _append(text: str) -> Msg:
    return Msg(append_text=stages_pb2.AppendText(text=text))


END = Msg(end_text=stages_pb2.EndText())


async def _call(stub, messages: list[Msg | float], hold_open: bool = False):
    """Run Generate with ``messages`` (a float = a pause in seconds); (frames, done, error)."""
    call = stub.Generate()
    frames: list[list[int]] = []
    done = None
    try:
        for message in messages:
            if isinstance(message, float):
                await asyncio.sleep(message)
            else:
                await call.write(message)
        if not hold_open:
            await call.done_writing()
        while (reply := await call.read()) is not grpc.aio.EOF:
            if reply.WhichOneof("message") == "chunk":
                frames += codes_from_proto(reply.chunk.codes).tolist()
            else:
                done = reply.done
    except grpc.aio.AioRpcError as exc:
        return frames, done, exc
    return frames, done, None


@pytest.fixture(scope="module")
def target():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    servicer = TalkerServicer(str(CKPT_DIR / "tiny_custom_voice"), EngineConfig(max_slots=2, max_seq_len=256))
    server: grpc.aio.Server | None = None

    async def start() -> int:
        nonlocal server
        server = grpc.aio.server()
        await servicer.load()
        stages_pb2_grpc.add_TalkerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return port

    port = loop.run_until_complete(start())
    yield loop, f"127.0.0.1:{port}"
    assert server is not None
    loop.run_until_complete(server.stop(None))
    loop.run_until_complete(servicer.close())
    loop.close()
    asyncio.set_event_loop(None)


def _run(target, messages, **kw):
    loop, address = target

    async def body():
        async with grpc.aio.insecure_channel(address) as channel:
            return await _call(stages_pb2_grpc.TalkerStub(channel), messages, **kw)

    return loop.run_until_complete(body())


def test_streamed_call_equals_whole_text_call(target):
    whole, whole_done, error = _run(target, [_request(TEXT, False)])
    assert error is None and whole_done is not None and whole
    deltas = [TEXT[:4], 0.2, TEXT[4:13], 0.3, TEXT[13:]]
    messages = [_request("", True), *[_append(d) if isinstance(d, str) else d for d in deltas], END]
    frames, done, error = _run(target, messages)
    assert error is None and done is not None
    assert frames == whole and done.frames == whole_done.frames
    assert done.finish_reason == whole_done.finish_reason
    assert done.stalled_frames >= 1 and done.text_wait_ms > 0  # the pauses outlasted its text


@pytest.mark.parametrize(
    "messages,hold_open,message",
    [
        ([_request(TEXT, False), _append("more")], False, "AppendText needs a TalkerRequest with text_open"),
        ([_request(TEXT, False), END], False, "EndText needs a TalkerRequest with text_open"),
        ([_request("Hi", True), END, _append("more")], False, "AppendText after EndText"),
        ([_request("Hi", True), END, END], False, "EndText was sent twice"),
        ([_request("Hi", True), _request("Hi", True)], False, "a second TalkerRequest"),
        ([_request("Hello there", True)], False, "closed its side before EndText"),
        ([_append("Hi")], False, "the first Generate message must be a TalkerRequest"),
        ([_request("", True), END], False, "text produced no tokens"),
    ],
)
def test_out_of_order_messages_fail_precisely(target, messages, hold_open, message):
    _, _, error = _run(target, messages, hold_open=hold_open)
    assert error is not None
    expected = (
        grpc.StatusCode.INVALID_ARGUMENT
        if message == "text produced no tokens"
        else grpc.StatusCode.FAILED_PRECONDITION
    )
    assert error.code() == expected, error
    assert message in error.details()


def test_load_builds_the_unicode_tables_off_the_engine_thread() -> None:
    """The composition tables (~0.5 s) are built by load, not by the first open text's engine
    step (which would stall every running stream)."""
    unicode_boundaries._composition_halves.cache_clear()
    servicer = TalkerServicer(str(CKPT_DIR / "tiny_custom_voice"), EngineConfig(max_slots=1, max_seq_len=64))
    asyncio.run(servicer.load())
    try:
        assert unicode_boundaries._composition_halves.cache_info().currsize == 1
    finally:
        asyncio.run(servicer.close())
