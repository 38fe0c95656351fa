"""Voices belong to the API key that registered them, over gRPC and HTTP alike (one gateway on
SQLite here; two gateways sharing PostgreSQL: ``tests/integration/test_voice_library.py``):
another key gets NOT_FOUND for the voice on use, get, update, export and delete and does not list
it; an admin key sees and manages every voice; the library keeps a keyed digest, never the key;
the WebSocket stream belongs to the key of its config message.
Also the HTTP voice routes (get, PATCH, export, import) and their OpenAPI schema."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import pytest
import soundfile as sf
from fastapi import FastAPI
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.transports.http.voices import voices_router
from gateway.voice_library import NO_KEYS
from tests.helpers.fake_stages import Harness, expect_rpc_error, run
from tts_common.pb.qwen3tts.v1 import tts_pb2

KEY_A, KEY_B, ADMIN = "key-alice-0123456789", "key-bob-0123456789", "key-admin-0123456789"


def wav() -> bytes:
    out = io.BytesIO()
    sf.write(out, np.sin(np.linspace(0, 600, 24000)).astype(np.float32) * 0.3, 24000, format="WAV")
    return out.getvalue()


def as_key(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def sdk(h: Harness, key: str) -> openai.AsyncOpenAI:
    client = openai.AsyncOpenAI(base_url=h.http_url + "/v1", api_key=key, max_retries=0, timeout=20)
    h.cleanups.append(client.close)
    return client


def owned_harness(tmp_path: Path, **config: Any) -> Harness:
    return Harness(
        "base",
        http=True,
        api_keys=frozenset({KEY_A, KEY_B}),
        voices_admin_keys=frozenset({ADMIN}),
        voices_db=str(tmp_path / "voices.db"),
        **config,
    )


async def send(client: openai.AsyncOpenAI, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """The status and JSON body of a request made through the SDK's own HTTP layer, for the
    routes the SDK has no call for (get, PATCH, export, import)."""
    kwargs: dict[str, Any] = {"cast_to": object}
    if body is not None:
        kwargs["body"] = body
    try:
        return 200, await getattr(client, method)(path, **kwargs)
    except openai.APIStatusError as exc:
        return exc.status_code, exc.response.json()


def assert_openai_error(answer: tuple[int, Any], status: int, code: str) -> None:
    assert answer[0] == status, answer
    error = answer[1]["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error


def test_another_key_gets_not_found_over_grpc_and_the_admin_key_sees_all(tmp_path: Path) -> None:
    async def main() -> None:
        async with owned_harness(tmp_path) as h:
            register = tts_pb2.RegisterVoiceRequest(
                name="alice's", reference=tts_pb2.VoiceClone(ref_audio=wav(), x_vector_only=True)
            )
            voice = await h.stub.RegisterVoice(register, metadata=as_key(KEY_A))
            voice_id = voice.voice_id
            assert len(voice.owner) == 64 and KEY_A not in voice.owner
            use = tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice_id)
            await h.synthesize(use, metadata=as_key(KEY_A))

            # key B: the voice does not exist
            for call in (
                h.stub.Synthesize(use, metadata=as_key(KEY_B)),
                h.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=voice_id), metadata=as_key(KEY_B)),
                h.stub.UpdateVoice(
                    tts_pb2.UpdateVoiceRequest(voice_id=voice_id, name="mine"), metadata=as_key(KEY_B)
                ),
                h.stub.ExportVoice(tts_pb2.ExportVoiceRequest(voice_id=voice_id), metadata=as_key(KEY_B)),
                h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=voice_id), metadata=as_key(KEY_B)),
            ):
                err = await expect_rpc_error(call)
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
                assert f"unknown voice_id {voice_id!r}" in err.details()
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=as_key(KEY_B))
            assert not listed.voices
            own = await h.stub.RegisterVoice(register, metadata=as_key(KEY_B))
            assert own.owner != voice.owner

            # the admin key: every voice
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=as_key(ADMIN))
            assert [v.voice_id for v in listed.voices] == [voice_id, own.voice_id]
            assert (
                await h.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=voice_id), metadata=as_key(ADMIN))
                == voice
            )
            await h.synthesize(use, metadata=as_key(ADMIN))
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=as_key(KEY_A))
            assert [v.voice_id for v in listed.voices] == [voice_id]  # A still sees only its own
            await h.stub.DeleteVoice(
                tts_pb2.DeleteVoiceRequest(voice_id=own.voice_id), metadata=as_key(ADMIN)
            )
            err = await expect_rpc_error(
                h.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=own.voice_id), metadata=as_key(KEY_B))
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND
            # an import belongs to the importing key
            document = await h.stub.ExportVoice(
                tts_pb2.ExportVoiceRequest(voice_id=voice_id), metadata=as_key(KEY_A)
            )
            copy = await h.stub.ImportVoice(
                tts_pb2.ImportVoiceRequest(document=document.document), metadata=as_key(KEY_B)
            )
            assert copy.voice_id != voice_id and copy.owner == own.owner
            await h.synthesize(
                tts_pb2.SynthesizeRequest(text="Hi", voice_id=copy.voice_id), metadata=as_key(KEY_B)
            )
        # keys are never stored in clear, only their digests
        stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
        assert not any(key.encode() in stored for key in (KEY_A, KEY_B, ADMIN))

    run(main())


def test_another_key_gets_404_over_http_and_the_admin_key_sees_all(tmp_path: Path) -> None:
    async def main() -> None:
        async with owned_harness(tmp_path, max_ref_audio_bytes=200_000) as h:
            alice, bob, admin = sdk(h, KEY_A), sdk(h, KEY_B), sdk(h, ADMIN)
            voice = await alice.audio.voices.create(
                audio_sample=("me.wav", wav(), "audio/wav"),
                name="alice's",
                consent="cons_123",
                extra_body={"x_vector_only": "true", "description": "Mine.", "labels": '{"lang": "en"}'},
            )
            await alice.audio.speech.create(
                model=h.model_name, input="Hi.", voice=voice.id, response_format="pcm"
            )
            with pytest.raises(openai.NotFoundError, match="unknown voice_id"):
                await bob.audio.speech.create(
                    model=h.model_name, input="Hi.", voice=voice.id, response_format="pcm"
                )
            with pytest.raises(openai.NotFoundError, match="unknown voice_id"):
                await bob.audio.voices.delete(voice.id)
            for answer in (
                await send(bob, "get", f"/audio/voices/{voice.id}"),
                await send(bob, "patch", f"/audio/voices/{voice.id}", {"name": "mine"}),
                await send(bob, "get", f"/audio/voices/{voice.id}/export"),
            ):
                assert_openai_error(answer, 404, "not_found")
            _, listing = await send(bob, "get", "/audio/voices")
            assert voice.id not in [v["id"] for v in listing["data"]]

            _, listing = await send(admin, "get", "/audio/voices")
            assert [v["id"] for v in listing["data"] if v["type"] == "audio_sample"] == [voice.id]
            _, seen = await send(admin, "get", f"/audio/voices/{voice.id}")
            assert (seen["name"], seen["description"], seen["labels"], seen["consent"]) == (
                "alice's",
                "Mine.",
                {"lang": "en"},
                "cons_123",
            )
            await admin.audio.speech.create(
                model=h.model_name, input="Hi.", voice=voice.id, response_format="pcm"
            )

            # PATCH, export, import as the owner
            status, patched = await send(
                alice, "patch", f"/audio/voices/{voice.id}", {"name": "renamed", "labels": {}}
            )
            assert (status, patched["name"], patched["labels"]) == (200, "renamed", {})
            typo = await send(alice, "patch", f"/audio/voices/{voice.id}", {"nmae": "x"})
            assert_openai_error(typo, 400, "invalid_argument")
            status, document = await send(alice, "get", f"/audio/voices/{voice.id}/export")
            assert document["voice"]["name"] == "renamed" and "owner" not in document["voice"]
            status, copy = await send(bob, "post", "/audio/voices/import", document)
            assert status == 200, copy
            assert copy["id"] != voice.id and copy["owner"] != seen["owner"] and copy["name"] == "renamed"
            newer = {**document, "format_version": 2}
            assert_openai_error(
                await send(bob, "post", "/audio/voices/import", newer), 400, "invalid_argument"
            )
            bad_embedding = {**document, "voice": {**document["voice"], "speaker_embedding": ["1.0"]}}
            assert_openai_error(
                await send(bob, "post", "/audio/voices/import", bad_embedding), 400, "invalid_argument"
            )
            deleted = await bob.audio.voices.delete(copy["id"])
            assert deleted.deleted
            await admin.audio.voices.delete(voice.id)
            assert_openai_error(await send(alice, "get", f"/audio/voices/{voice.id}"), 404, "not_found")

            # every voice route has an OpenAPI description with its schemas (the voice routes
            # alone: the whole document is the HTTP contract's business)
            probe = FastAPI()
            probe.include_router(voices_router(h.gateway, {}, lambda request: NO_KEYS), prefix="/v1")
            spec = probe.openapi()
            paths = spec["paths"]
            assert {"get", "post"} <= set(paths["/v1/audio/voices"])
            assert {"get", "patch", "delete"} <= set(paths["/v1/audio/voices/{voice_id}"])
            assert "get" in paths["/v1/audio/voices/{voice_id}/export"]
            assert "post" in paths["/v1/audio/voices/import"]
            schemas = spec["components"]["schemas"]
            assert {"RegisteredVoice", "VoiceList", "VoiceDocument", "VoicePatchBody", "VoiceDeleted"} <= set(
                schemas
            )

    run(main())


def test_a_streamed_text_speaks_only_its_own_keys_voices(tmp_path: Path) -> None:
    """WebSocket /v1/audio/speech/stream: the key of the config message (or the header) owns
    the stream, so another key's voice is 4404 and its own is spoken."""

    async def main() -> None:
        async with owned_harness(tmp_path) as h:
            voice = await h.stub.RegisterVoice(
                tts_pb2.RegisterVoiceRequest(
                    reference=tts_pb2.VoiceClone(ref_audio=wav(), x_vector_only=True)
                ),
                metadata=as_key(KEY_A),
            )
            url = h.http_url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
            for key, headers, code in (
                (KEY_B, {}, 4404),
                (KEY_A, {}, 1000),
                ("", {"x-api-key": KEY_B}, 4404),
                ("", {"x-api-key": ADMIN}, 1000),
            ):
                config = {"type": "config", "model": h.model_name, "voice": voice.voice_id, "api_key": key}
                async with connect(url, additional_headers=headers) as ws:
                    for message in (config, {"type": "text", "text": "Hi."}, {"type": "end"}):
                        await ws.send(json.dumps(message))
                    with contextlib.suppress(ConnectionClosed):
                        while True:
                            await ws.recv()
                assert ws.close_code == code, (key, headers)

    run(main())
