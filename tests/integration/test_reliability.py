"""Reliability of the real stack under load, faults and bad input (issue: reliability).

Every test is bounded in time and talks only to processes it started on loopback.
"""

from __future__ import annotations

import asyncio
import io
import signal
import time

import grpc
import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3_tts.local_stack import is_serving, start_in
from tests.helpers.fixtures import CKPT_DIR
from tests.helpers.stack import running_stack, wait_for
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

SHORT = tts_pb2.SamplingOptions(seed=7, max_new_tokens=12)
LONG = tts_pb2.SamplingOptions(seed=7, max_new_tokens=1500)
LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(CKPT_DIR / "tiny_custom_voice", tmp_path_factory.mktemp("rel_logs")) as s:
        yield s


def stats(address: str, stub_cls) -> stages_pb2.StageStats:
    with grpc.insecure_channel(address) as ch:
        return stub_cls(ch).GetStats(stages_pb2.GetStatsRequest(), timeout=5)


def idle(stack) -> bool:
    t = stats(stack.address("talker"), stages_pb2_grpc.TalkerStub)
    d = stats(stack.address("decoder"), stages_pb2_grpc.DecoderStub)
    return t.running_requests == 0 and t.waiting_requests == 0 and d.running_requests == 0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def collect(stub, request, timeout):
    """(status name, audio chunks) of one Synthesize call."""
    chunks = 0
    try:
        async for response in stub.Synthesize(request, timeout=timeout):
            if response.WhichOneof("payload") == "audio":
                chunks += 1
        return "OK", chunks
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, chunks


def test_64_concurrent_streams_complete_or_are_refused(stack):
    talker_pid = stack.by_name["talker"].process.pid

    async def burst(stub) -> tuple[float, list[tuple[str, int]]]:
        t0 = time.monotonic()
        results = await asyncio.gather(
            *[
                collect(
                    stub,
                    tts_pb2.SynthesizeRequest(text=f"Request number {i}.", speaker="Ryan", sampling=SHORT),
                    90,
                )
                for i in range(64)
            ]
        )
        return time.monotonic() - t0, results

    def check(elapsed: float, results: list[tuple[str, int]]) -> None:
        statuses = [s for s, _ in results]
        assert set(statuses) <= {"OK", "RESOURCE_EXHAUSTED"}, statuses
        assert statuses.count("OK") >= 16
        assert all(chunks > 0 for s, chunks in results if s == "OK")
        assert elapsed < 90
        assert wait_for(lambda: idle(stack), timeout=10)

    async def run() -> list[float]:
        async with grpc.aio.insecure_channel(stack.address("gateway")) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            await collect(
                stub, tts_pb2.SynthesizeRequest(text="Warm up.", speaker="Ryan", sampling=SHORT), 60
            )
            rss = [rss_mib(talker_pid)]
            for _ in range(3):
                check(*await burst(stub))
                rss.append(rss_mib(talker_pid))
            return rss

    idle_rss, after_first, after_second, after_third = asyncio.run(run())
    # A burst's first use of a row count (rows of one linear call: decode batch 1..16, the code
    # predictor's 2 x batch, prefill groups of prompts) makes oneDNN build and keep that call's
    # kernel state, about 0.5 MiB per layer shape (tiny checkpoint: ~7.7 MiB per new row count
    # over its 9 shapes); bounded by oneDNN's caches, kept for the next burst.
    assert after_first < idle_rss + 128
    # Which row counts a burst reaches depends on scheduling, so a later burst may still reach a
    # few for the first time and grow once (measured over six bursts: 21 row counts in the first,
    # then new 12, 20 and 28 in the fourth: +23 MiB, flat after; a full-suite run once saw +47
    # MiB in the second). Nothing is kept per request (static KV slots), so of two further bursts
    # at least one adds (about) nothing: +3 and -12 MiB (glibc trims its heap) in eight runs,
    # whereas a leak of 0.5 MiB per request (32 MiB a burst) gave +34 and +22.
    assert min(after_second - after_first, after_third - after_second) < 16, (
        idle_rss,
        after_first,
        after_second,
        after_third,
    )


def test_deadline_and_disconnect_free_talker_and_decoder(stack):
    async def run():
        async with grpc.aio.insecure_channel(stack.address("gateway")) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            request = tts_pb2.SynthesizeRequest(text=LONG_TEXT, speaker="Ryan", sampling=LONG)
            # The deadline falls a third of the way into the same (seeded) request, however fast
            # this machine runs it: a fixed 1 s deadline met a request of 1.02-1.07 s once the
            # decoder got faster, and the request sometimes finished OK.
            t0 = time.monotonic()
            status, _ = await collect(stub, request, 60)
            whole = time.monotonic() - t0
            assert status == "OK"
            status, _ = await collect(stub, request, whole / 3)
            assert status == "DEADLINE_EXCEEDED"
            assert wait_for(lambda: idle(stack), timeout=5)
            call = stub.Synthesize(
                tts_pb2.SynthesizeRequest(text=LONG_TEXT, speaker="Ryan", sampling=LONG), timeout=60
            )
            async for response in call:
                if response.WhichOneof("payload") == "audio":
                    break
            assert stats(stack.address("talker"), stages_pb2_grpc.TalkerStub).running_requests == 1
        # Leaving the channel closes the connection: the client is gone.

    asyncio.run(run())
    assert wait_for(lambda: idle(stack), timeout=5)


@pytest.mark.parametrize("victim", ["decoder", "talker"])
def test_stage_killed_mid_stream_gives_unavailable_then_recovers(stack, victim):
    stage = stack.by_name[victim]

    async def run():
        async with grpc.aio.insecure_channel(stack.address("gateway")) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            call = stub.Synthesize(
                tts_pb2.SynthesizeRequest(text=LONG_TEXT, speaker="Ryan", sampling=LONG), timeout=60
            )
            async for response in call:
                if response.WhichOneof("payload") == "audio":
                    break
            stage.process.send_signal(signal.SIGKILL)
            t0 = time.monotonic()
            try:
                async for _ in call:
                    pass
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
                details = exc.details()
            return code, time.monotonic() - t0, details if code != "OK" else ""

    code, seconds, details = asyncio.run(run())
    assert code == "UNAVAILABLE", (code, details)
    assert seconds < 5
    assert victim in details
    stage.process.wait(10)
    start_in(stage, stack.log_dir)
    assert wait_for(lambda: is_serving(stage.address), timeout=60), stack.logs()

    async def again():
        async with grpc.aio.insecure_channel(stack.address("gateway")) as ch:
            stub = tts_pb2_grpc.TextToSpeechStub(ch)
            return await collect(
                stub, tts_pb2.SynthesizeRequest(text="Back again.", speaker="Ryan", sampling=SHORT), 30
            )

    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        status, chunks = asyncio.run(again())
        if status == "OK":
            break
        time.sleep(0.5)
    assert status == "OK"


def _wav_bytes(x: np.ndarray, sr: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format="WAV", subtype="FLOAT")
    return buf.getvalue()


@pytest.fixture(scope="module")
def base_stack(tmp_path_factory):
    with running_stack(CKPT_DIR / "tiny_base", tmp_path_factory.mktemp("rel_base_logs")) as s:
        yield s


def test_hostile_reference_audio(base_stack):
    t = np.arange(8000 * 2) / 8000
    stereo_8k = (
        np.stack([np.sin(2 * np.pi * 200 * t), np.sin(2 * np.pi * 300 * t)], axis=1).astype(np.float32) * 0.3
    )
    nan_audio = np.zeros(24000, dtype=np.float32)
    nan_audio[100] = np.nan
    cases = [
        (b"this is not audio", "INVALID_ARGUMENT", "decode"),
        (b"", "INVALID_ARGUMENT", "empty"),
        (_wav_bytes(nan_audio, 24000), "INVALID_ARGUMENT", "nan"),
        (_wav_bytes(np.zeros(24000 * 61 * 2, dtype=np.float32), 24000), "INVALID_ARGUMENT", "too long"),
        (_wav_bytes(stereo_8k, 8000), "OK", ""),
    ]
    with grpc.insecure_channel(base_stack.address("gateway")) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        for audio, expected, word in cases:
            request = tts_pb2.SynthesizeRequest(
                text="Hello.", sampling=SHORT, clone=tts_pb2.VoiceClone(ref_audio=audio, x_vector_only=True)
            )
            try:
                list(stub.Synthesize(request, timeout=60))
                status, details = "OK", ""
            except grpc.RpcError as exc:
                status, details = exc.code().name, exc.details()
            assert status == expected, (word, status, details)
            assert word in details.lower(), details


def test_sigterm_gateway_drains_in_flight_and_refuses_new(tmp_path):
    with running_stack(
        CKPT_DIR / "tiny_custom_voice", tmp_path / "logs", gateway_args=["--grace-seconds", "20"]
    ) as stack:
        gateway = stack.by_name["gateway"]

        async def run():
            async with grpc.aio.insecure_channel(stack.address("gateway")) as ch:
                stub = tts_pb2_grpc.TextToSpeechStub(ch)
                medium = tts_pb2.SamplingOptions(seed=3, max_new_tokens=60)
                tasks = [
                    asyncio.create_task(
                        collect(
                            stub,
                            tts_pb2.SynthesizeRequest(text=LONG_TEXT, speaker="Ryan", sampling=medium),
                            60,
                        )
                    )
                    for _ in range(3)
                ]
                await asyncio.sleep(0.5)
                gateway.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                late = await collect(
                    stub, tts_pb2.SynthesizeRequest(text="Too late.", speaker="Ryan", sampling=SHORT), 10
                )
                return await asyncio.gather(*tasks), late

        in_flight, late = asyncio.run(run())
        assert [s for s, _ in in_flight] == ["OK"] * 3
        assert late[0] == "UNAVAILABLE"
        assert gateway.process.wait(30) == 0


# Property-based requests: whatever the fields hold, the answer is audio or a clear status.
encodings = st.sampled_from(list(tts_pb2.AudioEncoding.values()) + [99])
optional_float = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32))


REQUEST_IDS = st.one_of(
    st.text(max_size=8),
    st.text(alphabet="abcXYZ019._-:/@+=~", min_size=120, max_size=140),  # around the length limit
    st.sampled_from(["a\nb", "x" * 10_000, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]),
)
METADATA_IDS = st.one_of(  # what a gRPC client can send: printable ASCII
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
    st.sampled_from(["id with spaces", "y" * 10_000]),
)


@st.composite
def requests(draw):
    req = tts_pb2.SynthesizeRequest(
        request_id=draw(REQUEST_IDS),
        text=draw(st.one_of(st.text(max_size=40), st.sampled_from(["Hello.", "你好。", " "]))),
        language=draw(
            st.one_of(
                st.sampled_from(["", "auto", "English", "chinese", "beijing_dialect"]), st.text(max_size=6)
            )
        ),
        instruct=draw(st.one_of(st.just(""), st.text(max_size=10))),
        text_feeding=draw(st.sampled_from([0, 1, 2, 7])),
    )
    voice = draw(st.sampled_from(["speaker", "voice_id", "clone", "none"]))
    if voice == "speaker":
        req.speaker = draw(st.one_of(st.sampled_from(["Ryan", "vivian", "DYLAN"]), st.text(max_size=6)))
    elif voice == "voice_id":
        req.voice_id = draw(st.text(max_size=6))
    elif voice == "clone":
        req.clone.ref_audio = draw(st.binary(max_size=64))
        req.clone.ref_text = draw(st.text(max_size=6))
        req.clone.x_vector_only = draw(st.booleans())
    s = req.sampling
    for name in ("temperature", "top_p", "repetition_penalty", "subtalker_temperature", "subtalker_top_p"):
        value = draw(optional_float)
        if value is not None:
            setattr(s, name, value)
    for name in ("top_k", "subtalker_top_k"):
        value = draw(st.one_of(st.none(), st.integers(-5, 3000)))
        if value is not None:
            setattr(s, name, value)
    for name in ("do_sample", "subtalker_do_sample"):
        value = draw(st.one_of(st.none(), st.booleans()))
        if value is not None:
            setattr(s, name, value)
    if draw(st.booleans()):
        s.seed = draw(st.integers(0, 2**64 - 1))
    s.max_new_tokens = draw(st.integers(-3, 8))
    req.output.encoding = draw(encodings)
    req.output.sample_rate = draw(st.sampled_from([0, 16000, 24000, 44100, 1, -5, 10**6]))
    req.streaming.first_chunk_frames = draw(st.integers(-2, 120))
    req.streaming.max_chunk_frames = draw(st.integers(-2, 120))
    return req


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests(), metadata_id=st.one_of(st.none(), METADATA_IDS))
def test_property_requests_never_internal_never_hang(stack, request, metadata_id):
    metadata = None if metadata_id is None else [("x-request-id", metadata_id)]
    with grpc.insecure_channel(stack.address("gateway")) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        t0 = time.monotonic()
        try:
            list(stub.Synthesize(request, timeout=30, metadata=metadata))
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
        assert code not in (
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ), (code, details, request)
        assert time.monotonic() - t0 < 30
        if code != grpc.StatusCode.OK:
            assert details, (code, request)
        client_id = request.request_id or (metadata_id or "")
        if client_id and not _acceptable_request_id(client_id):
            assert (
                code == grpc.StatusCode.INVALID_ARGUMENT
                and "request_id" in details
                or "x-request-id" in details
            )


def _acceptable_request_id(value: str) -> bool:
    """The documented rule, written out independently of the server's check."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@+=~")
    return len(value) <= 128 and all(c in allowed for c in value)
