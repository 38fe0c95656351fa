"""Word timestamps over HTTP against fake stages and a fake aligner: ``speech.audio.timestamps``
events in the ``openai`` SDK's SSE stream and on the WebSocket (seconds of the audio as sent,
spans of the input), the one-body JSON answer, the barge-in's last word, 400 without an aligner
stage, and the models' capability."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
import openai
import soundfile as sf
from pydantic import TypeAdapter
from websockets.asyncio.client import connect

from gateway.transports.http.openapi import SpeechEvent, SpeechJsonBody
from tests.helpers.fake_aligner import (
    FakeAligner,
    fake_times,
    fake_units,
    harness_with_aligner,
)
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, Harness, run
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.text import estimate_tokens, segment_text

TEXT = (
    "First, the quick brown fox jumps over the lazy dog. It's 3 o'clock, isn't it? "
    "Then we went home, slowly, along the river. See you soon!"
)
FRAMES = 4
SEGMENT_SECONDS = FRAMES * SAMPLES_PER_FRAME / 24000


def client(h: Harness) -> openai.AsyncOpenAI:
    sdk = openai.AsyncOpenAI(base_url=h.http_url + "/v1", api_key="unused", max_retries=0, timeout=20)
    h.cleanups.append(sdk.close)
    return sdk


def expected_words(text: str, pieces: list[Any]) -> list[dict[str, Any]]:
    """The words the fake aligner gives each segment (PCM at 24 kHz, no speed), in seconds."""
    words = []
    for k, piece in enumerate(pieces):
        units = fake_units(piece.text, stages_pb2.ALIGN_UNIT_WORD)
        for (word, a, b), (s, e) in zip(units, fake_times(len(units), SEGMENT_SECONDS * 1000)):
            offset = k * FRAMES * SAMPLES_PER_FRAME
            words.append(
                {
                    "text": word,
                    "start": (offset + round(s * 24)) / 24000,
                    "end": (offset + round(e * 24)) / 24000,
                    "char_start": piece.start + a,
                    "char_end": piece.start + b,
                }
            )
    assert [text[w["char_start"] : w["char_end"]] for w in words] == [w["text"] for w in words]
    return words


def test_sse_stream_of_the_sdk_carries_each_segments_words() -> None:
    async def main() -> None:
        pieces = segment_text(TEXT, 20, estimate_tokens)
        assert len(pieces) > 2
        async with harness_with_aligner(http=True, frames=FRAMES, segment_tokens=20) as h:
            async with client(h).audio.speech.with_streaming_response.create(
                model=h.model_name,
                input=TEXT,
                voice="vivian",
                response_format="pcm",
                stream_format="sse",
                extra_body={"timestamps": "word"},
            ) as response:
                lines = [line async for line in response.iter_lines()]
        events = [json.loads(line.removeprefix("data: ")) for line in lines if line]
        for event in events:  # as the OpenAPI document describes them
            TypeAdapter(SpeechEvent).validate_python(event)
        kinds = [e["type"] for e in events]
        assert kinds[0] == "speech.audio.delta" and kinds[-1] == "speech.audio.done"
        timestamps = [e for e in events if e["type"] == "speech.audio.timestamps"]
        assert sorted(e["index"] for e in timestamps) == list(range(len(pieces)))
        words = [w for e in sorted(timestamps, key=lambda e: e["index"]) for w in e["words"]]
        assert words == expected_words(TEXT, pieces)
        # Inside the audio sent, monotonic; each segment's words after its audio.
        audio_seconds = events[-1]["summary"]["audio_seconds"]
        ends = [w["end"] for w in words]
        assert ends == sorted(ends) and ends[-1] <= audio_seconds
        for e in timestamps:
            position = events.index(e)
            sent = sum(len(base64.b64decode(x["audio"])) // 2 for x in events[:position] if "audio" in x)
            assert sent >= (e["index"] + 1) * FRAMES * SAMPLES_PER_FRAME

    run(main())


def test_json_body_has_the_audio_and_the_alignment() -> None:
    async def main() -> None:
        pieces = segment_text(TEXT, 20, estimate_tokens)
        async with harness_with_aligner(http=True, frames=FRAMES, segment_tokens=20) as h:
            answer = await client(h).audio.speech.create(
                model=h.model_name,
                input=TEXT,
                voice="vivian",
                response_format="wav",
                extra_body={"timestamps": "word", "stream_format": "json"},
            )
        body = json.loads(answer.content)
        SpeechJsonBody.model_validate(body)
        audio, rate = sf.read(io.BytesIO(base64.b64decode(body["audio"])), dtype="float32")
        assert rate == body["sample_rate"] == 24000
        assert audio.size == len(pieces) * FRAMES * SAMPLES_PER_FRAME
        assert body["words"] == expected_words(TEXT, pieces)
        assert body["timestamps_errors"] == {}
        assert body["summary"]["num_segments"] == len(pieces)

    run(main())


def test_websocket_timestamps_and_the_last_word_of_a_barge_in() -> None:
    async def main() -> None:
        async with harness_with_aligner(http=True, frames=3) as h:
            url = h.http_url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
            async with connect(url) as ws:
                await ws.send(json.dumps({"type": "config", "voice": "vivian", "timestamps": "character"}))
                for message in (
                    {"type": "text", "text": "Hi, yo"},
                    {"type": "text", "text": "u!"},
                    {"type": "end"},
                ):
                    await ws.send(json.dumps(message))
                messages = [m async for m in ws]
            events = [json.loads(m) for m in messages if isinstance(m, str)]
            (timing,) = [e for e in events if e["type"] == "speech.audio.timestamps"]
            assert [c["text"] for c in timing["characters"]] == list("Hiyou")
            assert [(c["char_start"], c["char_end"]) for c in timing["characters"]] == [
                (0, 1),
                (1, 2),
                (4, 5),
                (5, 6),
                (6, 7),
            ]
            assert timing["characters"][-1]["end"] == 3 * SAMPLES_PER_FRAME / 24000
            assert [e["type"] for e in events][-1] == "summary"

            h.talker.frames, h.talker.delay = 400, 0.01
            async with connect(url) as ws:
                await ws.send(
                    json.dumps(
                        {"type": "config", "voice": "vivian", "timestamps": "word", "first_chunk_frames": 1}
                    )
                )
                said = "Hello there, this is a long one "
                await ws.send(json.dumps({"type": "text", "text": said}))
                audio = 0
                while audio < 6 * SAMPLES_PER_FRAME * 2:
                    if isinstance(message := await ws.recv(), bytes):
                        audio += len(message)
                await ws.send(json.dumps({"type": "cancel"}))
                while not (
                    isinstance(m := await ws.recv(), str) and json.loads(m)["type"] == "utterance_end"
                ):
                    pass
                ack = json.loads(m)
                await ws.send(json.dumps({"type": "end"}))
            assert ack["finish_reason"] == "FINISH_REASON_CANCELLED"
            words = fake_units(said, stages_pb2.ALIGN_UNIT_WORD)
            last = ack["last_unit"]
            assert (last["text"], last["char_start"], last["char_end"]) == words[-2]
            assert last["end"] < ack["num_samples"] / 24000

    run(main())


def test_without_an_aligner_http_says_so_and_models_tell() -> None:
    async def main() -> None:
        async with Harness(http=True, frames=2) as h:
            sdk = client(h)
            try:
                await sdk.audio.speech.create(
                    model=h.model_name,
                    input="Hi.",
                    voice="vivian",
                    extra_body={"timestamps": "word", "stream_format": "json"},
                )
            except openai.BadRequestError as exc:
                assert "this server has no aligner stage" in str(exc)
            else:
                raise AssertionError("timestamps without an aligner were accepted")
            models = await sdk.models.list()
            assert models.data[0].model_extra["capabilities"]["timestamps"] is False  # type: ignore[index]
        async with harness_with_aligner(http=True, frames=2) as h:
            models = await client(h).models.list()
            assert models.data[0].model_extra["capabilities"]["timestamps"] is True  # type: ignore[index]
            # No timestamps asked: the JSON body has none.
            answer = await client(h).audio.speech.create(
                model=h.model_name,
                input="Hi.",
                voice="vivian",
                response_format="pcm",
                extra_body={"stream_format": "json"},
            )
            body = json.loads(answer.content)
            assert "words" not in body and len(base64.b64decode(body["audio"])) == 2 * SAMPLES_PER_FRAME * 2
            assert np.isclose(body["summary"]["audio_seconds"], 2 * SAMPLES_PER_FRAME / 24000)

    run(main())


def test_words_follow_speed_and_the_output_rate() -> None:
    async def main() -> None:
        async with harness_with_aligner(http=True, frames=FRAMES, segment_tokens=20) as h:
            answer = await client(h).audio.speech.create(
                model=h.model_name,
                input=TEXT,
                voice="vivian",
                response_format="pcm",
                speed=2.0,
                extra_body={"timestamps": "word", "stream_format": "json", "sample_rate": 16000},
            )
        body = json.loads(answer.content)
        sent = len(base64.b64decode(body["audio"])) // 2
        words = body["words"]
        segments = body["summary"]["segments"]
        assert body["sample_rate"] == 16000 and sent == body["summary"]["num_samples"]
        # Half the native duration, at 16 kHz; the last word ends where the audio does.
        assert abs(sent - len(segments) * FRAMES * SAMPLES_PER_FRAME / 2 * 2 / 3) <= len(segments) * 2
        assert abs(words[-1]["end"] - sent / 16000) < 1e-9
        starts = [w["start"] for w in words]
        assert starts == sorted(starts)
        for segment in segments:  # each segment's words inside its audio
            inside = [w for w in words if segment["text_start"] <= w["char_start"] < segment["text_end"]]
            first, last = (
                segment["start_sample"] / 16000,
                (segment["start_sample"] + segment["num_samples"]) / 16000,
            )
            assert inside and all(first <= w["start"] <= w["end"] <= last + 1e-9 for w in inside)

    run(main())


def test_timestamps_with_a_plain_audio_body_are_refused_naming_the_fields() -> None:
    """A plain audio body has no place for timings: 400 naming ``timestamps`` and
    ``stream_format``, before any stage (talker or aligner) is asked for anything."""

    async def main() -> None:
        aligner = FakeAligner()
        async with harness_with_aligner(aligner, http=True, frames=2) as h:
            for stream_format in ({}, {"stream_format": "audio"}):
                try:
                    await client(h).audio.speech.create(
                        model=h.model_name,
                        input="Hi there.",
                        voice="vivian",
                        response_format="pcm",
                        extra_body={"timestamps": "word", **stream_format},
                    )
                except openai.BadRequestError as exc:
                    error = exc.body if isinstance(exc.body, dict) else {}
                    assert error.get("param") == "timestamps", exc.body
                    assert "stream_format" in error.get("message", "") and "sse" in error["message"]
                else:
                    raise AssertionError("timestamps with a plain audio body were accepted")
            assert h.talker.requests == [] and aligner.requests == []

    run(main())
