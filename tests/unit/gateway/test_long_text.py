"""Gateway Synthesize of long texts against fake stages: segments as consecutive utterances in one
stream (order, continuous start_sample, derived seeds, summary), lookahead, exact token counts
from the talker's tokenizer, the silence stop, per-segment LENGTH, bad input, cancellation."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
from prometheus_client import REGISTRY

from gateway.synthesis.segmentation import INLINE_SEGMENTING_CHARS
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, Harness, expect_rpc_error, expected_signal, run
from tests.helpers.fixtures import CKPT_DIR
from tests.helpers.synthesis import chunks_audio
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.segments import segment_seed
from tts_common.text import estimate_tokens, segment_text
from tts_common.text.tokenizer import TextTokenizer

FLOAT32 = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Dr. Smith measured 3.14 metres at 12:30, e.g. twice.",
    "Is it done?",
    "Yes!",
    "Then we went home, slowly, along the river and over the old stone bridge.",
    "今天天气很好。",
    "See www.example.com for more.",
]
TEXT = " ".join(f"{take}, {s}" for take in ("First", "Second", "Third") for s in SENTENCES)
"""Every segment's text is different (the fake talker picks frame counts by text)."""


def request(text: str = TEXT, **kwargs: object) -> tts_pb2.SynthesizeRequest:
    base: dict[str, object] = {
        "text": text,
        "speaker": "Vivian",
        "language": "English",
        "output": FLOAT32,
        "sampling": tts_pb2.SamplingOptions(seed=1234),
    }
    base.update(kwargs)
    return tts_pb2.SynthesizeRequest(**base)  # type: ignore[arg-type]


def utterances(finish_reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "qwen3tts_utterances_total", {"stage": "gateway", "finish_reason": finish_reason}
    )
    return value or 0.0


def test_segments_stream_in_order_as_one_utterance() -> None:
    async def main() -> None:
        pieces = segment_text(TEXT, 30, estimate_tokens)
        assert len(pieces) > 5
        async with Harness(frames=4, segment_tokens=30) as h:
            # A different length per segment, so order and positions are checked.
            lengths = [3 + k % 4 for k in range(len(pieces))]
            h.talker.frames_by_text = {p.text: n for p, n in zip(pieces, lengths)}
            meta, chunks, summary = await h.synthesize(request(), metadata=[("x-request-id", "long-1")])
        sent = h.talker.requests
        # The talker was asked for every segment, in order, with the derived seeds and request ids.
        assert [r.text for r in sent] == [p.text for p in pieces]
        assert [r.sampling.seed for r in sent] == [segment_seed(1234, k) for k in range(len(pieces))]
        assert [r.request_id for r in sent] == ["long-1"] + [f"long-1/{k}" for k in range(1, len(pieces))]
        assert [s.request_id for s in h.decoder.starts] == [r.request_id for r in sent]
        assert {(r.speaker, r.language) for r in sent} == {("vivian", "english")}
        # One metadata with the request's own seed; audio continuous across segments.
        assert meta.request_id == "long-1" and meta.sampling.seed == 1234
        expected = np.concatenate([expected_signal(n) for n in lengths])
        np.testing.assert_array_equal(chunks_audio(chunks), expected)
        position = 0
        for chunk in chunks:
            assert chunk.start_sample == position
            position += chunk.num_samples
        # The summary: totals and every segment.
        assert summary.num_segments == len(pieces) == len(summary.segments)
        assert summary.frames == sum(lengths) and summary.num_samples == expected.size
        assert summary.finish_reason == tts_pb2.FINISH_REASON_EOS and not summary.length_segments
        start = 0
        for k, (segment, piece, n) in enumerate(zip(summary.segments, pieces, lengths)):
            assert (segment.index, segment.text_start, segment.text_end) == (k, piece.start, piece.end)
            assert segment.seed == segment_seed(1234, k)
            assert (segment.start_sample, segment.num_samples, segment.frames) == (
                start,
                n * SAMPLES_PER_FRAME,
                n,
            )
            assert segment.finish_reason == tts_pb2.FINISH_REASON_EOS
            start += n * SAMPLES_PER_FRAME

    run(main())


def test_short_text_is_one_segment_unchanged() -> None:
    async def main() -> None:
        async with Harness(frames=3) as h:
            text = "  Hello there.\n"
            _, _, summary = await h.synthesize(request(text))
        assert [r.text for r in h.talker.requests] == [text]
        assert h.talker.requests[0].sampling.seed == 1234
        assert summary.num_segments == 1 and summary.segments[0].text_end == len(text)

    run(main())


def test_lookahead_keeps_the_next_segment_generating() -> None:
    async def main() -> None:
        for lookahead, most in ((0, 1), (1, 2), (2, 3)):
            async with Harness(frames=8, delay=0.01, segment_tokens=30, segment_lookahead=lookahead) as h:
                await h.synthesize(request())
            assert h.talker.max_active == most, lookahead
            # Segment k + 1 starts only after segment k has produced audio.
            first_pcm = h.decoder.first_pcm_at
            for k in range(1, len(h.talker.started_at)):
                assert h.talker.started_at[k] >= first_pcm[k - 1]

    run(main(), timeout=60)


def test_exact_token_counts_from_the_talker() -> None:
    async def main() -> None:
        checkpoint = CKPT_DIR / "tiny_custom_voice"
        tokenizer = TextTokenizer.from_checkpoint(checkpoint)
        async with Harness(frames=2, segment_tokens=25, tokenizer_dir=checkpoint) as h:
            assert h.gateway.models.default.tokens.exact
            await h.synthesize(request())
        expected = segment_text(TEXT, 25, tokenizer.count_tokens)
        assert [r.text for r in h.talker.requests] == [p.text for p in expected]
        assert max(tokenizer.count_tokens(r.text) for r in h.talker.requests) <= 25
        # A talker without the RPC: the estimate (the tiny fixture's vocabulary has few merges,
        # so here the two cut differently).
        async with Harness(frames=2, segment_tokens=25) as h:
            assert not h.gateway.models.default.tokens.exact
            await h.synthesize(request())
        estimated = segment_text(TEXT, 25, estimate_tokens)
        assert (
            [r.text for r in h.talker.requests] == [p.text for p in estimated] != [p.text for p in expected]
        )

    run(main(), timeout=60)


def test_silence_stop_ends_the_utterance_and_frees_the_slot() -> None:
    async def main() -> None:
        before = utterances("SILENCE")
        async with Harness(frames=3000, delay=0.01, silence_stop_seconds=0.4) as h:
            h.decoder.silent_from_frame = 3
            began = time.monotonic()
            _, chunks, summary = await h.synthesize(request("Hello there."))
            elapsed = time.monotonic() - began
            # 3 frames of sound, then 0.4 s = 5 frames of silence; 3000 frames would take 30 s.
            assert elapsed < 15
            audio = chunks_audio(chunks)
            assert audio.size == (3 + 5) * SAMPLES_PER_FRAME
            np.testing.assert_array_equal(audio[: 3 * SAMPLES_PER_FRAME], expected_signal(3))
            assert not audio[3 * SAMPLES_PER_FRAME :].any()
            assert summary.finish_reason == tts_pb2.FINISH_REASON_SILENCE
            assert summary.segments[0].finish_reason == tts_pb2.FINISH_REASON_SILENCE
            assert summary.frames == 8 and summary.num_samples == audio.size
            # The talker's generation was stopped (its slot freed).
            await asyncio.wait_for(h.talker.stopped.wait(), 5)
            assert h.talker.active == 0 and h.talker.cancel_messages >= 1
        assert utterances("SILENCE") == before + 1

    run(main(), timeout=60)


def test_silence_stop_switches() -> None:
    async def main() -> None:
        async with Harness(frames=40, delay=0.001, silence_stop_seconds=0.4) as h:
            h.decoder.silent_from_frame = 3
            _, chunks, summary = await h.synthesize(request("Hi.", silence_stop=False))
            assert summary.finish_reason == tts_pb2.FINISH_REASON_EOS
            assert chunks_audio(chunks).size == 40 * SAMPLES_PER_FRAME
        async with Harness(frames=40, delay=0.001, silence_stop_seconds=0.4, silence_stop=False) as h:
            h.decoder.silent_from_frame = 3
            _, _, summary = await h.synthesize(request("Hi."))
            assert summary.finish_reason == tts_pb2.FINISH_REASON_EOS
            _, _, summary = await h.synthesize(request("Hi.", silence_stop=True))
            assert summary.finish_reason == tts_pb2.FINISH_REASON_SILENCE

    run(main(), timeout=60)


def test_length_names_the_segment() -> None:
    async def main() -> None:
        pieces = segment_text(TEXT, 30, estimate_tokens)
        async with Harness(frames=3, segment_tokens=30) as h:
            h.talker.frames_by_text = {pieces[2].text: 50}
            sampling = tts_pb2.SamplingOptions(seed=5, max_new_tokens=11)
            _, _, summary = await h.synthesize(request(sampling=sampling))
        assert list(summary.length_segments) == [2]
        assert summary.finish_reason == tts_pb2.FINISH_REASON_LENGTH
        assert summary.segments[2].finish_reason == tts_pb2.FINISH_REASON_LENGTH
        assert summary.segments[2].frames == 10
        assert all(r.sampling.max_new_tokens == 11 for r in h.talker.requests)

    run(main(), timeout=30)


def test_bad_long_texts() -> None:
    async def main() -> None:
        async with Harness(max_text_chars=300, segment_tokens=20) as h:
            cases = [
                ("a" * 301, "text is too long: 301 characters (maximum 300)"),
                ("... !? —", "the text has nothing to speak (no letter or digit)"),
                ("Fine. " + "x" * 200, "is 50 text tokens, more than the limit of 20 tokens per segment"),
            ]
            for text, message in cases:
                err = await expect_rpc_error(h.stub.Synthesize(request(text)))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, text
                assert message in err.details(), err.details()
            assert not h.talker.requests

    run(main())


def test_a_chapter_starts_on_its_first_segment_before_the_rest_is_cut() -> None:
    """Past INLINE_SEGMENTING_CHARS the first segment comes from a prefix while the whole text is
    segmented in a worker thread: the talker still gets exactly the whole text's segments."""

    async def main() -> None:
        text = " ".join([TEXT] * 4)
        assert len(text) > INLINE_SEGMENTING_CHARS
        pieces = segment_text(text, 30, estimate_tokens)
        async with Harness(frames=2, segment_tokens=30) as h:
            _, chunks, summary = await h.synthesize(request(text))
        assert [r.text for r in h.talker.requests] == [p.text for p in pieces]
        assert summary.num_segments == len(pieces)
        np.testing.assert_array_equal(
            chunks_audio(chunks), np.concatenate([expected_signal(2)] * len(pieces))
        )

    run(main(), timeout=60)


def test_a_chapter_refused_past_its_first_segment_sends_nothing() -> None:
    """A word too long far into a chapter is found by the whole segmentation after the first
    segment started: the call still fails before any response, and that segment's slot is freed."""

    async def main() -> None:
        text = " ".join([TEXT] * 4) + " " + "x" * 200
        async with Harness(frames=400, delay=0.01, segment_tokens=30) as h:
            call = h.stub.Synthesize(request(text))
            responses = []
            try:
                async for response in call:
                    responses.append(response)
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "more than the limit of 30 tokens per segment" in err.details(), err.details()
            else:
                raise AssertionError("the call succeeded")
            assert responses == []
            for _ in range(300):
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.01)
            assert h.talker.active == 0

    run(main(), timeout=30)


def test_cancel_stops_every_segment() -> None:
    async def main() -> None:
        async with Harness(frames=400, delay=0.01, segment_tokens=30, segment_lookahead=2) as h:
            call = h.stub.Synthesize(request())
            async for response in call:
                if response.WhichOneof("payload") == "audio":
                    break
            # Wait until the lookahead segments hold slots too.
            for _ in range(200):
                if h.talker.active == 3:
                    break
                await asyncio.sleep(0.01)
            assert h.talker.active == 3
            call.cancel()
            for _ in range(300):
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.01)
            assert h.talker.active == 0
            assert len(h.talker.requests) == 3

    run(main(), timeout=30)


def test_tokenizer_fetch_is_retried_in_the_background() -> None:
    async def main() -> None:
        checkpoint = CKPT_DIR / "tiny_custom_voice"
        async with Harness(frames=2, segment_tokens=25, model_info_ttl_seconds=0.05) as h:
            assert not h.gateway.models.default.tokens.exact  # the talker could not serve it at startup
            h.talker.tokenizer_dir = checkpoint
            await asyncio.sleep(0.1)
            await h.synthesize(request())  # cut by the estimate; starts a fetch
            for _ in range(200):
                if h.gateway.models.default.tokens.exact:
                    break
                await asyncio.sleep(0.02)
            assert h.gateway.models.default.tokens.exact
            first = len(h.talker.requests)
            await h.synthesize(request())
        exact = segment_text(TEXT, 25, TextTokenizer.from_checkpoint(checkpoint).count_tokens)
        assert [r.text for r in h.talker.requests[:first]] == [p.text for p in segment_text(TEXT, 25)]
        assert [r.text for r in h.talker.requests[first:]] == [p.text for p in exact]

    run(main(), timeout=60)


def test_deadline_stops_every_segment() -> None:
    async def main() -> None:
        async with Harness(frames=400, delay=0.01, segment_tokens=30, segment_lookahead=2) as h:
            err = await expect_rpc_error(h.stub.Synthesize(request(), timeout=1.0))
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            for _ in range(300):
                if h.talker.active == 0:
                    break
                await asyncio.sleep(0.01)
            assert h.talker.active == 0 and h.talker.max_active == 3

    run(main(), timeout=30)
