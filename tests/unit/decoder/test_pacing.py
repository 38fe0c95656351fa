"""The decoder's chunk cuts (decoder_service.pacing): the schedule's sizes while the listener has
audio to spare; early, with the frames held, before a listener would run dry; and, through the
servicer, early chunks between frames and the same audio whatever the cuts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from decoder_service.config import DecoderConfig
from decoder_service.model.streaming import ChunkSchedule
from decoder_service.pacing import DecodeTime, PlayoutPacer
from decoder_service.server import DecoderServicer
from tests.helpers.fixtures import CKPT_DIR
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.playback import Playback

FRAME_S = 0.08


def simulate(
    frames: int,
    interval_s: float,
    decode_s: float,
    headroom_s: float,
    schedule: ChunkSchedule,
    decode_s_per_frame: float = 0.0,
) -> tuple[list[int], Playback]:
    """One stream: a frame every ``interval_s``; the decoder, one chunk at a time, each taking
    ``decode_s`` plus ``decode_s_per_frame`` a frame, cutting as the pacer says at each frame and
    each timer it asks for; returns the chunk sizes and what the listener heard."""
    pacer = PlayoutPacer(schedule, FRAME_S, headroom_s)
    listener = Playback()
    chunks: list[int] = []
    held = arrived = 0
    now = 0.0

    def send(n: int) -> None:
        nonlocal held, now
        took = decode_s + n * decode_s_per_frame
        now += took
        held -= n
        chunks.append(n)
        pacer.sent(n, now, took)
        listener.chunk(now, n * FRAME_S)

    while arrived < frames:
        next_frame = (arrived + 1) * interval_s
        wait = pacer.wait_s(held, now)
        if wait is not None and now + wait < next_frame:
            now += wait
            if n := pacer.cut(held, now):
                send(n)
            continue
        now = max(now, next_frame)
        arrived += 1
        held += 1
        pacer.arrived(1, now)
        while n := pacer.cut(held, now):
            send(n)
    if held:
        send(held)
    return chunks, listener


@settings(deadline=None, max_examples=60)
@given(
    frames=st.integers(1, 300),
    interval_s=st.floats(0.001, 0.5),
    first=st.integers(1, 8),
    largest=st.integers(8, 50),
)
def test_without_headroom_the_chunks_are_the_schedules(
    frames: int, interval_s: float, first: int, largest: int
) -> None:
    schedule = ChunkSchedule(first=first, max=largest)
    chunks, _ = simulate(frames, interval_s, 0.02, 0.0, schedule)
    assert chunks == schedule.split(frames)


@settings(deadline=None, max_examples=300)
@given(
    frames=st.integers(1, 300),
    rtf=st.floats(0.05, 0.95),
    decode_s=st.floats(0.0, 0.05),
    decode_share=st.floats(0.0, 0.5),
    headroom_s=st.floats(0.06, 0.3),
)
def test_a_stream_faster_than_real_time_never_runs_dry_after_its_second_chunk(
    frames: int, rtf: float, decode_s: float, decode_share: float, headroom_s: float
) -> None:
    """Any pace faster than real time; a decode of a fixed part shorter than the headroom plus a
    part per frame (up to half of what a frame's generation leaves of real time), a one-frame
    chunk's decode shorter than that too (a decoder that can keep up): every chunk after the
    second arrives before the audio before it has played out (the pacer judges the pace from the
    third frame on), each frame sent once, in order."""
    interval = rtf * FRAME_S
    assume(decode_s + decode_share * (FRAME_S - interval) < FRAME_S - interval)
    chunks, listener = simulate(
        frames, interval, decode_s, headroom_s, ChunkSchedule(), decode_share * (FRAME_S - interval)
    )
    assert sum(chunks) == frames and all(n > 0 for n in chunks)
    assert max(listener.late_ms[2:], default=0.0) == 0.0
    assert all(n <= ChunkSchedule().max for n in chunks)


@settings(deadline=None, max_examples=100)
@given(frames=st.integers(1, 300), rtf=st.floats(1.001, 3.0), headroom_s=st.floats(0.0, 0.3))
def test_a_stream_slower_than_real_time_keeps_the_schedule_once_behind(
    frames: int, rtf: float, headroom_s: float
) -> None:
    """It runs dry whatever the cuts, and frame-by-frame chunks would only cost the decoder: a
    chunk is cut early only while the frames are less than the headroom behind real time (one
    per frame at most), and where the third frame is already that far behind, never."""
    chunks, _ = simulate(frames, rtf * FRAME_S, 0.02, headroom_s, ChunkSchedule())
    scheduled = ChunkSchedule().split(frames)
    within = headroom_s / (FRAME_S * (rtf - 1)) + 1  # frames k with (k - 1) behind <= headroom
    assert sum(chunks) == frames and len(chunks) <= len(scheduled) + within
    if 2 * FRAME_S * (rtf - 1) > headroom_s + 1e-9:
        assert chunks == scheduled


@settings(deadline=None, max_examples=60)
@given(rtf=st.floats(0.01, 0.3), decode_s=st.floats(0.0, 0.01), headroom_s=st.floats(0.02, 0.12))
def test_a_fast_stream_keeps_the_schedule(rtf: float, decode_s: float, headroom_s: float) -> None:
    """Where generation is several times real time (a GPU) the deadline is never near: each
    chunk is full before the audio of the one before runs down to the headroom and the decode
    (the first doubling, 4 frames generated while 2 play, is the tightest)."""
    assume(4 * rtf * FRAME_S + decode_s + 4 * decode_s / 2 < 2 * FRAME_S - headroom_s - 1e-3)
    chunks, _ = simulate(200, rtf * FRAME_S, decode_s, headroom_s, ChunkSchedule())
    assert chunks == ChunkSchedule().split(200)


@pytest.mark.parametrize("rtf", [0.6, 0.75, 0.9])
def test_the_schedule_alone_runs_dry_below_twice_real_time(rtf: float) -> None:
    """What the pacer is for: the doubling chunks underrun a stream at these paces, with a decode
    like the stack's on 2 CPU cores (a fixed 20 ms and 25 ms a frame); paced, none after the second."""
    _, listener = simulate(100, rtf * FRAME_S, 0.02, 0.0, ChunkSchedule(), 0.025 * (1 - rtf))
    assert listener.underruns >= 3
    _, paced = simulate(100, rtf * FRAME_S, 0.02, 0.12, ChunkSchedule(), 0.025 * (1 - rtf))
    assert max(paced.late_ms[2:]) == 0.0


def test_a_late_chunk_moves_the_listeners_clock() -> None:
    pacer = PlayoutPacer(ChunkSchedule(first=2), FRAME_S, 0.12)
    for t in (9.9, 9.95, 9.97):
        pacer.arrived(1, t)
    pacer.sent(2, 10.0, 0.0)  # plays until 10.16
    assert pacer.cut(1, 10.02) == 0 and pacer.wait_s(1, 10.02) == pytest.approx(0.02)
    assert pacer.left_s(10.1) == pytest.approx(0.06)
    assert pacer.cut(1, 10.1) == 1 and pacer.wait_s(1, 10.1) == 0.0
    pacer.sent(1, 10.5, 0.02)  # 0.34 s late: the listener resumes at 10.5 and plays until 10.58
    assert pacer.left_s(10.5) == pytest.approx(0.08)
    assert pacer.cut(0, 10.5) == 0 and pacer.wait_s(0, 10.5) is None


def test_the_decode_of_the_frames_held_brings_the_cut_forward() -> None:
    pacer = PlayoutPacer(ChunkSchedule(first=2), FRAME_S, 0.1)
    for t in (0.0, 0.01, 0.02):
        pacer.arrived(1, t)
    pacer.sent(2, 0.05, 0.04)  # 20 ms a frame; plays until 0.21
    # 1 frame held: due when 0.1 + 0.02 s is left (at 0.09); each more frame held, 20 ms sooner
    assert pacer.wait_s(1, 0.05) == pytest.approx(0.04)
    assert pacer.wait_s(2, 0.05) == pytest.approx(0.02) and pacer.cut(2, 0.05) == 0
    assert pacer.cut(3, 0.05) == 3


@settings(deadline=None, max_examples=100)
@given(
    fixed=st.floats(0.0, 0.2),
    per_frame=st.floats(0.0, 0.05),
    sizes=st.lists(st.integers(1, 25), min_size=1, max_size=30),
    ask=st.integers(1, 25),
)
def test_the_decode_time_of_a_chunk_is_fitted_from_the_streams_chunks(
    fixed: float, per_frame: float, sizes: list[int], ask: int
) -> None:
    """Chunks that cost ``fixed + per_frame * n``: once two sizes were seen, any size's cost is
    recovered; before, the one size seen is priced exactly and others in proportion."""
    model = DecodeTime()
    assert model.seconds(ask) == 0.0
    for n in sizes:
        model.add(n, fixed + per_frame * n)
    if len(set(sizes)) > 1:
        assert model.seconds(ask) == pytest.approx(fixed + per_frame * ask, rel=1e-6, abs=1e-9)
    else:
        assert model.seconds(sizes[0]) == pytest.approx(fixed + per_frame * sizes[0], rel=1e-6, abs=1e-9)
        assert model.seconds(ask) == pytest.approx((fixed + per_frame * sizes[0]) * ask / sizes[0], rel=1e-6)


def test_a_stream_that_falls_behind_real_time_is_not_cut_early() -> None:
    pacer = PlayoutPacer(ChunkSchedule(first=2), FRAME_S, 0.12)
    for t in (0.0, 0.05, 0.1):
        pacer.arrived(1, t)
    pacer.sent(2, 0.1, 0.0)
    assert pacer.keeping_up() and pacer.cut(1, 0.2) == 1
    pacer.arrived(1, 0.5)  # 3 frames' audio (0.24 s) over 0.5 s
    assert not pacer.keeping_up() and pacer.cut(1, 0.5) == 0 and pacer.wait_s(1, 0.5) is None


# ---------------------------------------------------------------------------------------------
# through the servicer


def _random_frames(servicer: DecoderServicer, n: int) -> np.ndarray:
    assert servicer.decoder is not None
    rng = np.random.default_rng(0)
    return rng.integers(0, servicer.decoder.config.codebook_size, (n, servicer.decoder.num_quantizers))


def _codes(frames: np.ndarray) -> stages_pb2.Codes:
    return stages_pb2.Codes(
        num_frames=frames.shape[0], num_codebooks=frames.shape[1], values=frames.ravel().tolist()
    )


Replies = list[tuple[float, stages_pb2.DecoderServerMessage]]


async def _decode(servicer: DecoderServicer, frames: np.ndarray, gaps_s: list[float]) -> Replies:
    """Decode ``frames`` one per message, sleeping ``gaps_s[i]`` before frame ``i``; the replies
    with the time each came at, from the start."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def requests() -> AsyncIterator[stages_pb2.DecoderClientMessage]:
        start = stages_pb2.DecodeStart(request_id="pacing-test", first_chunk_frames=2, max_chunk_frames=25)
        yield stages_pb2.DecoderClientMessage(start=start)
        for i, gap in enumerate(gaps_s):
            await asyncio.sleep(gap)
            chunk = stages_pb2.CodecChunk(start_frame=i, codes=_codes(frames[i : i + 1]))
            yield stages_pb2.DecoderClientMessage(chunk=chunk)
        yield stages_pb2.DecoderClientMessage(end=stages_pb2.DecodeEnd())

    return [(loop.time() - t0, reply) async for reply in servicer.Decode(requests(), None)]  # type: ignore[arg-type]


def _serve(headrooms_ms: list[float], frames: int, gaps_s: list[float]) -> list[Replies]:
    """One decoder servicer on the tiny checkpoint; the same stream decoded at each headroom."""
    servicer = DecoderServicer(str(CKPT_DIR / "tiny_custom_voice"), DecoderConfig())

    async def run() -> list[Replies]:
        await servicer.load()
        try:
            codes = _random_frames(servicer, frames)
            out = []
            for headroom in headrooms_ms:
                servicer.config.playout_headroom_ms = headroom
                out.append(await _decode(servicer, codes, gaps_s))
            return out
        finally:
            await servicer.close()

    return asyncio.run(run())


def _pcm(replies: Replies) -> list[tuple[float, stages_pb2.PcmChunk]]:
    return [(t, r.pcm) for t, r in replies if r.WhichOneof("message") == "pcm"]


def test_the_servicer_sends_held_frames_before_the_listener_runs_dry_with_the_same_audio() -> None:
    """Frames 0-1 make the first chunk; frame 2 comes at once (160 ms of audio left to play,
    more than the 100 ms headroom: held), then the talker pauses for a second: with the pacer
    frame 2 leaves about 60 ms after the first chunk, not with frame 3; without it, it waits for
    the 4-frame chunk. The audio is the same, sample for sample within rounding."""
    paced, scheduled = _serve([100.0, 0.0], 4, [0.0, 0.0, 0.0, 1.0])
    pcm = _pcm(paced)
    assert [p.num_frames for _, p in pcm] == [2, 1, 1]
    assert [p.start_frame for _, p in pcm] == [0, 2, 3]
    assert pcm[1][0] - pcm[0][0] < 0.5 and pcm[2][0] >= 1.0
    assert paced[-1][1].done.frames == 4
    assert [p.num_frames for _, p in _pcm(scheduled)] == [2, 2]

    def audio(replies: Replies) -> np.ndarray:
        return np.concatenate([np.frombuffer(p.samples, "<f4") for _, p in _pcm(replies)])

    np.testing.assert_allclose(audio(paced), audio(scheduled), atol=1e-5)
