"""Seamless streaming decode: any chunking == whole-utterance decode; batched == solo; fixtures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoder_service.model.decoder import CodecDecoder
from decoder_service.model.loading import load_codec_decoder
from decoder_service.model.random_init import init_random_weights
from decoder_service.model.streaming import (
    ChunkSchedule,
    DecoderSession,
    SessionBatcher,
    advance_sessions,
)
from tests.helpers.decoder import TOL, fixture_cases, small_config
from tests.helpers.fixtures import CHECKPOINT_NAMES, CKPT_DIR

EXACT = 1e-5  # float32 streamed vs whole (different matmul shapes only)


@pytest.fixture(scope="module")
def small() -> CodecDecoder:
    """Small random decoder (12 samples/frame, window 5, 2 layers, GQA) — cheap to run."""
    return init_random_weights(CodecDecoder(small_config()), seed=7).eval()


@pytest.fixture(scope="module")
def tiny() -> CodecDecoder:
    """The tiny fixture decoder: window 72 and the real 1920x upsampling chain."""
    return load_codec_decoder(CKPT_DIR / "tiny_base")


def random_codes(dec: CodecDecoder, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, dec.config.codebook_size, (frames, dec.num_quantizers), generator=gen)


def stream(
    dec: CodecDecoder,
    codes: torch.Tensor,
    sizes: list[int],
    prefix: torch.Tensor | None = None,
    fast_prefix: bool = True,
) -> torch.Tensor:
    session = DecoderSession(dec, prefix_codes=prefix, fast_prefix=fast_prefix)
    outs, i = [], 0
    for n in sizes:
        out = session.feed(codes[i : i + n])
        assert out.shape == (n * dec.samples_per_frame,)
        outs.append(out)
        i += n
    assert session.frames == codes.shape[0]
    return torch.cat(outs)


def chunking(total: int) -> st.SearchStrategy[list[int]]:
    """Random split of ``total`` frames; mostly small chunks (1-frame chunks common)."""
    return st.lists(st.integers(1, 9), min_size=1, max_size=total).map(lambda xs: _fit(xs, total))


def _fit(sizes: list[int], total: int) -> list[int]:
    out, left = [], total
    for s in sizes:
        if left == 0:
            break
        out.append(min(s, left))
        left -= out[-1]
    while left:
        out.append(min(9, left))
        left -= out[-1]
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), frames=st.integers(1, 40), prefix_frames=st.integers(0, 40), seed=st.integers(0, 1000))
def test_streaming_equals_whole_decode_any_chunking(
    small: CodecDecoder, data: st.DataObject, frames: int, prefix_frames: int, seed: int
) -> None:
    codes = random_codes(small, prefix_frames + frames, seed)
    whole = small.decode(codes)
    sizes = data.draw(chunking(frames), label="chunks")
    prefix = codes[:prefix_frames] if prefix_frames else None
    fast = data.draw(st.booleans(), label="fast_prefix")
    out = stream(small, codes[prefix_frames:], sizes, prefix, fast)
    spf = small.samples_per_frame
    assert float((out - whole[prefix_frames * spf :]).abs().max()) < EXACT


@pytest.fixture(scope="module")
def small_window72() -> CodecDecoder:
    """Small random decoder with the real 72-frame attention window (long-utterance property)."""
    return init_random_weights(CodecDecoder(small_config(sliding_window=72)), seed=11).eval()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), frames=st.integers(301, 360), seed=st.integers(0, 1000))
def test_long_utterances_any_chunking_window_72(
    small_window72: CodecDecoder, data: st.DataObject, frames: int, seed: int
) -> None:
    """> 300 frames, random chunkings with frequent 1-frame chunks: streamed == whole within 1e-5."""
    dec = small_window72
    codes = random_codes(dec, frames, seed)
    sizes = data.draw(
        st.lists(st.one_of(st.just(1), st.integers(1, 40)), min_size=1, max_size=frames).map(
            lambda xs: _fit(xs, frames)
        ),
        label="chunks",
    )
    out = stream(dec, codes, sizes)
    assert float((out - dec.decode(codes)).abs().max()) < EXACT


def test_one_frame_chunks(small: CodecDecoder) -> None:
    codes = random_codes(small, 30, 1)
    out = stream(small, codes, [1] * 30)
    assert float((out - small.decode(codes)).abs().max()) < EXACT


def test_long_utterance_window_72_real_upsampling(tiny: CodecDecoder) -> None:
    """> 300 frames on the tiny fixture decoder (window 72, 1920x): streaming is the exact decode
    (the official 300-frame chunked decode differs after frame 300)."""
    codes = random_codes(tiny, 320, 2)
    whole = tiny.decode(codes)
    sizes = ChunkSchedule(first=1, growth=2.0, max=40).split(320)
    out = stream(tiny, codes, sizes)
    # this checkpoint's decoder amplifies float rounding (~600x internal gain): the official
    # batch-vs-single decode differs by ~1.5e-5 too
    assert float((out - whole).abs().max()) < 3e-5
    chunked = tiny.decode_official_chunked(codes)
    assert float((chunked[: 300 * 1920] - whole[: 300 * 1920]).abs().max()) < EXACT
    # after frame 300 the official decode sees only 25 frames of context: measurably different
    assert float((chunked[300 * 1920 :] - whole[300 * 1920 :]).abs().max()) > 3e-5


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 1000))
def test_batched_equals_solo(small: CodecDecoder, data: st.DataObject, seed: int) -> None:
    """Streams at different positions, with different chunk lengths (0 included), one forward."""
    n_streams = data.draw(st.integers(1, 5), label="streams")
    prefixes = [data.draw(st.integers(0, 12), label="prefix") for _ in range(n_streams)]
    codes = [random_codes(small, 40, seed + i) for i in range(n_streams)]
    batched = [
        DecoderSession(small, codes[i][: prefixes[i]] if prefixes[i] else None) for i in range(n_streams)
    ]
    solo = [DecoderSession(small, codes[i][: prefixes[i]] if prefixes[i] else None) for i in range(n_streams)]
    bucketed = SessionBatcher(small, batch_buckets=(2, 8), frame_buckets=(3, 8), pad_to_buckets=True)
    unpadded = SessionBatcher(small, batch_buckets=(2, 8), frame_buckets=(3, 8))
    pos = list(prefixes)
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        sizes = [data.draw(st.integers(0, 9), label="n") for _ in range(n_streams)]
        chunks = [codes[i][pos[i] : pos[i] + sizes[i]] for i in range(n_streams)]
        runner = (advance_sessions, bucketed.advance, unpadded.advance)[step % 3]
        outs = runner(batched, chunks)
        for i in range(n_streams):
            ref = solo[i].feed(chunks[i])
            assert outs[i].shape == ref.shape
            if ref.numel():
                assert float((outs[i] - ref).abs().max()) < EXACT
            pos[i] += int(chunks[i].shape[0])
    for b, s in zip(batched, solo):
        assert b.position == s.position
        for key in s.state:
            assert b.state[key].shape == s.state[key].shape


def test_conv_stack_row_groups_are_exact(small: CodecDecoder) -> None:
    """On CPU the conv stack runs over groups of rows (cpu_back_group_frames): same output."""
    codes = [random_codes(small, 12, 40 + i) for i in range(5)]
    outs = {}
    for group_frames in (None, 4):
        small.cpu_back_group_frames = group_frames
        try:
            sessions = [DecoderSession(small) for _ in codes]
            outs[group_frames] = [
                advance_sessions(sessions, [c[:n] for c, n in zip(codes, (3, 1, 0, 3, 2))]),
                advance_sessions(sessions, [c[3:] for c in codes]),
            ]
        finally:
            small.cpu_back_group_frames = 32
    for a, b in zip(outs[None], outs[4]):
        for x, y in zip(a, b):
            assert x.shape == y.shape and (x.numel() == 0 or float((x - y).abs().max()) < EXACT)


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_fixture_waveforms_by_streaming(name: str) -> None:
    """Official waveforms from streaming with the default schedule (ICL: reference codes as prefix;
    the fixtures' official cut equals ref_frames * 1920 exactly)."""
    dec = load_codec_decoder(CKPT_DIR / name)
    cases = fixture_cases(name)
    sessions = [DecoderSession(dec, prefix_codes=ref) for _, ref, _, _ in cases]
    pending = [list(ChunkSchedule().split(c[0].shape[0])) for c in cases]
    fed = [0] * len(cases)
    outs: list[list[torch.Tensor]] = [[] for _ in cases]
    while any(pending):  # advance every live stream together, like a serving loop
        live = [i for i in range(len(cases)) if pending[i]]
        chunks = []
        for i in live:
            n = pending[i].pop(0)
            chunks.append(cases[i][0][fed[i] : fed[i] + n])
            fed[i] += n
        for i, out in zip(live, advance_sessions([sessions[i] for i in live], chunks)):
            outs[i].append(out)
    for (_codes, _ref, wav, case), pieces in zip(cases, outs):
        out = torch.cat(pieces).numpy()
        assert out.shape == wav.shape, case
        assert float(np.abs(out - wav).max()) < TOL, case


def test_chunk_schedule() -> None:
    sched = ChunkSchedule(first=2, growth=2.0, max=25)
    it = sched.sizes()
    assert [next(it) for _ in range(7)] == [2, 4, 8, 16, 25, 25, 25]
    assert sched.split(20) == [2, 4, 8, 6]
    assert sum(sched.split(1000)) == 1000
    assert ChunkSchedule(first=1, growth=1.5, max=5).split(12) == [1, 2, 3, 4, 2]
    assert sched.size(0) == 2 and sched.size(3) == 16 and sched.size(50) == 25
    with pytest.raises(ValueError):
        ChunkSchedule(first=0)


def test_invalid_codes_rejected(small: CodecDecoder) -> None:
    session = DecoderSession(small)
    with pytest.raises(ValueError):
        session.feed(torch.zeros(3, 15, dtype=torch.long))
    with pytest.raises(ValueError):
        session.feed(torch.full((2, 16), small.config.codebook_size))
    with pytest.raises(ValueError):
        advance_sessions([session, session], [torch.zeros(1, 16), torch.zeros(1, 16)])
    assert session.feed(torch.zeros(0, 16, dtype=torch.long)).numel() == 0


def test_bfloat16_streaming_runs() -> None:
    dec = load_codec_decoder(CKPT_DIR / "tiny_base", dtype=torch.bfloat16)
    codes = random_codes(dec, 6, 4)
    out = stream(dec, codes, [2, 4])
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert float((out - dec.decode(codes)).abs().max()) < 0.1
