"""Word timestamps end to end on ``qwen3-tts up``'s default stack (``make up``: the dev VoiceDesign
checkpoint and the dev aligner checkpoint, both created on first use, served by one ``up``).

A seeded request long enough to be spoken in several segments, asking for word timestamps, gets
one timing per word of its text: in the order of the text, monotonic, inside the audio sent (of
its own segment), with character spans that tile the words (each span is its word's first to
last letter, digit or apostrophe). The same through the ``openai`` SDK's SSE stream (the same
timings, in seconds) and through the WebSocket (streamed text, several utterances, spans over the
concatenated text). ``qwen3-tts say --captions`` writes the words as cues; offline
``qwen3-tts synthesize --timestamps`` (the aligner in process) gives the gateway's timings. One
stack for the module, a few requests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from websockets.asyncio.client import connect

from tests.helpers.stack import free_base_port, free_port, start_up
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

SEED = 20260
FRAMES_PER_SEGMENT = 8
"""max_new_tokens per segment: a little audio for each word to land in, cheap on a shared CPU."""
SAMPLE_RATE = 24000

SENTENCES = [
    "The quiet harbour woke slowly, and the fishing boats drifted out past the old stone pier.",
    "Gulls circled above the nets while a radio somewhere played a song from 1987.",
    "By noon the market was full: bread, cheese, olives, and crates of bright oranges.",
    "Nobody noticed the small blue door at the end of the lane, though it had been open all morning.",
    "Inside, a clockmaker was repairing a watch that had stopped exactly at twelve minutes past four.",
    "He worked without hurry, humming, turning each tiny gear in the light from the window.",
]


def long_text(chars: int = 600) -> str:
    """Sentences up to about ``chars`` characters: more than one segment of the dev talker."""
    text = ""
    while len(text) < chars:
        text += SENTENCES[len(text) % len(SENTENCES)] + " "
    return text.strip()


def expected_spans(text: str) -> list[tuple[int, int]]:
    """Each whitespace-separated word's span, from its first to its last letter, digit or
    apostrophe (words without a letter or digit are not timed)."""
    spans = []
    for match in re.finditer(r"\S+", text):
        kept = [match.start() + i for i, ch in enumerate(match.group()) if ch.isalnum() or ch == "'"]
        if any(text[i].isalnum() for i in kept):
            spans.append((kept[0], kept[-1] + 1))
    return spans


def check_units(text: str, units: list[dict[str, Any]], audio_end: float) -> None:
    """One unit per word of ``text``, in order, tiling the words, times monotonic (start <= end
    <= next start) and inside ``[0, audio_end]``. ``units``: text, char_start, char_end, start,
    end (any time unit, ``audio_end`` in the same)."""
    assert [(u["char_start"], u["char_end"]) for u in units] == expected_spans(text)
    for unit in units:
        word = text[unit["char_start"] : unit["char_end"]]
        assert unit["text"] == "".join(ch for ch in word if ch.isalnum() or ch == "'"), (unit, word)
    flat = [t for u in units for t in (u["start"], u["end"])]
    assert all(a <= b for a, b in zip(flat, flat[1:])), "times go back"
    assert flat[0] >= 0 and flat[-1] <= audio_end


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``qwen3-tts up`` with its defaults (dev checkpoints in a temporary --dev-model-dir), on
    free ports: the gateway's gRPC and HTTP ports, and the dev checkpoints' folder."""
    root = tmp_path_factory.mktemp("up")
    ports: dict[str, Any] = {"grpc": free_port(), "http": free_port(), "dev": root / "dev"}
    cmd = [
        sys.executable, "-m", "qwen3_tts.cli", "up", "--dev-model-dir", str(root / "dev"),
        "--port", str(ports["grpc"]), "--base-port", str(free_base_port()), "--http-port", str(ports["http"]),
        "--voices-db", str(root / "voices.db"),
    ]  # fmt: skip
    proc, printed = start_up(cmd, timeout=300)
    assert any("word timestamps (aligner" in line for line in printed), printed
    try:
        yield ports
    finally:
        os.killpg(os.getpgid(proc.pid), signal.SIGINT)
        try:
            assert proc.wait(60) == 0
        except subprocess.TimeoutExpired:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
            raise


def _grpc_request(text: str) -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(
        text=text,
        instruct="A calm, clear voice.",
        language="English",
        sampling=tts_pb2.SamplingOptions(seed=SEED, max_new_tokens=FRAMES_PER_SEGMENT),
        output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
        timestamps=tts_pb2.TIMESTAMP_UNIT_WORD,
    )


@pytest.fixture(scope="module")
def grpc_result(stack: dict[str, Any]) -> tuple[str, list[tts_pb2.SynthesizeResponse]]:
    text = long_text()
    with grpc.insecure_channel(f"127.0.0.1:{stack['grpc']}") as channel:
        responses = list(tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(_grpc_request(text), timeout=300))
    return text, responses


def test_grpc_multi_segment_word_timings(grpc_result: tuple[str, list[tts_pb2.SynthesizeResponse]]) -> None:
    text, responses = grpc_result
    kinds = [r.WhichOneof("payload") for r in responses]
    assert kinds[0] == "metadata" and kinds[-1] == "summary"
    summary = responses[-1].summary
    segments = list(summary.segments)
    assert len(segments) >= 2, "the text must be spoken in several segments"
    audio = sum(r.audio.num_samples for r in responses if r.WhichOneof("payload") == "audio")
    assert audio == summary.num_samples
    messages = [r.timestamps for r in responses if r.WhichOneof("payload") == "timestamps"]
    # One message per segment, after that segment's audio, before the summary.
    assert sorted(m.index for m in messages) == list(range(len(segments)))
    assert all(not m.error and m.unit == tts_pb2.TIMESTAMP_UNIT_WORD for m in messages)
    sent = 0
    for response in responses:
        if response.WhichOneof("payload") == "audio":
            sent = response.audio.start_sample + response.audio.num_samples
        elif response.WhichOneof("payload") == "timestamps":
            segment = segments[response.timestamps.index]
            assert sent >= segment.start_sample + segment.num_samples, "timings before their audio"
    units = []
    for message in sorted(messages, key=lambda m: m.index):
        segment = segments[message.index]
        for unit in message.units:  # inside its own segment's text and audio
            assert segment.text_start <= unit.char_start < unit.char_end <= segment.text_end
            assert segment.start_sample <= unit.start_sample <= unit.end_sample
            assert unit.end_sample <= segment.start_sample + segment.num_samples
            units.append(
                {
                    "text": unit.text,
                    "char_start": unit.char_start,
                    "char_end": unit.char_end,
                    "start": unit.start_sample,
                    "end": unit.end_sample,
                }
            )
    check_units(text, units, summary.num_samples)


def test_openai_sse_stream_carries_the_same_timings(
    stack: dict[str, Any], grpc_result: tuple[str, list[tts_pb2.SynthesizeResponse]]
) -> None:
    """The same seeded request over HTTP SSE: ``speech.audio.timestamps`` events whose words are
    the gRPC units in seconds (the same audio, so the same alignment)."""
    text, responses = grpc_result
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack['http']}/v1", api_key="unused", max_retries=0)
    with client.audio.speech.with_streaming_response.create(
        model="",
        input=text,
        voice="",
        instructions="A calm, clear voice.",
        response_format="pcm",
        stream_format="sse",
        timeout=300,
        extra_body={
            "language": "English",
            "seed": SEED,
            "max_new_tokens": FRAMES_PER_SEGMENT,
            "timestamps": "word",
        },
    ) as response:
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    seconds = len(pcm) / 2 / SAMPLE_RATE
    timed = [e for e in events if e["type"] == "speech.audio.timestamps"]
    assert len(timed) == events[-1]["summary"]["num_segments"] >= 2
    words = sorted((w for e in timed for w in e["words"]), key=lambda w: w["char_start"])
    check_units(text, words, seconds + 1e-6)
    grpc_units = [u for r in responses if r.WhichOneof("payload") == "timestamps" for u in r.timestamps.units]
    grpc_units.sort(key=lambda u: u.char_start)
    assert len(grpc_units) == len(words)
    for word, unit in zip(words, grpc_units):
        assert word["text"] == unit.text
        assert word["start"] == pytest.approx(unit.start_sample / SAMPLE_RATE, abs=1e-3)
        assert word["end"] == pytest.approx(unit.end_sample / SAMPLE_RATE, abs=1e-3)


def test_websocket_streamed_text_timings(stack: dict[str, Any]) -> None:
    """Streamed text over the WebSocket, three utterances (flush), split inside words: one
    ``speech.audio.timestamps`` message per utterance; together one timing per word of the
    concatenated text, spans over it."""
    utterances = [SENTENCES[0], " " + SENTENCES[1], " " + SENTENCES[2]]
    text = "".join(utterances)

    async def main() -> tuple[list[dict[str, Any]], int]:
        url = f"ws://127.0.0.1:{stack['http']}/v1/audio/speech/stream"
        messages: list[dict[str, Any]] = []
        audio_bytes = 0
        async with connect(url, max_size=None, open_timeout=30) as ws:
            config = {
                "type": "config",
                "voice": "",
                "instructions": "A calm, clear voice.",
                "language": "English",
                "seed": SEED,
                "max_new_tokens": FRAMES_PER_SEGMENT,
                "timestamps": "word",
            }
            await ws.send(json.dumps(config))
            for utterance in utterances:
                for cut in range(0, len(utterance), 7):  # pieces that split words
                    await ws.send(json.dumps({"type": "text", "text": utterance[cut : cut + 7]}))
                await ws.send(json.dumps({"type": "flush"}))
            await ws.send(json.dumps({"type": "end"}))
            async for frame in ws:
                if isinstance(frame, bytes):
                    audio_bytes += len(frame)
                else:
                    message = json.loads(frame)
                    assert message["type"] != "error", message
                    messages.append(message)
        return messages, audio_bytes

    messages, audio_bytes = asyncio.run(asyncio.wait_for(main(), timeout=300))
    timed = [m for m in messages if m["type"] == "speech.audio.timestamps"]
    assert len(timed) == len(utterances)
    words = sorted((w for m in timed for w in m["words"]), key=lambda w: w["char_start"])
    check_units(text, words, audio_bytes / 2 / SAMPLE_RATE + 1e-6)
    assert messages[-1]["type"] == "summary"


def test_say_writes_captions(stack: dict[str, Any], tmp_path: Path) -> None:
    """``qwen3-tts say --captions``: the words of the text in SubRip cues, in order."""
    text = " ".join(SENTENCES[:3])
    out = tmp_path / "out.srt"
    subprocess.run(
        [
            sys.executable, "-m", "qwen3_tts.cli", "say", text, "--gateway", f"127.0.0.1:{stack['grpc']}",
            "--instruct", "A calm voice.", "--seed", str(SEED), "--max-new-tokens", "24",
            "-o", str(tmp_path / "out.wav"), "--captions", str(out),
        ],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    blocks = out.read_text(encoding="utf-8").strip().split("\n\n")
    assert [b.split("\n")[0] for b in blocks] == [str(n) for n in range(1, len(blocks) + 1)]
    assert " ".join(b.split("\n", 2)[2] for b in blocks).split() == text.split()


def test_offline_synthesize_writes_the_gateway_s_timings(
    stack: dict[str, Any], grpc_result: tuple[str, list[tts_pb2.SynthesizeResponse]], tmp_path: Path
) -> None:
    """``qwen3-tts synthesize --timestamps``: the same request offline (same audio, segment by
    segment) with the aligner in process gives the gateway's timings, in seconds."""
    text, responses = grpc_result
    out = tmp_path / "t.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "qwen3_tts.cli", "synthesize", "--model", str(stack["dev"] / "voice_design"),
            "--text", text, "--instruct", "A calm, clear voice.", "--language", "English",
            "--seed", str(SEED), "--max-new-tokens", str(FRAMES_PER_SEGMENT),
            "--out", str(tmp_path / "o.wav"), "--timestamps", str(out),
            "--aligner-model", str(stack["dev"] / "forced_aligner"),
        ],
        check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["text"] == text
    summary = responses[-1].summary
    assert document["duration"] * SAMPLE_RATE == pytest.approx(summary.num_samples), (
        [(s.text_start, s.text_end, s.num_samples, s.seed) for s in summary.segments],
        proc.stdout,
    )
    check_units(text, document["words"], document["duration"])
    units = sorted(
        (u for r in responses if r.WhichOneof("payload") == "timestamps" for u in r.timestamps.units),
        key=lambda u: u.char_start,
    )
    assert [(w["text"], w["char_start"], w["char_end"]) for w in document["words"]] == [
        (u.text, u.char_start, u.char_end) for u in units
    ]
    for word, unit in zip(document["words"], units):
        assert word["start"] == pytest.approx(unit.start_sample / SAMPLE_RATE, abs=1e-3)
        assert word["end"] == pytest.approx(unit.end_sample / SAMPLE_RATE, abs=1e-3)
