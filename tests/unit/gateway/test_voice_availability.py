"""A voice database that cannot answer, seen through the gateway: the gateway starts and stays
SERVING, preset speakers (and every synthesis without a registered voice) keep working, voice
calls answer UNAVAILABLE with a retry hint (gRPC trailing metadata ``retry-after``, HTTP 503 with
``Retry-After``) within the library's timeout, never a hang, and the library is started in the
background once the database answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.fake_stages import Harness, expect_rpc_error, run
from tests.helpers.stack import free_port
from tts_common.pb.qwen3tts.v1 import tts_pb2

MODELS = {"custom": "custom_voice", "base": "base"}
TIMEOUT_S = 0.5


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A port that accepts connections and never answers (a hung database)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()


async def check_voice_calls_unavailable(h: Harness) -> None:
    """Every voice call answers UNAVAILABLE with ``retry-after`` within the timeout."""
    calls = {
        "ListVoices": lambda: h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="base")),
        "GetVoice": lambda: h.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id="voice-" + "1" * 32)),
        "RegisterVoice": lambda: h.stub.RegisterVoice(
            tts_pb2.RegisterVoiceRequest(
                model="base", reference=tts_pb2.VoiceClone(ref_audio=b"RIFF", x_vector_only=True)
            )
        ),
        "Synthesize": lambda: h.stub.Synthesize(
            tts_pb2.SynthesizeRequest(model="base", text="Hi", voice_id="voice-" + "1" * 32)
        ),
    }
    for name, call in calls.items():
        started = time.monotonic()
        err = await expect_rpc_error(call())
        took = time.monotonic() - started
        assert err.code() == grpc.StatusCode.UNAVAILABLE, (name, err)
        assert "voice store unavailable" in err.details() and "retry in" in err.details(), err.details()
        assert ("retry-after", "1") in tuple(err.trailing_metadata() or ()), name
        assert took < TIMEOUT_S + 3.0, (name, took)  # bounded by the library's timeout, not a hang
    assert not h.speakers["base"].requests  # a registration fails before the speaker stage


async def check_synthesis_without_registered_voices(h: Harness) -> None:
    await h.synthesize(tts_pb2.SynthesizeRequest(model="custom", text="Hi", speaker="ryan"))
    listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="custom"))  # no family: no database
    assert [s.name for s in listed.speakers] == ["vivian", "ryan", "eric"]
    health = health_pb2_grpc.HealthStub(h.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("database", ["refused", "silent"])
def test_a_database_that_cannot_answer_never_stops_synthesis(database: str) -> None:
    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            if database == "refused":
                port = free_port()  # nothing listens there
            else:
                port = await stack.enter_async_context(silent_server())
            h = await stack.enter_async_context(
                Harness(
                    models=MODELS,
                    http=True,
                    voices_db=f"postgresql://postgres@127.0.0.1:{port}/voices",
                    voices_db_timeout=TIMEOUT_S,
                )
            )
            h.gateway.tie_readiness(h.health)
            await check_synthesis_without_registered_voices(h)
            await check_voice_calls_unavailable(h)
            sdk = openai.AsyncOpenAI(base_url=h.http_url + "/v1", api_key="unused", max_retries=0, timeout=20)
            h.cleanups.append(sdk.close)
            speech = await sdk.audio.speech.create(
                model="custom", input="Hi.", voice="ryan", response_format="pcm"
            )
            assert speech.content
            with pytest.raises(openai.APIStatusError) as refused:
                await sdk.get("/audio/voices", cast_to=object, options={"params": {"model": "base"}})
            assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "1"
            assert refused.value.response.json()["error"]["code"] == "unavailable"

    run(main(), timeout=60)


def test_the_library_starts_in_the_background_once_the_database_answers(tmp_path: Path) -> None:
    """A SQLite file that cannot be opened at start (where its directory should be, there is a
    file): the gateway serves; once the directory can be made, the next voice call works and the
    background start completes."""
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")

    async def main() -> None:
        async with Harness(
            models=MODELS, voices_db=str(blocker / "voices.db"), voices_db_timeout=TIMEOUT_S
        ) as h:
            await check_synthesis_without_registered_voices(h)
            err = await expect_rpc_error(h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="base")))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert not h.gateway.library_host.ready
            blocker.unlink()
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="base"))
            assert not listed.voices
            for _ in range(100):  # the background start follows (its first pause: 1 s)
                if h.gateway.library_host.ready:
                    break
                await asyncio.sleep(0.05)
            assert h.gateway.library_host.ready

    run(main(), timeout=30)
