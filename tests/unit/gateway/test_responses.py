"""The one response builder (gateway.synthesis.responses.ResponseBuilder): every summary's
segments and every utterance_end tile exactly the samples sent, after resampling and ``speed``,
for unary and streamed requests; native positions map to the output as sent."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator

import numpy as np
import openai
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.encoding import AudioOutput
from gateway.synthesis.responses import OutputPlan, ResponseBuilder, SegmentRecord
from gateway.voice_library import NO_KEYS
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, Harness, run
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

NATIVE = 24000
FLOAT32 = tts_pb2.AUDIO_ENCODING_FLOAT32
RATES = st.sampled_from([NATIVE, NATIVE, 8000, 16000, 22050, 44100, 48000])
SPEEDS = st.one_of(st.just(1.0), st.sampled_from([0.5, 2.0, 4.0, 0.25]), st.floats(0.25, 4.0))


def assert_tiles(summary: tts_pb2.SynthesisSummary, sent: int) -> None:
    """The summary's segments follow each other from 0 to exactly the samples sent."""
    assert summary.num_samples == sent
    position = 0
    for segment in summary.segments:
        assert segment.start_sample == position, (segment, position)
        assert segment.num_samples >= 0
        position += segment.num_samples
    assert position == sent


def builder(rate: int, speed: float) -> ResponseBuilder:
    plan = OutputPlan(FLOAT32, rate, 2, 25)
    output = AudioOutput(FLOAT32, rate, NATIVE, speed=speed)
    return ResponseBuilder(tts_pb2.SynthesisMetadata(), plan, output, time.monotonic(), model="m")


@st.composite
def utterances(draw: st.DrawFn) -> list[list[int]]:
    """Each utterance's PCM chunk sizes (an utterance may have no audio, a chunk may be empty)."""
    return draw(st.lists(st.lists(st.integers(0, 3 * SAMPLES_PER_FRAME), max_size=4), min_size=1, max_size=5))


@settings(max_examples=150, deadline=None)
@given(pieces=utterances(), rate=RATES, speed=SPEEDS)
def test_segments_and_utterance_ends_tile_the_samples_sent(
    pieces: list[list[int]], rate: int, speed: float
) -> None:
    async def main() -> None:
        responses = builder(rate, speed)
        rng = np.random.default_rng(len(pieces))
        sent, ends, fed = 0, [], 0
        for index, sizes in enumerate(pieces):
            for size in sizes:
                chunk = (await responses.audio(index, rng.uniform(-0.5, 0.5, size).astype(np.float32))).audio
                assert chunk.start_sample == sent and len(chunk.data) == 4 * chunk.num_samples
                sent += chunk.num_samples
                fed += size
                assert sent <= responses.output_position(fed)  # never ahead of the mapping
            record = SegmentRecord(index, 0, 0, 0, 0, tts_pb2.FINISH_REASON_EOS, stages_pb2.TalkerDone())
            ends.append(responses.utterance_end(record).utterance_end)
        final = await responses.finish()
        sent += final.audio.num_samples if final is not None else 0
        assert sent == responses.output_position(fed)  # the mapping's end is the stream's end
        records = [
            SegmentRecord(i, 0, 0, 0, 0, tts_pb2.FINISH_REASON_EOS, stages_pb2.TalkerDone())
            for i in range(len(pieces))
        ]
        summary = responses.summary(records).summary
        assert_tiles(summary, sent)
        assert [(e.start_sample, e.num_samples) for e in ends] == [
            (s.start_sample, s.num_samples) for s in summary.segments
        ]
        if speed == 1.0 and rate == NATIVE:  # untouched output: native counts exactly
            assert [s.num_samples for s in summary.segments] == [sum(sizes) for sizes in pieces]
        # A moment of an utterance maps through the same function.
        for index, sizes in enumerate(pieces):
            span = responses.utterance_span(index)
            assert responses.output_sample(index, 0) == span.start_sample
            assert responses.output_sample(index, sum(sizes)) == span.start_sample + span.num_samples

    run(main())


def test_the_mapping_follows_speed_and_rate() -> None:
    responses = builder(16000, 2.0)
    # round(n / 2) (half to even), then ceil(m * 16000 / 24000)
    assert [responses.output_position(n) for n in (0, 1, 3, 24000, 48000)] == [0, 0, 2, 8000, 16000]
    assert builder(NATIVE, 1.0).output_position(12345) == 12345


def test_feeding_an_earlier_utterance_after_a_later_one_is_refused() -> None:
    async def main() -> None:
        responses = builder(NATIVE, 1.0)
        await responses.audio(1, np.zeros(10, np.float32))
        await responses.audio(2, np.zeros(10, np.float32))
        try:
            await responses.audio(1, np.zeros(10, np.float32))
        except RuntimeError as exc:
            assert "fed after a later utterance" in str(exc)
        else:
            raise AssertionError("accepted")

    run(main())


# ---------------------------------------------------------------------------------------------
# Through the gateway's core: unary and streamed requests over fake stages

WORDS = st.sampled_from(["One", "two", "three", "four", "five", "six", "seven"])
SENTENCES = st.lists(
    st.lists(WORDS, min_size=1, max_size=5).map(" ".join).map(lambda s: s + "."), min_size=1, max_size=6
)


async def _deltas(text: str, cuts: list[int]) -> AsyncIterator[tts_pb2.StreamingSynthesizeRequest]:
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    for a, b in zip(bounds, bounds[1:]):
        yield tts_pb2.StreamingSynthesizeRequest(text=text[a:b])
        if b in cuts[:1]:
            yield tts_pb2.StreamingSynthesizeRequest(flush=tts_pb2.FlushText())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sentences=SENTENCES,
    rate=RATES,
    speed=SPEEDS,
    streamed=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=4),
    frames=st.integers(1, 5),
)
def test_unary_and_streamed_summaries_tile_the_samples_sent(
    sentences: list[str], rate: int, speed: float, streamed: bool, cuts: list[int], frames: int
) -> None:
    text = " ".join(sentences)

    async def main() -> None:
        async with Harness(frames=frames, delay=0.0, segment_tokens=6) as h:
            request = tts_pb2.SynthesizeRequest(
                model=h.model_name,
                speaker="ryan",
                output=tts_pb2.AudioFormat(encoding=FLOAT32, sample_rate=rate),
            )
            core = h.gateway
            received = time.monotonic()
            if streamed:
                responses = core.streamed.synthesize(
                    request, _deltas(text, cuts), "r", caller=NO_KEYS, received=received, speed=speed
                )
            else:
                request.text = text
                responses = core.unary.synthesize(
                    request, "r", caller=NO_KEYS, received=received, speed=speed
                )
            out = [r async for r in responses]
            chunks = [r.audio for r in out if r.HasField("audio")]
            sent = sum(c.num_samples for c in chunks)
            assert sent == sum(len(c.data) for c in chunks) // 4
            summary = out[-1].summary
            assert_tiles(summary, sent)
            assert summary.num_segments >= 1 and len(summary.segments) == summary.num_segments
            ends = [r.utterance_end for r in out if r.HasField("utterance_end")]
            if streamed:
                assert [(e.start_sample, e.num_samples) for e in ends] == [
                    (s.start_sample, s.num_samples) for s in summary.segments
                ]
            else:
                assert not ends and summary.num_segments == len(h.talker.requests)
            # What was spoken, at the output's length: every segment's native frames.
            native = sum(s.frames for s in summary.segments) * SAMPLES_PER_FRAME
            assert sent == AudioOutput(FLOAT32, rate, NATIVE, speed=speed).output_length(native)

    run(main(), timeout=60)


def test_a_sped_up_long_text_over_sse_sums_to_what_was_sent() -> None:
    """The measurement that found the unary speed bug: a long text over SSE at speed 2.0 (the
    summary's segments added up to the native length scaled by the rate, ignoring speed)."""

    async def main() -> None:
        async with Harness(frames=5, delay=0.0, http=True, segment_tokens=6) as h:
            sdk = openai.AsyncOpenAI(base_url=h.http_url + "/v1", api_key="unused", max_retries=0, timeout=30)
            h.cleanups.append(sdk.close)
            async with sdk.audio.speech.with_streaming_response.create(
                model=h.model_name,
                input=" ".join(["This is a sentence of the long text."] * 8),
                voice="ryan",
                response_format="pcm",
                stream_format="sse",
                speed=2.0,
            ) as response:
                lines = [line async for line in response.iter_lines()]
            events = [json.loads(line.removeprefix("data: ")) for line in lines if line]
            audio = b"".join(
                base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
            )
            sent = len(audio) // 2
            summary = events[-1]["summary"]
            assert summary["num_segments"] > 2 and summary["num_samples"] == sent
            assert sum(s["num_samples"] for s in summary["segments"]) == sent
            assert sent == round(summary["frames"] * SAMPLES_PER_FRAME / 2.0)

    run(main(), timeout=60)
