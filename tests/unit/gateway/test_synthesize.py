"""Gateway Synthesize against fake stages on loopback: stream order and content, encodings,
streaming resampling, admission control, cancellation, deadlines and stage failures."""

from __future__ import annotations

import asyncio
import io
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import av
import grpc
import numpy as np
import pytest
import soundfile as sf
from prometheus_client import REGISTRY

from gateway.stages.pipeline import StageError
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, Harness, expect_rpc_error, expected_signal, run
from tts_common.audio import float_to_pcm16, resample
from tts_common.pb.qwen3tts.v1 import tts_pb2

REPO = Path(__file__).resolve().parents[3]
FAKES = Path(__file__).resolve().parents[2] / "helpers" / "fake_stages.py"


def request(**kwargs: object) -> tts_pb2.SynthesizeRequest:
    base: dict[str, object] = {"text": "Hello there.", "speaker": "Vivian", "language": "English"}
    base.update(kwargs)
    return tts_pb2.SynthesizeRequest(**base)  # type: ignore[arg-type]


def joined(chunks: list[tts_pb2.AudioChunk]) -> bytes:
    return b"".join(c.data for c in chunks)


def test_stream_order_metadata_and_pcm16_content() -> None:
    async def main() -> None:
        async with Harness(frames=7) as h:
            meta, chunks, summary = await h.synthesize(request(), metadata=[("x-request-id", "req-123")])
            # metadata: resolved request
            assert meta.request_id == "req-123"
            assert meta.sample_rate == 24000
            assert meta.encoding == tts_pb2.AUDIO_ENCODING_PCM16
            assert (meta.model_type, meta.model_size, meta.model_name) == (
                "custom_voice",
                "0b6",
                "fake-custom_voice",
            )
            assert meta.language == "english"
            assert meta.text_feeding == tts_pb2.TEXT_FEEDING_NON_STREAMING
            for field in (
                "do_sample",
                "temperature",
                "top_k",
                "top_p",
                "repetition_penalty",
                "subtalker_do_sample",
                "subtalker_temperature",
                "subtalker_top_k",
                "subtalker_top_p",
                "seed",
            ):
                assert meta.sampling.HasField(field), field
            # unset max_new_tokens stays unset: the talker applies its length guard
            assert not meta.sampling.HasField("max_new_tokens")
            # what the stages got
            sent = h.talker.requests[-1]
            assert (sent.request_id, sent.speaker, sent.language, sent.text) == (
                "req-123",
                "vivian",
                "english",
                "Hello there.",
            )
            assert sent.sampling == meta.sampling
            start = h.decoder.starts[-1]
            assert (start.first_chunk_frames, start.max_chunk_frames) == (2, 25)
            assert start.prefix_codes.num_frames == 0
            # audio
            assert [c.index for c in chunks] == list(range(len(chunks)))
            assert chunks[0].num_samples == 2 * SAMPLES_PER_FRAME  # first_chunk_frames
            position = 0
            for c in chunks:
                assert c.start_sample == position and c.sample_rate == 24000
                assert c.encoding == tts_pb2.AUDIO_ENCODING_PCM16
                assert len(c.data) == 2 * c.num_samples
                position += c.num_samples
            assert joined(chunks) == float_to_pcm16(expected_signal(7))
            # summary
            assert summary.frames == 7
            assert summary.num_samples == 7 * SAMPLES_PER_FRAME
            assert math.isclose(summary.audio_seconds, 7 * 0.08)
            assert summary.finish_reason == tts_pb2.FINISH_REASON_EOS
            assert summary.num_chunks == len(chunks)
            assert summary.queue_ms == 1.5
            assert 0 < summary.time_to_first_audio_ms <= summary.total_ms
            assert math.isclose(summary.rtf, summary.total_ms / 1000 / summary.audio_seconds)
            # explicit seed is kept, explicit max_new_tokens gives LENGTH
            meta2, _, summary2 = await h.synthesize(
                request(
                    request_id="mine",
                    sampling=tts_pb2.SamplingOptions(seed=42, max_new_tokens=4, temperature=0.5),
                )
            )
            assert meta2.request_id == "mine"
            assert (meta2.sampling.seed, meta2.sampling.temperature) == (42, 0.5)
            assert h.talker.requests[-1].sampling.max_new_tokens == 4
            assert summary2.frames == 3 and summary2.finish_reason == tts_pb2.FINISH_REASON_LENGTH
            assert h.active_streams == 0

    run(main())


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"stage": "gateway", **labels}) or 0.0


def test_metrics_and_model_info_refresh() -> None:
    async def main() -> None:
        async with Harness(frames=8) as h:
            before = {
                "ttfa": _metric("qwen3tts_time_to_first_audio_seconds_count"),
                "inter": _metric("qwen3tts_inter_chunk_latency_seconds_count"),
                "rtf": _metric("qwen3tts_real_time_factor_count"),
                "duration": _metric("qwen3tts_request_duration_seconds_count"),
                "audio": _metric("qwen3tts_audio_seconds_total"),
                "ok": _metric("qwen3tts_requests_total", status="OK"),
                "invalid": _metric("qwen3tts_requests_total", status="INVALID_ARGUMENT"),
            }
            _, chunks, summary = await h.synthesize(request())
            await expect_rpc_error(h.stub.Synthesize(request(text="")))
            assert _metric("qwen3tts_time_to_first_audio_seconds_count") == before["ttfa"] + 1
            assert _metric("qwen3tts_inter_chunk_latency_seconds_count") == before["inter"] + len(chunks) - 1
            assert _metric("qwen3tts_real_time_factor_count") == before["rtf"] + 1
            assert _metric("qwen3tts_request_duration_seconds_count") == before["duration"] + 2
            assert math.isclose(
                _metric("qwen3tts_audio_seconds_total") - before["audio"], summary.audio_seconds
            )
            assert _metric("qwen3tts_requests_total", status="OK") == before["ok"] + 1
            assert _metric("qwen3tts_requests_total", status="INVALID_ARGUMENT") == before["invalid"] + 1
            assert _metric("qwen3tts_running_requests") == 0
            # model info is cached; a refresh is triggered by invalidation (talker failures)
            calls = h.talker.model_info_calls
            await h.synthesize(request())
            assert h.talker.model_info_calls == calls
            h.gateway.models.default.info.invalidate()
            await h.synthesize(request())
            assert h.talker.model_info_calls == calls + 1

    run(main())


def test_float32_wav_flac_ogg_encodings() -> None:
    async def main() -> None:
        expected = expected_signal(6)
        async with Harness(frames=6) as h:
            fmt = tts_pb2.AudioFormat
            _, chunks, _ = await h.synthesize(request(output=fmt(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)))
            np.testing.assert_array_equal(np.frombuffer(joined(chunks), "<f4"), expected)
            assert all(c.encoding == tts_pb2.AUDIO_ENCODING_FLOAT32 for c in chunks)

            _, chunks, _ = await h.synthesize(request(output=fmt(encoding=tts_pb2.AUDIO_ENCODING_WAV)))
            data = joined(chunks)
            assert chunks[0].data[:4] == b"RIFF" and chunks[0].data[8:16] == b"WAVEfmt "
            assert data[36:40] == b"data" and data[40:44] == b"\xff\xff\xff\xff"
            assert data[44:] == float_to_pcm16(expected)
            assert all(c.data[:4] != b"RIFF" for c in chunks[1:])

            # FLAC is buffered: one complete lossless file in the last chunk
            _, chunks, summary = await h.synthesize(request(output=fmt(encoding=tts_pb2.AUDIO_ENCODING_FLAC)))
            assert all(not c.data for c in chunks[:-1]) and chunks[-1].data
            decoded, rate = sf.read(io.BytesIO(joined(chunks)), dtype="int16")
            assert rate == 24000
            np.testing.assert_array_equal(decoded, np.frombuffer(float_to_pcm16(expected), "<i2"))
            assert sum(c.num_samples for c in chunks) == summary.num_samples == expected.size

            for encoding in (tts_pb2.AUDIO_ENCODING_OGG_VORBIS, tts_pb2.AUDIO_ENCODING_OGG_OPUS):
                _, chunks, _ = await h.synthesize(request(output=fmt(encoding=encoding)))
                assert chunks[0].data[:4] == b"OggS"  # streams: headers come with chunk 0
                with sf.SoundFile(io.BytesIO(joined(chunks))) as fh:
                    decoded = fh.read(dtype="float32")
                    assert fh.samplerate == 24000
                assert abs(decoded.size - expected.size) <= 960
                assert np.corrcoef(decoded[: expected.size], expected[: decoded.size])[0, 1] > 0.9

    run(main())


def test_g711_and_mp3_encodings() -> None:
    async def main() -> None:
        expected = expected_signal(6)
        async with Harness(frames=6) as h:
            # G.711 with sample_rate 0: 8 kHz (telephony), one byte per sample, streamed
            meta, chunks, summary = await h.synthesize(
                request(output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_MULAW))
            )
            assert meta.sample_rate == 8000 and all(c.sample_rate == 8000 for c in chunks)
            assert len(joined(chunks)) == summary.num_samples == resample(expected, 24000, 8000).size
            assert all(len(c.data) == c.num_samples for c in chunks)

            _, chunks, summary = await h.synthesize(
                request(output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_MP3))
            )
            assert chunks[0].data and summary.num_samples == expected.size
            with av.open(io.BytesIO(joined(chunks)), format="mp3") as container:
                decoded = sum(frame.samples for frame in container.decode(audio=0))
            assert decoded >= expected.size + 1105  # LAME's delay in front, nothing lost

    run(main())


def test_resampled_stream_equals_whole_signal_resampling() -> None:
    async def main() -> None:
        async with Harness(frames=13) as h:
            for rate in (16000, 44100):
                meta, chunks, summary = await h.synthesize(
                    request(
                        output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32, sample_rate=rate),
                        streaming=tts_pb2.StreamingOptions(first_chunk_frames=1, max_chunk_frames=3),
                    )
                )
                assert meta.sample_rate == rate and all(c.sample_rate == rate for c in chunks)
                streamed = np.frombuffer(joined(chunks), "<f4")
                whole = resample(expected_signal(13), 24000, rate)
                assert streamed.size == whole.size == summary.num_samples
                np.testing.assert_allclose(streamed, whole, atol=1e-5)
                assert sum(c.num_samples for c in chunks) == streamed.size
                assert math.isclose(summary.audio_seconds, streamed.size / rate)
            # PCM16 at 16 kHz: the same signal quantized
            _, chunks, _ = await h.synthesize(request(output=tts_pb2.AudioFormat(sample_rate=16000)))
            pcm = np.frombuffer(joined(chunks), "<i2")
            expected = np.frombuffer(float_to_pcm16(resample(expected_signal(13), 24000, 16000)), "<i2")
            assert np.abs(pcm.astype(int) - expected).max() <= 1

    run(main())


def test_resource_exhausted_beyond_max_concurrent_streams() -> None:
    async def main() -> None:
        async with Harness(frames=200, delay=0.02, max_concurrent_streams=2) as h:
            calls = [h.stub.Synthesize(request()) for _ in range(2)]
            for call in calls:
                first = await call.read()
                assert first.WhichOneof("payload") == "metadata"
            started = time.monotonic()
            err = await expect_rpc_error(h.stub.Synthesize(request()))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert "capacity" in err.details()
            assert time.monotonic() - started < 1.0
            for call in calls:
                call.cancel()
            for _ in range(100):  # slots come back once the handlers unwind
                if h.active_streams == 0:
                    break
                await asyncio.sleep(0.02)
            assert h.active_streams == 0
            h.talker.frames = 3
            await h.synthesize(request())

    run(main())


def test_client_cancel_and_deadline_stop_the_talker() -> None:
    async def main() -> None:
        async with Harness(frames=500, delay=0.02) as h:
            call = h.stub.Synthesize(request())
            assert (await call.read()).WhichOneof("payload") == "metadata"
            assert (await call.read()).WhichOneof("payload") == "audio"
            call.cancel()
            await asyncio.wait_for(h.talker.stopped.wait(), 3)
            assert h.talker.cancel_messages + h.talker.rpc_cancelled >= 1
            for _ in range(100):
                if h.active_streams == 0 and h.decoder.cancelled_calls:
                    break
                await asyncio.sleep(0.02)
            assert h.active_streams == 0
            assert h.decoder.cancelled_calls == 1

            h.talker.stopped.clear()
            started = time.monotonic()
            err = await expect_rpc_error(h.stub.Synthesize(request(), timeout=1.0))
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
            await asyncio.wait_for(h.talker.stopped.wait(), 3)
            assert time.monotonic() - started < 3

    run(main())


def test_only_an_unavailable_talker_makes_the_model_info_refetched() -> None:
    # Both Synthesize and StreamingSynthesize run in the admission, which invalidates the info.
    async def main() -> None:
        async with Harness() as h:
            await h.synthesize(request())
            cases = [
                (StageError("talker", grpc.StatusCode.UNAVAILABLE, "gone"), 1),
                (StageError("talker", grpc.StatusCode.INVALID_ARGUMENT, "refused"), 0),
                (StageError("decoder", grpc.StatusCode.UNAVAILABLE, "gone"), 0),
            ]
            for error, refetches in cases:
                calls = h.talker.model_info_calls
                with (
                    pytest.raises(StageError),
                    h.gateway.admission.admit(time.monotonic(), h.gateway.models.default),
                ):
                    raise error
                await h.synthesize(request())
                assert h.talker.model_info_calls == calls + refetches, error

    run(main())


def test_upstream_errors_propagate() -> None:
    async def main() -> None:
        async with Harness() as h:
            err = await expect_rpc_error(h.stub.Synthesize(request(text="talker-reject")))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "talker" in err.details() and "fake talker rejects this" in err.details()

    run(main())


def test_silent_decoder_after_end_gives_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with Harness(frames=3, stage_timeout_seconds=0.3) as h:
            h.decoder.hang_at_end = True
            started = time.monotonic()
            err = await expect_rpc_error(h.stub.Synthesize(request()))
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert "the decoder stage is unavailable" in err.details()
            assert time.monotonic() - started < 3
        assert "no output for 0.3 s" in caplog.text  # what happened: for the operator

    with caplog.at_level(logging.INFO, logger="gateway.stages.errors"):
        run(main())


def test_decoder_stopped_mid_stream_gives_unavailable() -> None:
    async def main() -> None:
        async with Harness(frames=500, delay=0.02) as h:
            call = h.stub.Synthesize(request())
            assert (await call.read()).WhichOneof("payload") == "metadata"
            assert (await call.read()).WhichOneof("payload") == "audio"
            started = time.monotonic()
            await h.decoder_server.stop(0)
            err = await expect_rpc_error(call)
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert "decoder" in err.details()
            assert time.monotonic() - started < 5
            await asyncio.wait_for(h.talker.stopped.wait(), 3)  # the talker slot is freed too
            # the decoder is gone: new requests fail fast with UNAVAILABLE naming it
            err = await expect_rpc_error(h.stub.Synthesize(request()))
            assert err.code() == grpc.StatusCode.UNAVAILABLE and "decoder" in err.details()

    run(main())


def test_talker_process_killed_mid_stream_gives_unavailable() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(FAKES), "talker", "custom_voice", "1000", "0.02"],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())

        async def main() -> None:
            async with Harness(talker_target=f"127.0.0.1:{port}") as h:
                call = h.stub.Synthesize(request())
                assert (await call.read()).WhichOneof("payload") == "metadata"
                assert (await call.read()).WhichOneof("payload") == "audio"
                started = time.monotonic()
                proc.kill()
                err = await expect_rpc_error(call)
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
                assert "talker" in err.details()
                assert time.monotonic() - started < 5
                for _ in range(100):
                    if h.decoder.cancelled_calls:
                        break
                    await asyncio.sleep(0.02)
                assert h.decoder.cancelled_calls == 1
                assert h.active_streams == 0

        run(main())
    finally:
        proc.kill()
        proc.wait(10)
