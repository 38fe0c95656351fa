"""Issue 23's done-when, through the gateway: two gateways, each over its own (fake) stages, share
one PostgreSQL voice library (the machine's server, a schema of each test's own; skipped, saying
why, only where no server answers).

* A voice registered through gateway 1 synthesizes through gateway 2 at once; deleted through 2,
  it is NOT_FOUND through 1 within one second; 50 concurrent registrations through both give 50
  distinct voices, listed by either.
* With API keys: key B gets NOT_FOUND for key A's voice on use, get and delete and does not list
  it, over gRPC and HTTP (the ``openai`` SDK), through the other gateway; the admin key sees it.
* Killing the database (a throwaway server) mid-registration through a gateway loses no
  acknowledged voice and answers UNAVAILABLE for the registrations it did not acknowledge.

The stages are fakes (``tests/helpers/fake_stages.py``): the point is the gateways and their
shared library, and fakes keep this fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.helpers.crash import register_across_a_crash
from tests.helpers.fake_stages import Harness, expect_rpc_error, run
from tests.helpers.postgres import (
    ThrowawayPostgres,
    drop_schema,
    new_schema_name,
    shared_postgres_unreachable,
    shared_postgres_url,
    throwaway_unavailable,
)
from tests.helpers.voices import fake_embedding
from tts_common.pb.qwen3tts.v1 import tts_pb2

KEY_A, KEY_B, ADMIN = "key-alice-0123456789", "key-bob-0123456789", "key-admin-0123456789"


def wav(seed: int) -> bytes:
    """A distinct reference recording per seed (so the fake speaker gives distinct embeddings)."""
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    sf.write(out, (rng.standard_normal(8000) * 0.1).astype(np.float32), 16000, format="WAV")
    return out.getvalue()


def registration(seed: int, name: str = "") -> tts_pb2.RegisterVoiceRequest:
    return tts_pb2.RegisterVoiceRequest(
        name=name or f"voice {seed}", reference=tts_pb2.VoiceClone(ref_audio=wav(seed), x_vector_only=True)
    )


def as_key(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


@pytest.fixture
def database() -> Iterator[tuple[str, str]]:
    """(URL, schema) of a PostgreSQL schema of the test's own on the machine's server."""
    reason = shared_postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    url, schema = shared_postgres_url(), new_schema_name()
    try:
        yield url, schema
    finally:
        asyncio.run(drop_schema(url, schema))


@contextlib.asynccontextmanager
async def two_gateways(url: str, schema: str, **config: Any) -> AsyncIterator[tuple[Harness, Harness]]:
    """Two gateways, each over its own fake stages, sharing the library at ``url``/``schema``."""
    async with contextlib.AsyncExitStack() as stack:
        gateways = [
            await stack.enter_async_context(Harness("base", voices_db=url, voices_db_schema=schema, **config))
            for _ in range(2)
        ]
        yield gateways[0], gateways[1]


def test_two_gateways_share_one_postgres_voice_library(database: tuple[str, str]) -> None:
    url, schema = database

    async def main() -> None:
        async with two_gateways(url, schema) as (one, two):
            # registered through 1, spoken through 2 at once
            voice = await one.stub.RegisterVoice(registration(1))
            await two.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice.voice_id))
            sent = two.talker.requests[-1]
            assert np.array(sent.speaker_embedding, np.float32).tobytes() == fake_embedding(wav(1)).tobytes()
            assert not two.speaker.requests  # gateway 2 embedded nothing: it read the library
            assert (await two.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=voice.voice_id))) == voice

            # deleted through 2, NOT_FOUND through 1 within one second
            await two.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=voice.voice_id))
            deleted_at = time.monotonic()
            while True:
                call = one.stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice.voice_id))
                try:
                    err = await expect_rpc_error(call)
                except AssertionError:  # still spoken: only allowed within the second
                    assert time.monotonic() - deleted_at < 1.0, "gateway 1 still speaks a deleted voice"
                    await asyncio.sleep(0.05)
                    continue
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
                break
            assert time.monotonic() - deleted_at < 1.0
            err = await expect_rpc_error(one.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=voice.voice_id)))
            assert err.code() == grpc.StatusCode.NOT_FOUND

            # 50 concurrent registrations through both: 50 distinct voices, listed by either
            registered = await asyncio.gather(
                *(
                    (one if seed % 2 else two).stub.RegisterVoice(registration(seed))
                    for seed in range(100, 150)
                )
            )
            ids = {v.voice_id for v in registered}
            assert len(ids) == 50
            for gateway in (one, two):
                listed = await gateway.stub.ListVoices(tts_pb2.ListVoicesRequest())
                assert {v.voice_id for v in listed.voices} == ids and not listed.next_page_token
            for voice in registered[:3]:  # each is spoken by the gateway that did not register it
                await one.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice.voice_id))
                await two.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice.voice_id))

    run(main(), timeout=90)


def test_api_keys_own_their_voices_across_gateways_over_grpc_and_http(database: tuple[str, str]) -> None:
    url, schema = database
    keys = {"api_keys": frozenset({KEY_A, KEY_B}), "voices_admin_keys": frozenset({ADMIN})}

    async def main() -> None:
        async with two_gateways(url, schema, http=True, **keys) as (one, two):
            voice = await one.stub.RegisterVoice(registration(1, "alice's"), metadata=as_key(KEY_A))
            voice_id = voice.voice_id
            use = tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice_id)
            await two.synthesize(use, metadata=as_key(KEY_A))  # the owner, through the other gateway

            # key B, over gRPC, through gateway 2: use, get and delete are NOT_FOUND; not listed
            for call in (
                two.stub.Synthesize(use, metadata=as_key(KEY_B)),
                two.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=voice_id), metadata=as_key(KEY_B)),
                two.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=voice_id), metadata=as_key(KEY_B)),
            ):
                err = await expect_rpc_error(call)
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
            listed = await two.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=as_key(KEY_B))
            assert voice_id not in [v.voice_id for v in listed.voices]

            # key B, over HTTP with the openai SDK, through gateway 2
            bob = openai.AsyncOpenAI(base_url=two.http_url + "/v1", api_key=KEY_B, max_retries=0, timeout=20)
            admin = openai.AsyncOpenAI(
                base_url=two.http_url + "/v1", api_key=ADMIN, max_retries=0, timeout=20
            )
            two.cleanups += [bob.close, admin.close]
            with pytest.raises(openai.NotFoundError, match="unknown voice_id"):
                await bob.audio.speech.create(
                    model=two.model_name, input="Hi.", voice=voice_id, response_format="pcm"
                )
            with pytest.raises(openai.NotFoundError, match="unknown voice_id"):
                await bob.get(f"/audio/voices/{voice_id}", cast_to=object)
            with pytest.raises(openai.NotFoundError, match="unknown voice_id"):
                await bob.audio.voices.delete(voice_id)
            listing: Any = await bob.get("/audio/voices", cast_to=object)
            assert voice_id not in [v["id"] for v in listing["data"]]

            # the admin key sees, uses and reads it, over both
            listed = await two.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=as_key(ADMIN))
            assert voice_id in [v.voice_id for v in listed.voices]
            assert (
                await two.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=voice_id), metadata=as_key(ADMIN))
                == voice
            )
            await two.synthesize(use, metadata=as_key(ADMIN))
            listing = await admin.get("/audio/voices", cast_to=object)
            assert voice_id in [v["id"] for v in listing["data"]]
            await admin.audio.speech.create(
                model=two.model_name, input="Hi.", voice=voice_id, response_format="pcm"
            )
            seen: Any = await admin.get(f"/audio/voices/{voice_id}", cast_to=object)
            assert seen["owner"] == voice.owner
            # and the owner's deletion through gateway 2 is seen by gateway 1
            await admin.audio.voices.delete(voice_id)
            err = await expect_rpc_error(one.stub.Synthesize(use, metadata=as_key(KEY_A)))
            assert err.code() == grpc.StatusCode.NOT_FOUND

    run(main(), timeout=90)


WRITERS = 4
TIMEOUT_S = 2.0


def test_killing_the_database_mid_registration_loses_no_acknowledged_voice() -> None:
    reason = throwaway_unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = ThrowawayPostgres()
    try:
        server.start()
        run(registrations_across_a_crash(server), timeout=120)
    finally:
        server.remove()


async def registrations_across_a_crash(server: ThrowawayPostgres) -> None:
    async with Harness("base", voices_db=server.url, voices_db_timeout=TIMEOUT_S, max_voices=100_000) as h:

        async def register(seed: int) -> tuple[str, bytes]:
            voice = await h.stub.RegisterVoice(registration(seed), timeout=30)
            return voice.voice_id, fake_embedding(wav(seed)).tobytes()

        report = await register_across_a_crash(
            server, register, grpc.aio.AioRpcError, writers=WRITERS, timeout_s=TIMEOUT_S
        )
        acknowledged = report.acknowledged
        # every registration the crash interrupted reported UNAVAILABLE, with the retry hint
        assert len(report.failures) == WRITERS and report.in_flight_at_crash > 0
        for failure in report.failures:
            assert isinstance(failure, grpc.aio.AioRpcError)
            assert failure.code() == grpc.StatusCode.UNAVAILABLE, failure
            assert ("retry-after", "1") in tuple(failure.trailing_metadata() or ())

        # after recovery, through the same gateway: every acknowledged voice, bit for bit
        await asyncio.to_thread(server.start)
        stored: set[str] = set()
        token = ""
        while True:
            page = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(page_token=token))
            stored |= {v.voice_id for v in page.voices}
            token = page.next_page_token
            if not token:
                break
        missing = set(acknowledged) - stored
        assert not missing, f"{len(missing)} acknowledged voice(s) lost"
        assert len(stored - set(acknowledged)) <= report.in_flight_at_crash  # committed, answer lost
        for voice_id, embedding in list(acknowledged.items())[:5]:
            await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice_id))
            assert np.array(h.talker.requests[-1].speaker_embedding, np.float32).tobytes() == embedding
