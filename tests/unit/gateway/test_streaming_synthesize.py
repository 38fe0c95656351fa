"""Gateway StreamingSynthesize against fake stages: text deltas reach the talker as one text_open
request (AppendText/EndText), responses like Synthesize plus utterance ends, flush, cancel
(barge-in), cut of a long stream, and every bad-input status and message."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import Sequence

import grpc
import numpy as np
import soundfile as sf
from prometheus_client import REGISTRY

from tests.helpers.fake_stages import (
    Harness,
    expect_rpc_error,
    expect_streaming_error,
    expected_signal,
    run,
)
from tests.helpers.synthesis import responses_audio
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.segments import segment_seed

FLOAT32 = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)
Message = tts_pb2.StreamingSynthesizeRequest


def config(**kwargs: object) -> Message:
    base: dict[str, object] = {
        "request_id": "stream-1",
        "speaker": "Vivian",
        "output": FLOAT32,
        "sampling": tts_pb2.SamplingOptions(seed=77),
    }
    base.update(kwargs)
    return Message(config=tts_pb2.SynthesizeRequest(**base))  # type: ignore[arg-type]


def text(delta: str) -> Message:
    return Message(text=delta)


FLUSH = Message(flush=tts_pb2.FlushText())
CANCEL = Message(cancel=tts_pb2.CancelUtterance())


async def stream(
    h: Harness, messages: Sequence[Message], timeout: float = 10.0
) -> list[tts_pb2.SynthesizeResponse]:
    return [r async for r in h.stub.StreamingSynthesize(iter(messages), timeout=timeout)]


async def read_all(call: grpc.aio.StreamStreamCall) -> list[tts_pb2.SynthesizeResponse]:
    responses = []
    while (r := await call.read()) is not grpc.aio.EOF:
        responses.append(r)
    return responses


def kinds(responses: Sequence[tts_pb2.SynthesizeResponse]) -> list[str]:
    return [str(r.WhichOneof("payload")) for r in responses]


def test_deltas_reach_the_talker_as_one_open_request_and_audio_streams() -> None:
    async def main() -> None:
        async with Harness(frames=7) as h:
            deltas = ["Hel", "lo the", "re, how a", "re you? ", "Fine."]
            responses = await stream(h, [config(), *map(text, deltas)])
            assert kinds(responses)[0] == "metadata" and kinds(responses)[-1] == "summary"
            assert kinds(responses)[-2] == "utterance_end"
            assert set(kinds(responses)[1:-2]) == {"audio"}
            meta = responses[0].metadata
            assert meta.request_id == "stream-1" and meta.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING
            assert meta.sampling.seed == 77
            request = h.talker.requests[0]
            assert request.text_open and request.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING
            assert request.text + "".join(
                m for m in h.talker.text_messages["stream-1"] if m != "<end>"
            ) == "".join(deltas)
            assert h.talker.texts["stream-1"] == "".join(deltas)
            assert h.talker.text_messages["stream-1"][-1] == "<end>"
            np.testing.assert_array_equal(responses_audio(responses), expected_signal(7))
            starts = [r.audio.start_sample for r in responses if r.HasField("audio")]
            sizes = [r.audio.num_samples for r in responses if r.HasField("audio")]
            assert starts == list(np.cumsum([0, *sizes[:-1]]))
            end = responses[-2].utterance_end
            assert (end.index, end.text_start, end.text_end) == (0, 0, len("".join(deltas)))
            assert (end.start_sample, end.num_samples) == (0, 7 * 1920)
            assert end.finish_reason == tts_pb2.FINISH_REASON_EOS and end.seed == 77
            summary = responses[-1].summary
            assert summary.num_samples == 7 * 1920 and summary.num_segments == 1
            assert summary.finish_reason == tts_pb2.FINISH_REASON_EOS

    run(main())


def test_flush_starts_the_next_utterance_with_the_same_configuration() -> None:
    async def main() -> None:
        async with Harness(frames=3) as h:
            responses = await stream(h, [config(), text("One two."), FLUSH, text(" Three"), text(" four.")])
            ends = [r.utterance_end for r in responses if r.HasField("utterance_end")]
            assert [e.index for e in ends] == [0, 1]
            assert [e.seed for e in ends] == [77, segment_seed(77, 1)]
            assert [(e.text_start, e.text_end) for e in ends] == [(0, 8), (8, 20)]
            assert [e.start_sample for e in ends] == [0, 3 * 1920]
            assert h.talker.texts == {"stream-1": "One two.", "stream-1/1": " Three four."}
            assert [r.speaker for r in h.talker.requests] == ["vivian", "vivian"]
            assert [r.sampling.seed for r in h.talker.requests] == [77, segment_seed(77, 1)]
            summary = responses[-1].summary
            assert summary.num_segments == 2 and summary.num_samples == 6 * 1920
            assert [s.text_end for s in summary.segments] == [8, 20]

    run(main())


def test_a_stream_longer_than_a_segment_is_cut_at_sentence_ends() -> None:
    async def main() -> None:
        async with Harness(frames=2, segment_tokens=24) as h:
            sentences = [f"Sentence number {n} is here and it has some words." for n in range(6)]
            whole = " ".join(sentences)
            deltas = [whole[i : i + 7] for i in range(0, len(whole), 7)]
            responses = await stream(h, [config(), *map(text, deltas)])
            texts = [h.talker.texts[r.request_id] for r in h.talker.requests]
            assert len(texts) > 1
            assert "".join(texts) == whole
            assert all(t.rstrip().endswith(".") for t in texts)
            assert responses[-1].summary.num_segments == len(texts)

    run(main())


def test_cancel_stops_the_utterance_at_once_and_the_stream_goes_on() -> None:
    async def main() -> None:
        async with Harness(frames=400, delay=0.01) as h:
            before = (
                REGISTRY.get_sample_value("qwen3tts_cancelled_utterances_total", {"stage": "gateway"}) or 0
            )
            call = h.stub.StreamingSynthesize(timeout=15)
            await call.write(
                config(streaming=tts_pb2.StreamingOptions(first_chunk_frames=1, max_chunk_frames=1))
            )
            await call.write(text("Hello there, this is a long one "))
            responses = [await call.read()]  # metadata
            while not (r := await call.read()).HasField("audio"):
                responses.append(r)
            responses.append(r)
            assert h.talker.active == 1
            await call.write(CANCEL)
            while not (r := await call.read()).HasField("utterance_end"):
                responses.append(r)  # audio sent before the cancel was processed
            ack = r.utterance_end
            sent = sum(x.audio.num_samples for x in responses if x.HasField("audio"))
            assert ack.index == 0 and ack.finish_reason == tts_pb2.FINISH_REASON_CANCELLED
            assert (ack.start_sample, ack.num_samples) == (0, sent)
            # The talker call is cancelled: its slot is free.
            await asyncio.wait_for(h.talker.stopped.wait(), 5)
            for _ in range(100):
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.talker.active == 0
            h.talker.frames = 3
            await call.write(text("Again."))
            await call.done_writing()
            rest = await read_all(call)
            assert kinds(rest)[-2:] == ["utterance_end", "summary"]
            assert set(kinds(rest)[:-2]) == {"audio"}
            assert sum(r.audio.num_samples for r in rest if r.HasField("audio")) == 3 * 1920
            assert rest[0].audio.start_sample == sent
            end = rest[-2].utterance_end
            assert (end.index, end.start_sample, end.num_samples) == (1, sent, 3 * 1920)
            assert end.finish_reason == tts_pb2.FINISH_REASON_EOS
            assert h.talker.texts["stream-1/1"] == "Again."
            assert "stream-1" not in h.talker.texts  # the cancelled text never ended
            summary = rest[-1].summary
            assert summary.num_samples == sent + 3 * 1920 and summary.num_segments == 2
            assert [s.finish_reason for s in summary.segments] == [
                tts_pb2.FINISH_REASON_CANCELLED,
                tts_pb2.FINISH_REASON_EOS,
            ]
            after = REGISTRY.get_sample_value("qwen3tts_cancelled_utterances_total", {"stage": "gateway"})
            assert after == before + 1

    run(main())


def test_cancel_with_nothing_to_stop_is_ignored() -> None:
    async def main() -> None:
        async with Harness(frames=2) as h:
            responses = await stream(h, [config(), CANCEL, text("Hi."), FLUSH, text("Yes.")])
            ends = [r.utterance_end for r in responses if r.HasField("utterance_end")]
            assert [(e.index, e.finish_reason) for e in ends] == [
                (0, tts_pb2.FINISH_REASON_EOS),
                (1, tts_pb2.FINISH_REASON_EOS),
            ]

    run(main())


def test_bad_input_statuses_and_messages() -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[list[Message], str]] = [
        ([], "the stream ended before its first message (the configuration, `config`)"),
        ([text("Hi.")], "the first message must be the configuration (`config`), got `text`"),
        ([FLUSH], "the first message must be the configuration (`config`), got `flush`"),
        ([Message()], "the first message must be the configuration (`config`), got an empty message"),
        (
            [config(), text("Hi."), config()],
            "a second configuration (`config`): it may be sent only once, first",
        ),
        ([config(), Message()], "an empty message: set one of text, flush or cancel"),
        ([config(text="Hello.")], "config.text must be empty: send the text in `text` messages"),
        ([config(speaker="nobody"), text("Hi.")], "unknown speaker"),
        ([config(sampling=tts_pb2.SamplingOptions(temperature=-1))], "temperature"),
        ([config(), text("0123456789"), text("0123456789"), text("x")], "text is too long: 21 characters"),
        (
            [config()],
            "no text to speak: the stream ended (half-close) before any text with a letter or digit",
        ),
        ([config(), text("   "), FLUSH, text("...")], "no text to speak"),
    ]

    async def main() -> None:
        async with Harness(frames=2, max_text_chars=20) as h:
            for messages, expected in cases:
                error = await expect_streaming_error(h, messages)
                assert error.code() is invalid, (messages, error)
                assert expected in (error.details() or ""), (expected, error.details())
            for _ in range(100):  # a started talker call is cancelled as the call fails
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.talker.active == 0

    run(main())


def test_idle_text_ends_with_deadline_exceeded_and_frees_the_slot() -> None:
    async def main() -> None:
        async with Harness(frames=2, text_idle_timeout_seconds=0.3) as h:
            call = h.stub.StreamingSynthesize(timeout=10)
            await call.write(config())
            await call.write(text("Hello there "))
            error = await expect_rpc_error(call)
            assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "no message for 0.3 s" in (error.details() or "")
            for _ in range(100):
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.talker.active == 0 and h.talker.stopped.is_set()

    run(main())


def test_say_stream_text_sends_stdin_as_it_arrives(tmp_path, monkeypatch) -> None:
    from qwen3_tts.cli import build_parser

    async def main() -> None:
        async with Harness(frames=4) as h:
            read_end, write_end = os.pipe()
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(open(read_end, "rb", buffering=0)))
            out = tmp_path / "say.wav"
            args = build_parser().parse_args(
                [
                    "say",
                    "--stream-text",
                    "--gateway",
                    f"127.0.0.1:{h.port}",
                    "--speaker",
                    "vivian",
                    "-o",
                    str(out),
                ]
            )
            said = asyncio.create_task(asyncio.to_thread(args.func, args))
            text = "Grüße aus dem Text, der noch geschrieben wird."
            data = text.encode()
            for piece in (data[:3], data[3:4], data[4:20], data[20:]):  # 3:4 splits the "ü"
                os.write(write_end, piece)
                await asyncio.sleep(0.05)
            for _ in range(250):  # the call starts once the first text arrives; allow a busy machine
                if h.talker.requests:
                    break
                await asyncio.sleep(0.02)
            assert not said.done()  # still reading: the text is open
            assert h.talker.requests and h.talker.requests[0].text_open
            os.close(write_end)
            assert await said == 0
            assert list(h.talker.texts.values()) == [text]
            audio, rate = sf.read(out, dtype="float32")
            assert rate == 24000
            np.testing.assert_array_equal(audio, expected_signal(4))

    run(main())


def test_api_keys_guard_the_streaming_call() -> None:
    async def main() -> None:
        async with Harness(frames=1, api_keys=frozenset({"k1"})) as h:
            error = await expect_streaming_error(h, [config()])
            assert error.code() is grpc.StatusCode.UNAUTHENTICATED
            messages = [config(), text("Hi.")]
            call = h.stub.StreamingSynthesize(
                iter(messages), timeout=10, metadata=(("authorization", "Bearer k1"),)
            )
            assert kinds([r async for r in call])[-1] == "summary"

    run(main())
