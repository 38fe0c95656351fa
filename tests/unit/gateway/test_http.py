"""The OpenAI-compatible HTTP API over fake stages, driven by the official ``openai`` SDK: every
response format decoded (lossless ones byte-equal to the gRPC API's output for the same request),
server-sent events, extra_body fields reaching the stages, voices, every error status, client
disconnects freeing the talker slot, graceful stop, the playground page."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
from typing import Any

import av
import numpy as np
import openai
import pytest
import soundfile as sf
from prometheus_client import REGISTRY

from gateway.transports.http.formats import RESPONSE_FORMATS
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, Harness, expected_signal, run
from tts_common.audio import float_to_pcm16
from tts_common.pb.qwen3tts.v1 import tts_pb2

LOSSLESS = ("pcm", "wav", "flac", "mulaw", "alaw")


def client(h: Harness, api_key: str = "unused") -> openai.AsyncOpenAI:
    """An SDK client of the harness's HTTP API (closed with the harness; no retries)."""
    sdk = openai.AsyncOpenAI(base_url=h.http_url + "/v1", api_key=api_key, max_retries=0, timeout=20)
    h.cleanups.append(sdk.close)
    return sdk


def grpc_request(fmt: str, **fields: Any) -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(
        text="Hello there.",
        speaker="vivian",
        output=tts_pb2.AudioFormat(encoding=RESPONSE_FORMATS[fmt].encoding),
        **fields,
    )


async def grpc_bytes(h: Harness, fmt: str) -> bytes:
    _, chunks, _ = await h.synthesize(grpc_request(fmt))
    return b"".join(c.data for c in chunks)


def decode_lossy(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    return np.concatenate(frames), rate


def _metric(status: str) -> float:
    return REGISTRY.get_sample_value("qwen3tts_requests_total", {"stage": "gateway", "status": status}) or 0.0


def test_every_format_with_the_sdk_equals_grpc_where_lossless() -> None:
    frames = 7
    signal = expected_signal(frames)
    pcm16 = float_to_pcm16(signal)

    async def main() -> None:
        async with Harness(frames=frames, http=True) as h:
            sdk = client(h)
            for fmt, spec in RESPONSE_FORMATS.items():
                whole = await sdk.audio.speech.create(
                    model=h.model_name, input="Hello there.", voice="vivian", response_format=fmt
                )
                async with sdk.audio.speech.with_streaming_response.create(
                    model=h.model_name, input="Hello there.", voice="vivian", response_format=fmt
                ) as response:
                    assert response.headers["content-type"].startswith(spec.media_type.split(";")[0])
                    pieces = [piece async for piece in response.iter_bytes()]
                streamed = b"".join(pieces)
                data = whole.content
                if fmt in LOSSLESS:
                    expected = await grpc_bytes(h, fmt)
                    assert data == streamed == expected, fmt
                if fmt == "pcm":  # OpenAI's pcm: raw 16-bit LE mono at 24 kHz
                    assert data == pcm16
                elif fmt in ("wav", "flac"):
                    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
                    assert rate == 24000 and audio.tobytes() == pcm16, fmt
                elif fmt in ("mulaw", "alaw"):
                    assert len(data) == math.ceil(signal.size / 3), fmt  # one byte a sample, 8 kHz
                else:
                    for blob in (data, streamed):  # lossy: the right length of the right signal
                        audio, rate = decode_lossy(blob)
                        assert rate == (48000 if fmt == "opus" else 24000), fmt  # Opus decodes at 48 kHz
                        n = signal.size * rate // 24000
                        assert n <= audio.size <= n + 4096, (fmt, audio.size)
                        level = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
                        assert 0.5 < level / float(np.sqrt(np.mean(signal**2))) < 1.5, fmt
            assert h.active_streams == 0

    run(main(), timeout=60)


def test_sse_events_carry_the_audio_and_the_summary() -> None:
    async def main() -> None:
        async with Harness(frames=9, http=True) as h:
            async with client(h).audio.speech.with_streaming_response.create(
                model=h.model_name,
                input="Hello there.",
                voice="ryan",
                response_format="pcm",
                stream_format="sse",
            ) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = [line async for line in response.iter_lines()]
            events = [json.loads(line.removeprefix("data: ")) for line in lines if line]
            assert all(line.startswith("data: ") for line in lines if line)
            kinds = [e["type"] for e in events]
            assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
            audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
            assert audio == float_to_pcm16(expected_signal(9))
            summary = events[-1]["summary"]
            assert summary["frames"] == 9 and summary["num_samples"] == 9 * SAMPLES_PER_FRAME
            assert summary["finish_reason"] == "FINISH_REASON_EOS"
            assert summary["num_chunks"] == len(events) - 1

    run(main())


def test_extra_body_fields_reach_the_stages() -> None:
    async def main() -> None:
        async with Harness(frames=12, http=True) as h:
            sdk = client(h)
            async with sdk.audio.speech.with_streaming_response.create(
                model=h.model_name,
                input="Bonjour.",
                voice={"id": "Vivian"},  # OpenAI's custom-voice form; speakers match any case
                response_format="wav",
                extra_body={
                    "seed": 1234,
                    "temperature": 0.5,
                    "top_k": 7,
                    "do_sample": False,
                    "max_new_tokens": 6,
                    "language": "Chinese",
                    "text_feeding": "streaming",
                    "sample_rate": 16000,
                    "first_chunk_frames": 3,
                    "max_chunk_frames": 4,
                    "request_id": "my-id.1",
                },
            ) as raw:
                data = await raw.read()
                assert raw.headers["x-request-id"] == "my-id.1"
                assert raw.headers["x-seed"] == "1234" and raw.headers["x-sample-rate"] == "16000"
            sent = h.talker.requests[-1]
            assert (sent.request_id, sent.speaker, sent.language, sent.text) == (
                "my-id.1",
                "vivian",
                "chinese",
                "Bonjour.",
            )
            assert sent.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING
            assert (sent.sampling.seed, sent.sampling.temperature, sent.sampling.top_k) == (1234, 0.5, 7)
            assert not sent.sampling.do_sample and sent.sampling.max_new_tokens == 6
            start = h.decoder.starts[-1]
            assert (start.first_chunk_frames, start.max_chunk_frames) == (3, 4)
            audio, rate = sf.read(io.BytesIO(data), dtype="float32")
            assert rate == 16000 and audio.size == 5 * SAMPLES_PER_FRAME * 2 // 3  # 5 frames, resampled
            # x-request-id header when the body has none
            async with sdk.audio.speech.with_streaming_response.create(
                model=h.model_name, input="Hi.", voice="eric", extra_headers={"x-request-id": "hdr-7"}
            ) as raw:
                await raw.read()
                assert raw.headers["x-request-id"] == "hdr-7"
            assert h.talker.requests[-1].request_id == "hdr-7"
            # speed: the time-scale stage (2x faster: half the samples)
            normal = (
                await sdk.audio.speech.create(
                    model=h.model_name, input="Hi.", voice="ryan", response_format="pcm"
                )
            ).content
            fast = (
                await sdk.audio.speech.create(
                    model=h.model_name, input="Hi.", voice="ryan", response_format="pcm", speed=2.0
                )
            ).content
            assert abs(len(fast) / len(normal) - 0.5) < 0.02, (len(fast), len(normal))

    run(main())


def test_voice_design_instructions_and_aliases() -> None:
    async def main() -> None:
        async with Harness("voice_design", http=True) as h:
            sdk = client(h)
            await sdk.audio.speech.create(
                model=h.model_name,
                input="Hi.",
                voice="alloy",
                instructions="A calm voice.",
                response_format="pcm",
            )
            sent = h.talker.requests[-1]
            assert sent.instruct == "A calm voice." and not sent.speaker and not sent.speaker_embedding
        async with Harness(http=True, voice_alias=(("alloy", "Ryan"), ("echo", "eric"))) as h:
            sdk = client(h)
            await sdk.audio.speech.create(
                model=h.model_name, input="Hi.", voice="ALLOY", response_format="pcm"
            )
            assert h.talker.requests[-1].speaker == "ryan"
            listing = (await sdk.get("/audio/voices", cast_to=object))["data"]  # type: ignore[index]
            assert [(v["id"], v["type"]) for v in listing] == [
                ("vivian", "preset"),
                ("ryan", "preset"),
                ("eric", "preset"),
                ("alloy", "alias"),
                ("echo", "alias"),
            ]
            with pytest.raises(openai.BadRequestError, match="instruct is not supported"):
                await sdk.audio.speech.create(
                    model=h.model_name, input="Hi.", voice="ryan", instructions="Loud."
                )

    run(main())


def test_voices_register_use_delete() -> None:
    wav = io.BytesIO()
    sf.write(wav, np.sin(np.linspace(0, 600, 24000)).astype(np.float32) * 0.3, 24000, format="WAV")

    async def main() -> None:
        async with Harness("base", http=True, max_ref_audio_bytes=200_000) as h:
            sdk = client(h)
            voice = await sdk.audio.voices.create(
                audio_sample=("me.wav", wav.getvalue(), "audio/wav"),
                consent="unused",
                name="me",
                extra_body={"ref_text": "A reference sentence."},
            )
            assert voice.object == "audio.voice" and voice.name == "me" and voice.id.startswith("voice-")
            assert h.speaker.requests[-1].audio == wav.getvalue()
            listing = await sdk.get("/audio/voices", cast_to=object)
            (listed,) = listing["data"]  # type: ignore[index]
            assert listed["id"] == voice.id and listed["ref_text"] == "A reference sentence."
            await sdk.audio.speech.create(
                model=h.model_name, input="Hi.", voice=voice.id, response_format="pcm"
            )
            sent = h.talker.requests[-1]
            assert len(sent.speaker_embedding) > 0 and sent.ref_text == "A reference sentence."
            deleted = await sdk.audio.voices.delete(voice.id)
            assert deleted.deleted and deleted.id == voice.id
            with pytest.raises(openai.NotFoundError, match="unknown voice"):
                await sdk.audio.speech.create(model=h.model_name, input="Hi.", voice={"id": voice.id})
            with pytest.raises(openai.NotFoundError, match="unknown voice_id"):
                await sdk.audio.voices.delete(voice.id)
            # an x-vector-only voice needs no transcript
            xvec = await sdk.audio.voices.create(
                audio_sample=("me.wav", wav.getvalue()),
                consent="",
                name="x",
                extra_body={"x_vector_only": "true"},
            )
            assert xvec.model_extra and xvec.model_extra["x_vector_only"] is True
            with pytest.raises(openai.BadRequestError, match="ref_text"):
                await sdk.audio.voices.create(audio_sample=("me.wav", wav.getvalue()), consent="", name="y")
            with pytest.raises(openai.APIStatusError) as too_large:
                await sdk.audio.voices.create(
                    audio_sample=("big.wav", b"RIFF" + bytes(2_000_000)), consent="", name="z"
                )
            assert too_large.value.status_code == 413

    run(main())


async def _raw_request(
    port: int, head: str, body: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    return reader, writer


def _speech_head(body: bytes, extra: str = "") -> str:
    return (
        "POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}"
    )


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status_line, *lines = head.strip().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers


def test_client_disconnect_cancels_the_synthesis_and_frees_the_slot() -> None:
    async def main() -> None:
        async with Harness(frames=400, delay=0.02, http=True, max_concurrent_streams=1) as h:
            body = json.dumps(
                {"model": h.model_name, "input": "Hi.", "voice": "ryan", "response_format": "pcm"}
            ).encode()
            cancelled = _metric("CANCELLED")
            reader, writer = await _raw_request(h.http_server.port, _speech_head(body), body)
            status, headers = await _read_head(reader)
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            await reader.read(100)  # audio is flowing
            assert h.active_streams == 1
            # at capacity meanwhile: 429 with Retry-After
            with pytest.raises(openai.RateLimitError) as limited:
                await client(h).audio.speech.create(model=h.model_name, input="Hi.", voice="ryan")
            assert limited.value.response.headers["retry-after"] == "1"
            assert limited.value.body["code"] == "resource_exhausted"  # type: ignore[index]
            writer.close()  # the client goes away mid-stream
            await asyncio.wait_for(h.talker.stopped.wait(), 5)
            for _ in range(100):
                if h.active_streams == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.active_streams == 0
            assert _metric("CANCELLED") == cancelled + 1
            assert len(h.talker.requests) == 1 and h.talker.rpc_cancelled + h.talker.cancel_messages >= 1
            # the slot is free again
            h.talker.frames = 3
            await client(h).audio.speech.create(
                model=h.model_name, input="Hi.", voice="ryan", response_format="pcm"
            )

    run(main())


def test_error_statuses_and_openai_error_objects() -> None:
    async def main() -> None:
        async with Harness(http=True, api_keys=frozenset({"k1"}), http_max_body_bytes=4096) as h:
            good = client(h, "k1")
            ok = _metric("OK")
            await good.audio.speech.create(
                model=h.model_name, input="Hi.", voice="ryan", response_format="pcm"
            )
            assert _metric("OK") == ok + 1
            cases: list[tuple[Any, dict[str, Any], type[openai.APIStatusError], int, str]] = [
                (
                    good,
                    {"extra_headers": {"Authorization": ""}},
                    openai.AuthenticationError,
                    401,
                    "missing API key",
                ),
                (client(h, "wrong"), {}, openai.PermissionDeniedError, 403, "invalid API key"),
                (good, {"voice": "nobody"}, openai.NotFoundError, 404, "unknown voice 'nobody'"),
                (good, {"input": ""}, openai.BadRequestError, 400, "text is empty"),
                (good, {"response_format": "ogg"}, openai.BadRequestError, 400, "response_format"),
                (good, {"speed": 9.0}, openai.BadRequestError, 400, "speed must be in"),
                (good, {"extra_body": {"top_k": "x"}}, openai.BadRequestError, 400, "top_k"),
                (good, {"extra_body": {"seed": -1}}, openai.BadRequestError, 400, "seed"),
                (good, {"extra_body": {"temprature": 1}}, openai.BadRequestError, 400, "temprature: unknown"),
                (
                    good,
                    {"response_format": "opus", "extra_body": {"sample_rate": 44100}},
                    openai.BadRequestError,
                    400,
                    "OGG_OPUS supports sample rates",
                ),
                (good, {"input": "x" * 5000}, openai.APIStatusError, 413, "request body too large"),
            ]
            for sdk, change, error, status, message in cases:
                kwargs = {
                    "model": h.model_name,
                    "input": "Hi.",
                    "voice": "ryan",
                    "response_format": "pcm",
                    **change,
                }
                with pytest.raises(error) as caught:
                    await sdk.audio.speech.create(**kwargs)
                assert caught.value.status_code == status, (change, caught.value)
                assert message in caught.value.message, (change, caught.value.message)
                assert set(caught.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
            # 503: the server not serving (starting up or draining); /health says so too
            h.health.mark_not_serving()
            with pytest.raises(openai.InternalServerError) as unavailable:
                await good.models.list()
            assert unavailable.value.status_code == 503
            assert unavailable.value.response.headers["retry-after"] == "1"
            reader, writer = await _raw_request(h.http_server.port, "GET /health HTTP/1.1\r\nHost: t\r\n")
            assert (await _read_head(reader))[0] == 503
            writer.close()
            h.health.mark_ready()
            # 503: a stage down
            await h.decoder_server.stop(0)
            with pytest.raises(openai.InternalServerError, match="the decoder stage is unavailable") as down:
                await good.audio.speech.create(model=h.model_name, input="Hi.", voice="ryan")
            assert down.value.status_code == 503 and down.value.body["code"] == "unavailable"  # type: ignore[index]
            # chunked upload over the limit: 413 as soon as it passes it
            reader, writer = await _raw_request(
                h.http_server.port,
                "POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k1\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n",
                b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(8)) + b"0\r\n\r\n",
            )
            status, _ = await _read_head(reader)
            writer.close()
            assert status == 413

    run(main())


def test_models_health_and_playground_page() -> None:
    async def main() -> None:
        async with Harness(http=True, api_keys=frozenset({"k1"})) as h:
            sdk = client(h, "k1")
            models = await sdk.models.list()
            assert [m.id for m in models.data] == ["fake-custom_voice"]
            assert (await sdk.models.retrieve("fake-custom_voice")).owned_by == "qwen3-tts"
            with pytest.raises(openai.NotFoundError):
                await sdk.models.retrieve("tts-1")
            # the page and /health need no key
            for path, status, kind in (("/", 200, "text/html"), ("/health", 200, "application/json")):
                reader, writer = await _raw_request(h.http_server.port, f"GET {path} HTTP/1.1\r\nHost: t\r\n")
                code, headers = await _read_head(reader)
                body = await reader.readexactly(int(headers["content-length"]))
                writer.close()
                assert code == status and headers["content-type"].startswith(kind), path
                if path == "/":
                    assert b'id="speak"' in body and b"/v1/audio/speech" in body
            # unknown routes: OpenAI error objects too
            with pytest.raises(openai.NotFoundError) as missing:
                await sdk.get("/nothing", cast_to=object)
            assert missing.value.body["code"] == "not_found"  # type: ignore[index]

    run(main())


def test_graceful_stop_finishes_streams_in_flight() -> None:
    async def main() -> None:
        async with Harness(frames=25, delay=0.02, http=True) as h:
            body = json.dumps(
                {"model": h.model_name, "input": "Hi.", "voice": "ryan", "response_format": "pcm"}
            ).encode()
            reader, writer = await _raw_request(h.http_server.port, _speech_head(body), body)
            assert (await _read_head(reader))[0] == 200
            stopping = asyncio.create_task(h.http_server.stop(10))
            data = await asyncio.wait_for(reader.read(), 10)  # until the server closes: all of it
            writer.close()
            await stopping
            chunks, rest = b"", data
            while rest:  # undo the chunked transfer coding
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line, 16)
                chunks, rest = chunks + rest[:size], rest[size + 2 :]
                if size == 0:
                    break
            assert chunks == float_to_pcm16(expected_signal(25))
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", h.http_server.port)

    run(main())


def test_health_command_checks_grpc_and_http_together() -> None:
    """``qwen3-tts health`` (the Compose healthcheck): 0 only when every address it is given
    reports SERVING, the HTTP API's /health included; 1 as soon as one does not."""
    from qwen3_tts.cli import build_parser

    def health(*addresses: str) -> int:
        args = build_parser().parse_args(["health", *addresses, "--timeout", "5"])
        return args.func(args)

    async def main() -> None:
        async with Harness(http=True) as h:
            grpc_address, url = f"127.0.0.1:{h.port}", h.http_url + "/health"
            assert await asyncio.to_thread(health, grpc_address, url) == 0
            assert await asyncio.to_thread(health, url) == 0
            h.health.mark_not_serving()  # both listeners say so: 503 over HTTP
            assert await asyncio.to_thread(health, url) == 1
            assert await asyncio.to_thread(health, grpc_address, url) == 1
            h.health.mark_ready()
            assert await asyncio.to_thread(health, grpc_address, h.http_url + "/nothing") == 1  # 404
            # /health is readiness: a stage without a reachable replica fails it (as the gRPC
            # service's status), while the process stays up (overall status, liveness)
            h.health.set_dependency("decoder stage", False)
            assert await asyncio.to_thread(health, url) == 1
            assert await asyncio.to_thread(health, grpc_address) == 0
            reader, writer = await _raw_request(h.http_server.port, "GET /health HTTP/1.1\r\nHost: t\r\n")
            status, headers = await _read_head(reader)
            body = json.loads(await reader.readexactly(int(headers["content-length"])))
            writer.close()
            assert (status, body) == (503, {"status": "not_serving", "unavailable": ["decoder stage"]})
            h.health.set_dependency("decoder stage", True)
            assert await asyncio.to_thread(health, url) == 0

    run(main())
