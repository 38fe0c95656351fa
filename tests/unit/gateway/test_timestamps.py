"""Word timestamps over gRPC against fake stages and a fake aligner
(tests/helpers/fake_aligner.py): one ``timestamps`` message per utterance, units that tile the
words of the request's (or the streamed) text and lie inside the audio sent, exactly where the
aligner put them after resampling, ``speed`` and earlier segments; alignment off the audio
path; FAILED_PRECONDITION without an aligner; an aligner failure that leaves the audio alone;
the last unit sent whole named at a barge-in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.encoding import AudioOutput
from gateway.stages.errors import StageError
from gateway.synthesis import timestamps
from gateway.synthesis.responses import OutputPlan, ResponseBuilder
from gateway.synthesis.timestamps import Timestamper, queued_responses, timed_units
from gateway.voice_library import NO_KEYS
from tests.helpers.fake_aligner import (
    FakeAligner,
    fake_times,
    fake_units,
    harness_with_aligner,
)
from tests.helpers.fake_stages import (
    SAMPLES_PER_FRAME,
    Harness,
    expect_rpc_error,
    expect_streaming_error,
    expected_signal,
    run,
)
from tests.helpers.ports import free_port
from tests.unit.gateway.test_validation import wav_bytes
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.text import estimate_tokens, segment_text

NATIVE = 24000
FLOAT32 = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)
WORD = tts_pb2.TIMESTAMP_UNIT_WORD
Message = tts_pb2.StreamingSynthesizeRequest
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It's 3 o'clock, isn't it?",
    "Then we went home, slowly, along the river.",
    "See you soon!",
]
TEXT = " ".join(f"{take}, {s}" for take in ("First", "Second") for s in SENTENCES)


def request(text: str = TEXT, **kwargs: object) -> tts_pb2.SynthesizeRequest:
    base: dict[str, object] = {
        "text": text,
        "speaker": "Vivian",
        "language": "English",
        "output": FLOAT32,
        "timestamps": WORD,
        "sampling": tts_pb2.SamplingOptions(seed=5),
    }
    base.update(kwargs)
    return tts_pb2.SynthesizeRequest(**base)  # type: ignore[arg-type]


def kinds(responses: Sequence[tts_pb2.SynthesizeResponse]) -> list[str]:
    return [str(r.WhichOneof("payload")) for r in responses]


def expected_units(
    text: str, start: int, text_start: int, samples: int
) -> list[tuple[str, int, int, int, int]]:
    """What the fake aligner's answer for one utterance must become on a native-rate output."""
    units = fake_units(text, stages_pb2.ALIGN_UNIT_WORD)
    times = fake_times(len(units), samples / NATIVE * 1000)
    return [
        (
            u,
            text_start + a,
            text_start + b,
            start + round(s * NATIVE / 1000),
            start + round(e * NATIVE / 1000),
        )
        for (u, a, b), (s, e) in zip(units, times)
    ]


def as_tuples(units: Sequence[tts_pb2.TimedUnit]) -> list[tuple[str, int, int, int, int]]:
    return [(u.text, u.char_start, u.char_end, u.start_sample, u.end_sample) for u in units]


# --- the mapping, exactly ---------------------------------------------------------------------


WORDS = st.lists(
    st.text(alphabet="abcxyzé'.,!? 0123日本", min_size=0, max_size=8), min_size=1, max_size=6
).map(" ".join)


@settings(max_examples=120, deadline=None)
@given(
    utterances=st.lists(st.tuples(WORDS, st.integers(0, 4 * SAMPLES_PER_FRAME)), min_size=1, max_size=4),
    rate=st.sampled_from([NATIVE, 8000, 16000, 22050, 44100, 48000]),
    speed=st.one_of(st.just(1.0), st.floats(0.25, 4.0)),
)
def test_units_are_monotonic_inside_their_audio_and_tile_the_words(
    utterances: list[tuple[str, int]], rate: int, speed: float
) -> None:
    async def main() -> None:
        output = AudioOutput(tts_pb2.AUDIO_ENCODING_FLOAT32, rate, NATIVE, speed=speed)
        builder = ResponseBuilder(
            tts_pb2.SynthesisMetadata(), OutputPlan(tts_pb2.AUDIO_ENCODING_FLOAT32, rate, 2, 25), output, 0.0
        )
        whole = ""
        native = 0
        timed: list[tuple[int, str, int, list[tts_pb2.TimedUnit]]] = []
        for index, (text, samples) in enumerate(utterances):
            text_start = len(whole)
            whole += text
            await builder.audio(index, np.zeros(samples, dtype=np.float32))
            reply = stages_pb2.AlignResponse()
            units = fake_units(text, stages_pb2.ALIGN_UNIT_WORD)
            for (u, a, b), (s, e) in zip(units, fake_times(len(units), samples / NATIVE * 1000)):
                reply.units.add(text=u, char_start=a, char_end=b, start_ms=s, end_ms=e)
            place = lambda offset, index=index: builder.output_sample(index, offset)  # noqa: E731
            timed.append(
                (native, text, text_start, timed_units(reply, text, text_start, samples, NATIVE, place))
            )
            native += samples
        await builder.finish()
        sent = builder.num_samples
        previous_end = 0
        for index, (first, text, text_start, units) in enumerate(timed):
            span = builder.utterance_span(index)
            # One unit per word of the utterance's text, in order, spans into the whole text.
            assert [u.text for u in units] == [w for w, _, _ in fake_units(text, stages_pb2.ALIGN_UNIT_WORD)]
            char_end = text_start
            for unit in units:
                assert whole[unit.char_start : unit.char_end] == unit.text
                assert char_end <= unit.char_start <= unit.char_end <= text_start + len(text)
                char_end = unit.char_end
                # Monotonic, inside the utterance's audio as sent, inside the stream.
                assert previous_end <= unit.start_sample <= unit.end_sample <= sent
                assert span.start_sample <= unit.start_sample
                assert unit.end_sample <= span.start_sample + span.num_samples
                previous_end = unit.end_sample
            # Where the aligner put them: native time, through speed and the rate change.
            step = utterances[index][1] / max(len(units), 1)
            for k, unit in enumerate(units):
                for sample, native_offset in (
                    (unit.start_sample, k * step),
                    (unit.end_sample, (k + 1) * step),
                ):
                    ideal = (first + native_offset) / speed * rate / NATIVE
                    # Rounding: the time to a native sample (half a sample, through speed),
                    # the time-scaled length (half a sample), the resampled length (one).
                    tolerance = 0.5 * (1 / speed + 1) * rate / NATIVE + 1 + 1e-6
                    assert abs(sample - ideal) <= tolerance, (sample, ideal, tolerance)

    asyncio.run(main())


def test_an_answer_outside_the_text_is_refused() -> None:
    reply = stages_pb2.AlignResponse()
    reply.units.add(text="x", char_start=2, char_end=9, start_ms=0, end_ms=1)
    try:
        timed_units(reply, "abc", 0, 100, NATIVE, lambda o: o)
    except ValueError as exc:
        assert "spans [2, 9)" in str(exc)
    else:
        raise AssertionError("accepted a span outside the text")


# --- Synthesize ---------------------------------------------------------------------------------


def test_synthesize_sends_one_timing_message_per_segment_after_its_audio() -> None:
    async def main() -> None:
        aligner = FakeAligner()
        async with harness_with_aligner(aligner, frames=4, segment_tokens=20) as h:
            responses = [r async for r in h.stub.Synthesize(request(), timeout=10)]
        assert kinds(responses)[0] == "metadata" and kinds(responses)[-1] == "summary"
        summary = responses[-1].summary
        assert summary.num_segments > 2
        timestamps = [r.timestamps for r in responses if r.HasField("timestamps")]
        assert sorted(t.index for t in timestamps) == list(range(summary.num_segments))
        for segment in summary.segments:
            (position,) = [
                i
                for i, r in enumerate(responses)
                if r.HasField("timestamps") and r.timestamps.index == segment.index
            ]
            message = responses[position].timestamps
            assert message.unit == WORD and not message.error
            text = TEXT[segment.text_start : segment.text_end]
            assert as_tuples(message.units) == expected_units(
                text, segment.start_sample, segment.text_start, segment.num_samples
            )
            # It follows every audio chunk of its segment.
            sent_before = sum(r.audio.num_samples for r in responses[:position] if r.HasField("audio"))
            assert sent_before >= segment.start_sample + segment.num_samples
        # The aligner heard each segment's native audio with its text and language.
        assert sorted(r.text for r in aligner.requests) == sorted(r.text for r in h.talker.requests)
        for sent in aligner.requests:
            assert sent.sample_rate == NATIVE and sent.language == "english"
            assert sent.unit == stages_pb2.ALIGN_UNIT_WORD
            np.testing.assert_array_equal(np.frombuffer(sent.pcm, "<f4"), expected_signal(4))

    run(main())


def test_the_aligner_gets_the_request_s_language_as_planned() -> None:
    """The gateway passes the language as planned ("auto" without one): the aligner's own word
    split decides what "auto" means (one rule, in aligner_service.text)."""

    async def main() -> None:
        aligner = FakeAligner()
        async with harness_with_aligner(aligner, frames=2) as h:
            for language in ("", "Auto", "Chinese"):
                [r async for r in h.stub.Synthesize(request("Hi there.", language=language), timeout=10)]
        assert [r.language for r in aligner.requests] == ["auto", "auto", "chinese"]

    run(main())


def test_timings_follow_resampling() -> None:
    async def main() -> None:
        async with harness_with_aligner(frames=5) as h:
            output = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32, sample_rate=16000)
            responses = [
                r async for r in h.stub.Synthesize(request("One two three four.", output=output), timeout=10)
            ]
        summary = responses[-1].summary
        (message,) = [r.timestamps for r in responses if r.HasField("timestamps")]
        assert [u.text for u in message.units] == ["One", "two", "three", "four"]
        assert message.units[-1].end_sample <= summary.num_samples
        assert message.units[0].start_sample == 0
        # 5 frames at 16 kHz: 6400 samples; four even units of 1600 each (speed: the property test).
        assert [u.end_sample for u in message.units] == [1600, 3200, 4800, 6400]

    run(main())


def test_a_slow_aligner_never_holds_back_audio() -> None:
    async def main() -> None:
        aligner = FakeAligner()
        aligner.gate = asyncio.Event()
        async with harness_with_aligner(aligner, frames=4, segment_tokens=20) as h:
            segments = len(segment_text(TEXT, 20, estimate_tokens))
            assert segments > 2
            call = h.stub.Synthesize(request(), timeout=10)
            audio = 0
            # Every segment's audio arrives while the aligner holds every answer.
            while audio < segments * 4 * SAMPLES_PER_FRAME:
                response = await call.read()
                assert response.WhichOneof("payload") in ("metadata", "audio"), response
                audio += response.audio.num_samples
            for _ in range(200):
                if len(aligner.requests) == segments:
                    break
                await asyncio.sleep(0.01)
            assert len(aligner.requests) == segments and aligner.answered == 0
            aligner.gate.set()
            rest = []
            while (r := await call.read()) is not grpc.aio.EOF:
                rest.append(r)
            assert kinds(rest) == ["timestamps"] * segments + ["summary"]
            assert rest[-1].summary.num_samples == audio

    run(main())


def test_a_slow_client_paces_the_stages_with_timestamps_on() -> None:
    """The client's pace is the stages' pace: read slowly, the gateway starts no more segments
    than the one being read and its lookahead (plus the one whose start the pull may be
    awaiting), however fast the talker and the aligner are. Read in process, so no transport
    buffer hides what the gateway itself holds."""

    async def main() -> None:
        async with harness_with_aligner(FakeAligner(), frames=4, segment_tokens=20, segment_lookahead=1) as h:
            segments = len(segment_text(TEXT, 20, estimate_tokens))
            assert segments > 5
            per_segment = 4 * SAMPLES_PER_FRAME
            responses = h.gateway.unary.synthesize(
                request(), "slow-client", caller=NO_KEYS, received=time.monotonic()
            )
            produced_ahead = []
            audio = 0
            seen: list[str] = []
            async for response in responses:
                seen.append(str(response.WhichOneof("payload")))
                audio += response.audio.num_samples
                await asyncio.sleep(0.03)  # a slow reader; the fake talker is ~6x faster
                read_whole = audio // per_segment
                produced_ahead.append(len(h.talker.requests) - read_whole)
            assert seen.count("timestamps") == segments and seen[-1] == "summary"
        # Read, the current one, its lookahead, one more being pulled: never the whole text.
        assert max(produced_ahead) <= 3, produced_ahead

    run(main(), timeout=60)


def test_an_aligner_failure_leaves_the_audio_and_says_so() -> None:
    async def main() -> None:
        async with harness_with_aligner(FakeAligner(fail=True), frames=3) as h:
            responses = [r async for r in h.stub.Synthesize(request("Hello there."), timeout=10)]
        assert kinds(responses) == ["metadata", "audio", "audio", "timestamps", "summary"]
        message = responses[-2].timestamps
        assert not message.units and "fake aligner refuses this audio" in message.error
        assert responses[-1].summary.num_samples == 3 * SAMPLES_PER_FRAME

    run(main())


def test_an_unexpected_failure_names_the_request_not_its_internals() -> None:
    """Like every error the API gives (issue 29), an utterance's ``error`` shows no exception
    class, repr or path of an unexpected failure: the request id to quote (the log has the
    rest). A stage's own error is still told as it is."""

    class Builder:
        def output_sample(self, index: int, offset: int) -> int:
            return offset

    class Stage:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        async def align(self, *args: object) -> stages_pb2.AlignResponse:
            raise self.exc

    async def error_of(exc: Exception) -> str:
        ready: asyncio.Queue[object] = asyncio.Queue()
        timings = Timestamper(
            Stage(exc),  # type: ignore[arg-type]
            WORD,
            "English",
            Builder(),  # type: ignore[arg-type]
            ready,
            "req-7",
            sample_rate=NATIVE,
        )
        timings.add_audio(0, np.zeros(NATIVE // 10, dtype=np.float32))
        timings.complete(0, "Hello there.", 0)
        await timings.finish()
        (response,) = queued_responses(ready)
        assert not response.timestamps.units
        return response.timestamps.error

    async def main() -> None:
        error = await error_of(RuntimeError("<Thing object at 0x7f3a00> in /srv/app/secret.py"))
        assert "req-7" in error
        assert not any(leak in error for leak in ("0x7f3a00", "secret.py", "RuntimeError", "Thing"))
        refused = StageError("aligner", grpc.StatusCode.INVALID_ARGUMENT, "audio: too short")
        assert await error_of(refused) == str(refused)

    run(main())


def test_without_an_aligner_timestamps_are_failed_precondition() -> None:
    async def main() -> None:
        async with Harness(frames=2) as h:
            error = await expect_rpc_error(h.stub.Synthesize(request("Hi."), timeout=5))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "this server has no aligner stage" in (error.details() or "")
            error = await expect_streaming_error(
                h, [Message(config=request("")), Message(text="Hi.")], timeout=5
            )
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert not (await h.stub.ListModels(tts_pb2.ListModelsRequest())).models[0].timestamps_supported
            # Without timestamps nothing changes.
            responses = [r async for r in h.stub.Synthesize(request("Hi.", timestamps=0), timeout=5)]
            assert "timestamps" not in kinds(responses)
            error = await expect_rpc_error(h.stub.Synthesize(request("Hi.", timestamps=7), timeout=5))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "timestamps: unknown value 7" in (error.details() or "")
        async with harness_with_aligner(frames=2) as h:
            assert (await h.stub.ListModels(tts_pb2.ListModelsRequest())).models[0].timestamps_supported

    run(main())


def test_without_an_aligner_timestamps_are_refused_before_any_work() -> None:
    """FAILED_PRECONDITION comes before admission and preparation: no voice clone on the
    speaker stage, no admitted stream, even at capacity (where it is still the answer, not
    RESOURCE_EXHAUSTED: a retry could never succeed)."""

    async def main() -> None:
        async with Harness("base", frames=2, max_concurrent_streams=1) as h:
            clone = tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
            cloned = request("Hi.", speaker="", clone=clone)
            error = await expect_rpc_error(h.stub.Synthesize(cloned, timeout=5))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
            error = await expect_streaming_error(
                h, [Message(config=request("", speaker="", clone=clone))], timeout=5
            )
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
            assert h.speaker.requests == [] and h.talker.requests == []
            # At capacity (one stream held open), still FAILED_PRECONDITION.
            held = h.stub.Synthesize(request("Hi.", speaker="", clone=clone, timestamps=0), timeout=5)
            assert (await held.read()).WhichOneof("payload") == "metadata"
            error = await expect_rpc_error(h.stub.Synthesize(cloned, timeout=5))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
            held.cancel()

    run(main())


# --- StreamingSynthesize ------------------------------------------------------------------------


def test_streamed_utterances_get_spans_in_the_streamed_text() -> None:
    async def main() -> None:
        flush = Message(flush=tts_pb2.FlushText())
        deltas = ["One tw", "o three.", None, " Four, fi", "ve!", None, " Six."]
        messages = [Message(config=request(""))] + [flush if d is None else Message(text=d) for d in deltas]
        whole = "".join(d for d in deltas if d)
        async with harness_with_aligner(frames=3) as h:
            responses = [r async for r in h.stub.StreamingSynthesize(iter(messages), timeout=10)]
        ends = [r.utterance_end for r in responses if r.HasField("utterance_end")]
        timestamps = {r.timestamps.index: r.timestamps for r in responses if r.HasField("timestamps")}
        assert kinds(responses)[-1] == "summary" and sorted(timestamps) == [0, 1, 2]
        words = []
        for end in ends:
            text = whole[end.text_start : end.text_end]
            units = timestamps[end.index].units
            assert as_tuples(units) == expected_units(text, end.start_sample, end.text_start, end.num_samples)
            words += [whole[u.char_start : u.char_end] for u in units]
        assert words == ["One", "two", "three", "Four", "five", "Six"]

    run(main())


def test_a_barge_in_names_the_last_word_sent_whole() -> None:
    async def main() -> None:
        async with harness_with_aligner(frames=400, delay=0.01) as h:
            call = h.stub.StreamingSynthesize(timeout=15)
            chunks = tts_pb2.StreamingOptions(first_chunk_frames=1, max_chunk_frames=1)
            await call.write(Message(config=request("", streaming=chunks)))
            said = "Hello there, this is a long one "
            await call.write(Message(text=said))
            audio = 0
            while audio < 6 * SAMPLES_PER_FRAME:
                audio += (await call.read()).audio.num_samples
            await call.write(Message(cancel=tts_pb2.CancelUtterance()))
            while not (r := await call.read()).HasField("utterance_end"):
                assert r.HasField("audio")
            ack = r.utterance_end
            assert ack.finish_reason == tts_pb2.FINISH_REASON_CANCELLED
            # The fake aligner spreads the words it was sent over the audio sent: all but the
            # last end before the audio stops.
            text = said[ack.text_start : ack.text_end]
            words = fake_units(text, stages_pb2.ALIGN_UNIT_WORD)
            last = ack.last_unit
            assert (last.text, last.char_start, last.char_end) == words[-2]
            assert last.end_sample < ack.start_sample + ack.num_samples
            await call.done_writing()
            rest = []
            while (r := await call.read()) is not grpc.aio.EOF:
                rest.append(r)
            assert "timestamps" not in kinds(rest)  # none for a cancelled utterance

    run(main())


def test_a_bug_while_placing_the_units_tells_the_client_only_the_request_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> list[tts_pb2.TimedUnit]:
        raise RuntimeError("secret detail at /work/x.py <object at 0xdeadbeef>")

    monkeypatch.setattr(timestamps, "timed_units", broken)

    async def main() -> None:
        async with harness_with_aligner(frames=3) as h:
            call = h.stub.Synthesize(request("Hello there.", request_id="req-bug"), timeout=10)
            responses = [r async for r in call]
        message = responses[-2].timestamps
        assert not message.units and "req-bug" in message.error
        assert "secret" not in message.error and "RuntimeError" not in message.error

    run(main())


def test_an_unreachable_aligner_leaves_the_audio_and_says_so() -> None:
    async def main() -> None:
        target = f"127.0.0.1:{free_port()}"  # a port nothing listens on
        async with Harness(frames=3, aligner_targets=(target,), failover_wait_seconds=0.2) as h:
            call = h.stub.Synthesize(request("Hello there.", request_id="req-ts"), timeout=10)
            responses = [r async for r in call]
        assert kinds(responses)[-2:] == ["timestamps", "summary"]
        message = responses[-2].timestamps
        assert not message.units and "the aligner stage is unavailable" in message.error
        assert "req-ts" in message.error  # the request id to quote, never the aligner's address
        assert "127.0.0.1" not in message.error and target.split(":")[1] not in message.error
        assert responses[-1].summary.num_samples == 3 * SAMPLES_PER_FRAME

    run(main())


def test_a_client_leaving_stops_the_stages_and_the_pending_alignments() -> None:
    async def main() -> None:
        aligner = FakeAligner()
        aligner.gate = asyncio.Event()  # alignments stay pending
        async with harness_with_aligner(aligner, frames=3, segment_tokens=20) as h:
            call = h.stub.Synthesize(request(), timeout=10)
            while not aligner.requests:  # the first segment is complete and being aligned
                assert (await call.read()).WhichOneof("payload") in ("metadata", "audio")
            call.cancel()
            for _ in range(200):
                if h.active_streams == 0 and not h.talker.active:
                    break
                await asyncio.sleep(0.01)
            assert h.active_streams == 0 and h.talker.active == 0
            tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("align ")]
            assert not tasks, tasks
            assert aligner.answered == 0

    run(main())


def test_a_slow_aligner_never_holds_back_streamed_audio() -> None:
    async def main() -> None:
        aligner = FakeAligner()
        aligner.gate = asyncio.Event()
        flush = Message(flush=tts_pb2.FlushText())
        texts = ["One two.", " Three four.", " Five six."]
        messages = [Message(config=request(""))]
        for text in texts:
            messages += [Message(text=text), flush]
        async with harness_with_aligner(aligner, frames=3) as h:
            call = h.stub.StreamingSynthesize(iter(messages), timeout=10)
            seen = []
            # Every utterance's audio and end arrive while the aligner holds every answer.
            while seen.count("utterance_end") < len(texts):
                seen.append((await call.read()).WhichOneof("payload"))
            assert set(seen) == {"metadata", "audio", "utterance_end"}
            assert aligner.answered == 0
            aligner.gate.set()
            rest = []
            while (r := await call.read()) is not grpc.aio.EOF:
                rest.append(r)
            assert kinds(rest) == ["timestamps"] * len(texts) + ["summary"]
            assert [len(r.timestamps.units) for r in rest[:-1]] == [2, 2, 2]

    run(main())
