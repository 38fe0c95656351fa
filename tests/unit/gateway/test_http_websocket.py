"""WebSocket /v1/audio/speech/stream against fake stages, with a real WebSocket client: JSON config
and text in, metadata / binary audio / utterance ends / summary out, cancel (barge-in) keeping the
socket, and failures as an error object plus close code 4000 + HTTP status."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.helpers.fake_stages import Harness, expected_signal, run
from tts_common.audio import float_to_pcm16

PATH = "/v1/audio/speech/stream"


def ws_url(h: Harness) -> str:
    return h.http_url.replace("http", "ws", 1) + PATH


async def send(ws: ClientConnection, kind: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def send_raw(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(json.dumps(message))


async def read_until_closed(ws: ClientConnection) -> list[str | bytes]:
    messages: list[str | bytes] = []
    try:
        while True:
            messages.append(await ws.recv())
    except ConnectionClosed:
        return messages


def json_messages(messages: list[str | bytes]) -> list[dict[str, Any]]:
    return [json.loads(m) for m in messages if isinstance(m, str)]


def test_text_in_pcm_out_with_utterance_ends_and_summary() -> None:
    async def main() -> None:
        async with Harness(http=True, frames=3) as h:
            async with connect(ws_url(h)) as ws:
                await send(ws, "config", voice="vivian", seed=99)
                for delta in ("Hel", "lo there", ". "):
                    await send(ws, "text", text=delta)
                await send(ws, "flush")
                await send(ws, "text", text="Again.")
                await send(ws, "end")
                messages = await read_until_closed(ws)
                assert ws.close_code == 1000
            kinds = [json.loads(m)["type"] if isinstance(m, str) else "audio" for m in messages]
            assert kinds[0] == "metadata" and kinds[-1] == "summary"
            assert [k for k in kinds if k != "audio"] == [
                "metadata",
                "utterance_end",
                "utterance_end",
                "summary",
            ]
            meta = json.loads(messages[0])
            assert meta["sample_rate"] == 24000 and meta["seed"] == 99
            assert (
                meta["encoding"] == "AUDIO_ENCODING_PCM16"
                and meta["text_feeding"] == "TEXT_FEEDING_STREAMING"
            )
            audio = b"".join(m for m in messages if isinstance(m, bytes))
            one = float_to_pcm16(expected_signal(3))
            assert audio == one + one
            ends = [m for m in json_messages(messages) if m["type"] == "utterance_end"]
            assert [(e["index"], e["text_start"], e["text_end"]) for e in ends] == [(0, 0, 13), (1, 13, 19)]
            assert [e["finish_reason"] for e in ends] == ["FINISH_REASON_EOS"] * 2
            summary = json_messages(messages)[-1]["summary"]
            assert summary["num_samples"] == 6 * 1920 and summary["num_segments"] == 2
            assert h.talker.texts == {
                meta["request_id"]: "Hello there. ",
                meta["request_id"] + "/1": "Again.",
            }

    run(main())


def test_cancel_stops_the_audio_and_the_socket_stays_open() -> None:
    async def main() -> None:
        async with Harness(http=True, frames=400, delay=0.01) as h:
            async with connect(ws_url(h)) as ws:
                await send(ws, "config", voice="vivian", first_chunk_frames=1, max_chunk_frames=1)
                await send(ws, "text", text="A long one, on and on ")
                assert json.loads(await ws.recv())["type"] == "metadata"
                sent = len(await ws.recv())
                await send(ws, "cancel")
                while isinstance(message := await ws.recv(), bytes):
                    sent += len(message)
                ack = json.loads(message)
                assert ack["type"] == "utterance_end" and ack["finish_reason"] == "FINISH_REASON_CANCELLED"
                assert ack["num_samples"] * 2 == sent
                await asyncio.wait_for(h.talker.stopped.wait(), 5)
                h.talker.frames = 2
                await send(ws, "text", text="Next.")
                await send(ws, "end")
                rest = await read_until_closed(ws)
            assert sum(len(m) for m in rest if isinstance(m, bytes)) == 2 * 1920 * 2
            assert [m["type"] for m in json_messages(rest)] == ["utterance_end", "summary"]

    run(main())


def test_failures_are_error_objects_and_close_codes() -> None:
    cases: list[tuple[list[dict[str, Any]], int, str, str]] = [
        (
            [{"type": "text", "text": "Hi."}],
            4400,
            "invalid_argument",
            "the first message must be the configuration",
        ),
        (
            [{"type": "config", "voice": "vivian"}, {"type": "config", "voice": "vivian"}],
            4400,
            "invalid_argument",
            "a second configuration",
        ),
        (
            [{"type": "config", "voice": "vivian", "input": "Hi."}],
            4400,
            "invalid_argument",
            "input must be empty",
        ),
        (
            [{"type": "config", "voice": "vivian", "bogus": 1}],
            4400,
            "invalid_argument",
            "bogus: unknown field",
        ),
        ([{"type": "config", "voice": "nobody"}], 4404, "not_found", "unknown voice 'nobody'"),
        (
            [{"type": "config", "voice": "vivian"}, {"type": "end"}],
            4400,
            "invalid_argument",
            "no text to speak",
        ),
        (
            [{"type": "config", "voice": "vivian"}, {"type": "shout"}],
            4400,
            "invalid_argument",
            "unknown message type",
        ),
        (
            [{"type": "config", "voice": "vivian"}, {"type": "text", "text": "x" * 30}],
            4400,
            "invalid_argument",
            "text is too long",
        ),
        (
            [{"type": "config", "voice": "vivian"}, {"type": "text", "text": "Hi there "}],
            4504,
            "deadline_exceeded",
            "no message for 1 s",
        ),
    ]

    async def main() -> None:
        async with Harness(http=True, frames=2, max_text_chars=20, text_idle_timeout_seconds=1.0) as h:
            for messages, code, status, text in cases:
                async with connect(ws_url(h)) as ws:
                    for message in messages:
                        await send_raw(ws, message)
                    received = await read_until_closed(ws)
                error = json_messages(received)[-1]
                assert error["type"] == "error", received
                assert error["error"]["code"] == status, (messages, error)
                assert text in error["error"]["message"], (text, error)
                assert ws.close_code == code, (messages, ws.close_code)
            for _ in range(100):  # the idle stream's talker call is cancelled as the socket closes
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.talker.active == 0

    run(main())


def test_api_key_from_the_config_message_or_a_header() -> None:
    async def main() -> None:
        async with Harness(http=True, frames=1, api_keys=frozenset({"k1"})) as h:
            for extra, headers, code in (
                ({}, {}, 4401),
                ({"api_key": "nope"}, {}, 4403),
                ({"api_key": "k1"}, {}, 1000),
                ({}, {"authorization": "Bearer k1"}, 1000),
            ):
                async with connect(ws_url(h), additional_headers=headers) as ws:
                    await send(ws, "config", voice="vivian", **extra)
                    await send(ws, "text", text="Hi.")
                    await send(ws, "end")
                    await read_until_closed(ws)
                assert ws.close_code == code, (extra, headers)

    run(main())


def test_client_leaving_frees_the_slot() -> None:
    async def main() -> None:
        async with Harness(http=True, frames=400, delay=0.01) as h:
            async with connect(ws_url(h)) as ws:
                await send(ws, "config", voice="vivian")
                await send(ws, "text", text="Talk for a while ")
                await ws.recv()
                await ws.recv()
            await asyncio.wait_for(h.talker.stopped.wait(), 5)
            for _ in range(100):
                if h.talker.active == 0 and h.active_streams == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.talker.active == 0 and h.active_streams == 0

    run(main())
