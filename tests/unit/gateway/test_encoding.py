"""Output encoders and the speed stage: every encoding streamed with random chunkings decodes
(PyAV, and soundfile where libsndfile reads the format) to the expected samples; streaming is
proven by decoding what left before finish(); G.711 against an independent implementation."""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import av
import numpy as np
import pytest
import soundfile as sf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.encoding import (
    AAC_SAMPLE_RATES,
    MP3_SAMPLE_RATES,
    OPUS_SAMPLE_RATES,
    AudioOutput,
    StreamTempo,
    check_output_format,
    create_encoder,
)
from gateway.encoding.ogg import ogg_crc
from gateway.encoding.pcm import pcm16_to_alaw, pcm16_to_ulaw
from gateway.encoding.tempo import atempo_stages
from gateway.synthesis.request import plan_output
from tts_common.audio import float_to_pcm16, resample
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2

with warnings.catch_warnings():  # stdlib audioop (deprecated) below 3.13, audioop-lts from 3.13
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")

E = tts_pb2
SR = 24000

# Encoder delay that decoders keep for the formats without gapless metadata (MP3: LAME's
# 576 + 529 samples; AAC: one 1024-sample priming frame), and the most padding at the end:
# AAC's frame, Vorbis' long block (FFmpeg ignores the end granule of libsndfile's Vorbis; Ogg
# Opus is trimmed exactly), MP3 below.
_DELAY = {E.AUDIO_ENCODING_MP3: 1105, E.AUDIO_ENCODING_AAC: 1024}
_FRAME = {E.AUDIO_ENCODING_AAC: 1024, E.AUDIO_ENCODING_OGG_VORBIS: 2048}


def _mp3_padding(rate: int) -> int:
    # LAME pads the end to whole frames after flushing its 576-sample MDCT overlap too: less
    # than two frames (1152 samples at MPEG-1 rates, 576 at MPEG-2/2.5 rates).
    return 2 * (1152 if rate >= 32000 else 576)


# Waveform correlation the lossy codecs must keep with the exact (resampled) input. Measured on
# this signal at every allowed rate: >= 0.994 (MP3 64k, AAC 64k, Opus 32k, Vorbis q0.4). A
# dropped, duplicated or misplaced chunk or a wrong delay makes the tail incoherent and drops the
# correlation far lower; 0.98 leaves room for other codec builds.
_MIN_CORRELATION = 0.98


def speech_like(n: int, seed: int = 0) -> np.ndarray:
    """A voiced-speech stand-in: 15 harmonics of a 150 Hz vibrato pitch, amplitude-modulated,
    with a little noise (peaks ~0.5; most energy below 4 kHz so every output rate keeps it)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    phase = 2 * np.pi * np.cumsum(150 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))) / SR
    x = sum((0.25 / k) * np.sin(k * phase + rng.uniform(0, 6)) for k in range(1, 16))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 1.3 * t)
    return np.asarray(x * envelope + 0.01 * rng.standard_normal(n), dtype=np.float32)


@st.composite
def chunkings(draw: st.DrawFn, n: int, max_cuts: int = 12) -> list[int]:
    """Random chunk sizes summing to ``n`` (empty chunks and tiny ones included)."""
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=max_cuts)))
    edges = [0, *cuts, n]
    return [b - a for a, b in zip(edges, edges[1:])]


def run_output(output: AudioOutput, x: np.ndarray, sizes: Sequence[int]) -> tuple[list[bytes], bytes, int]:
    """(bytes per chunk, finish() bytes, total samples) of ``x`` fed in ``sizes`` chunks."""
    parts, total, i = [], 0, 0
    for size in sizes:
        data, n = output.process(x[i : i + size])
        parts.append(data)
        total, i = total + n, i + size
    tail, n = output.finish()
    return parts, tail, total + n


def reference(x: np.ndarray, rate: int, sizes: Sequence[int]) -> np.ndarray:
    """The exact float samples every encoder gets: the FLOAT32 output of the same chain."""
    parts, tail, total = run_output(AudioOutput(E.AUDIO_ENCODING_FLOAT32, rate), x, sizes)
    y = np.frombuffer(b"".join(parts) + tail, "<f4")
    assert y.size == total
    return y


def decode_av(data: bytes, fmt: str | None = None) -> tuple[int, np.ndarray]:
    """(sample rate, mono float32 samples) decoded by FFmpeg; int16 scaled by 1/32768."""
    with av.open(io.BytesIO(data), format=fmt) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.channels == 1
        parts = []
        for frame in container.decode(stream):
            a = frame.to_ndarray().reshape(-1)
            parts.append(a / np.float32(32768) if a.dtype == np.int16 else a.astype(np.float32))
        rate = stream.codec_context.sample_rate
    return rate, (np.concatenate(parts) if parts else np.zeros(0, np.float32))


# Headerless streams: name the demuxer (FFmpeg's probe needs more than a few frames to guess).
_DEMUXER = {E.AUDIO_ENCODING_MP3: "mp3", E.AUDIO_ENCODING_AAC: "aac"}


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


_SIGNAL = speech_like(int(SR * 1.3))


# ------------------------------------------------------------------------------------------------
# Lossless: exact sample values


@settings(max_examples=30, deadline=None)
@given(
    encoding=st.sampled_from(
        [E.AUDIO_ENCODING_PCM16, E.AUDIO_ENCODING_FLOAT32, E.AUDIO_ENCODING_WAV, E.AUDIO_ENCODING_FLAC]
    ),
    rate=st.sampled_from([24000, 16000, 44100]),
    sizes=chunkings(_SIGNAL.size),
)
def test_lossless_encodings_decode_to_the_exact_values(encoding: int, rate: int, sizes: list[int]) -> None:
    x = _SIGNAL * np.float32(2.5)  # peaks beyond [-1, 1]: the shared clipping is checked too
    y = reference(x, rate, sizes)  # the FLOAT32 output: the input, or its one-shot resampling
    if rate == SR:
        np.testing.assert_array_equal(y, x)
    else:
        np.testing.assert_allclose(y, resample(x, SR, rate), atol=1e-5)
    if encoding == E.AUDIO_ENCODING_FLOAT32:
        return
    parts, tail, total = run_output(AudioOutput(encoding, rate), x, sizes)
    data = b"".join(parts) + tail
    assert total == y.size
    pcm16 = np.frombuffer(float_to_pcm16(y), "<i2")
    if encoding == E.AUDIO_ENCODING_PCM16:
        np.testing.assert_array_equal(np.frombuffer(data, "<i2"), pcm16)
        return
    decoded_rate, decoded = decode_av(data)
    assert decoded_rate == rate
    np.testing.assert_array_equal(np.rint(decoded * 32768).astype(np.int16), pcm16)
    with sf.SoundFile(io.BytesIO(data)) as fh:  # libsndfile reads both (WAV: up to the end)
        assert fh.samplerate == rate
        np.testing.assert_array_equal(fh.read(dtype="int16"), pcm16)


# ------------------------------------------------------------------------------------------------
# Lossy: length and waveform correlation

_LOSSY_RATES = {
    E.AUDIO_ENCODING_MP3: MP3_SAMPLE_RATES,
    E.AUDIO_ENCODING_AAC: AAC_SAMPLE_RATES,
    E.AUDIO_ENCODING_OGG_OPUS: OPUS_SAMPLE_RATES,
    E.AUDIO_ENCODING_OGG_VORBIS: (8000, 22050, 24000, 48000),
}


@st.composite
def lossy_formats(draw: st.DrawFn) -> tuple[int, int]:
    encoding = draw(st.sampled_from(sorted(_LOSSY_RATES)))
    return encoding, draw(st.sampled_from(_LOSSY_RATES[encoding]))


@settings(max_examples=30, deadline=None)
@given(fmt=lossy_formats(), sizes=chunkings(_SIGNAL.size))
def test_lossy_encodings_decode_to_the_signal(fmt: tuple[int, int], sizes: list[int]) -> None:
    encoding, rate = fmt
    y = reference(_SIGNAL, rate, sizes)
    parts, tail, total = run_output(AudioOutput(encoding, rate), _SIGNAL, sizes)
    data = b"".join(parts) + tail
    assert total == y.size
    decoded_rate, decoded = decode_av(data, _DEMUXER.get(encoding))
    if encoding == E.AUDIO_ENCODING_OGG_OPUS:  # FFmpeg decodes Opus at 48 kHz
        assert decoded_rate == 48000 and decoded.size == y.size * 48000 // rate
        decoded = decoded[:: 48000 // rate]
    else:
        assert decoded_rate == rate
    delay = _DELAY.get(encoding, 0)
    if encoding == E.AUDIO_ENCODING_OGG_OPUS:
        assert decoded.size == y.size  # pre-skip and end granule trim exactly
    else:  # the delay in front (MP3, AAC: no gapless metadata), the last codec block padded
        padding = _FRAME.get(encoding) or _mp3_padding(rate)
        assert y.size + delay <= decoded.size < y.size + delay + padding
    assert correlation(decoded[delay : delay + y.size], y) > _MIN_CORRELATION
    if encoding != E.AUDIO_ENCODING_AAC:  # libsndfile has no AAC
        via_sf, sf_rate = sf.read(io.BytesIO(data), dtype="float32")
        assert sf_rate == rate
        # libsndfile trims Ogg streams to the end granule (FFmpeg does not for Vorbis)
        assert via_sf.size == (decoded.size if encoding == E.AUDIO_ENCODING_MP3 else y.size)
        assert correlation(via_sf[delay : delay + y.size], y) > _MIN_CORRELATION


# ------------------------------------------------------------------------------------------------
# Streaming: bytes leave with their chunk

# Samples a chunk must complete before the codec emits bytes: one codec frame plus its look-ahead.
_STREAMING = [
    E.AUDIO_ENCODING_PCM16,
    E.AUDIO_ENCODING_FLOAT32,
    E.AUDIO_ENCODING_WAV,
    E.AUDIO_ENCODING_MULAW,
    E.AUDIO_ENCODING_ALAW,
    E.AUDIO_ENCODING_MP3,
    E.AUDIO_ENCODING_AAC,
    E.AUDIO_ENCODING_OGG_OPUS,
]


# Input samples a codec may still hold after a chunk: LAME's look-ahead (psychoacoustic model and
# MDCT overlap, measured 3217 at 24 kHz), the AAC encoder's frame queue plus look-ahead (measured
# 2432), one 20 ms Opus frame; the sample formats hold nothing.
_HELD_BACK = {E.AUDIO_ENCODING_MP3: 3 * 1152, E.AUDIO_ENCODING_AAC: 3 * 1024, E.AUDIO_ENCODING_OGG_OPUS: 480}


def _decoded_length(encoding: int, data: bytes, rate: int) -> int:
    """Input samples that ``data`` (a prefix of a stream) gives back, codec delay removed."""
    if encoding in (E.AUDIO_ENCODING_PCM16, E.AUDIO_ENCODING_FLOAT32):
        return len(data) // (2 if encoding == E.AUDIO_ENCODING_PCM16 else 4)
    if encoding in (E.AUDIO_ENCODING_MULAW, E.AUDIO_ENCODING_ALAW):
        return len(data)
    if encoding in _DEMUXER:  # FFmpeg's parser + decoder: its demuxers refuse a stream of 1 frame
        ctx = av.CodecContext.create(_DEMUXER[encoding], "r")
        frames = [f for packet in ctx.parse(data) + ctx.parse(None) for f in ctx.decode(packet)]
        return sum(f.samples for f in frames + ctx.decode(None)) - _DELAY[encoding]
    decoded_rate, decoded = decode_av(data)
    return decoded.size * rate // decoded_rate


@pytest.mark.parametrize("encoding", _STREAMING)
def test_every_chunk_is_decodable_when_it_leaves(encoding: int) -> None:
    """After each 80 ms chunk the bytes sent so far decode to all of the input but what the codec
    may hold back (nothing for the sample formats); finish() then releases the rest."""
    rate = 8000 if encoding in (E.AUDIO_ENCODING_MULAW, E.AUDIO_ENCODING_ALAW) else SR
    output = AudioOutput(encoding, rate, input_sample_rate=rate)
    x = speech_like(rate * 2)
    step = rate * 80 // 1000
    limit = _HELD_BACK.get(encoding, 0)
    sent = b""
    for fed in range(step, x.size + 1, step):
        data, _ = output.process(x[fed - step : fed])
        assert data or fed <= limit, f"no bytes after {fed} samples"
        sent += data
        assert fed - _decoded_length(encoding, sent, rate) <= limit
    tail, _ = output.finish()
    assert bool(tail) == (encoding in _HELD_BACK)
    assert _decoded_length(encoding, sent + tail, rate) >= x.size


def test_vorbis_streams_by_page_and_flac_is_buffered() -> None:
    x = speech_like(SR * 4, seed=3)
    output = AudioOutput(E.AUDIO_ENCODING_OGG_VORBIS, SR)
    early = b"".join(output.process(x[i : i + 1920])[0] for i in range(0, x.size, 1920))
    assert early[:4] == b"OggS" and len(early) > 4096  # whole pages left before the end
    output = AudioOutput(E.AUDIO_ENCODING_FLAC, SR)
    assert not any(output.process(x[i : i + 1920])[0] for i in range(0, x.size, 1920))
    assert output.finish()[0][:4] == b"fLaC"


def test_ogg_opus_sends_headers_first_and_one_page_per_chunk() -> None:
    output = AudioOutput(E.AUDIO_ENCODING_OGG_OPUS, SR)
    first, _ = output.process(_SIGNAL[:1920])
    assert first.count(b"OggS") == 3 and b"OpusHead" in first and b"OpusTags" in first
    for i in range(1920, 1920 * 6, 1920):
        assert output.process(_SIGNAL[i : i + 1920])[0].count(b"OggS") == 1


def test_ogg_crc_is_crc32_with_the_ogg_parameters() -> None:
    # CRC-32/POSIX (cksum) shares polynomial, init 0 and bit order; it only inverts the result.
    assert ogg_crc(b"123456789") ^ 0xFFFFFFFF == 0x765E7680
    assert ogg_crc(b"") == 0


# ------------------------------------------------------------------------------------------------
# G.711


def test_g711_matches_the_reference_for_every_pcm16_value() -> None:
    every = np.arange(-32768, 32768, dtype=np.int16)
    assert pcm16_to_ulaw(every) == audioop.lin2ulaw(every.tobytes(), 2)
    assert pcm16_to_alaw(every) == audioop.lin2alaw(every.tobytes(), 2)


@settings(max_examples=20, deadline=None)
@given(
    law=st.sampled_from([E.AUDIO_ENCODING_MULAW, E.AUDIO_ENCODING_ALAW]),
    rate=st.sampled_from([8000, 16000, 24000]),
    sizes=chunkings(_SIGNAL.size),
)
def test_g711_output_companding_the_pcm16_values(law: int, rate: int, sizes: list[int]) -> None:
    y = reference(_SIGNAL, rate, sizes)
    parts, tail, total = run_output(AudioOutput(law, rate), _SIGNAL, sizes)
    data = b"".join(parts) + tail
    pcm16 = float_to_pcm16(y)
    compand = audioop.lin2ulaw if law == E.AUDIO_ENCODING_MULAW else audioop.lin2alaw
    assert total == len(data) == y.size
    assert data == compand(pcm16, 2)
    # and FFmpeg's G.711 decoder reads it back within the companding error (< 4 % + 1 LSB)
    decoded_rate, decoded = decode_av(data, "mulaw" if law == E.AUDIO_ENCODING_MULAW else "alaw")
    assert decoded.size == y.size
    np.testing.assert_allclose(decoded, y, rtol=0.04, atol=2e-3)


def test_g711_defaults_to_8khz_when_the_rate_is_left_0() -> None:
    info = tts_pb2.ModelInfo(sample_rate=SR)

    def rate(encoding: int, sample_rate: int = 0) -> int:
        request = tts_pb2.SynthesizeRequest(
            output=tts_pb2.AudioFormat(encoding=encoding, sample_rate=sample_rate)
        )
        plan = plan_output(request, info, default_first=2, default_max=25)
        assert plan.encoding == (encoding or E.AUDIO_ENCODING_PCM16)
        return plan.sample_rate

    for encoding in (E.AUDIO_ENCODING_MULAW, E.AUDIO_ENCODING_ALAW):
        assert rate(encoding) == 8000
        assert rate(encoding, 16000) == 16000
    for encoding in (E.AUDIO_ENCODING_MP3, E.AUDIO_ENCODING_PCM16, E.AUDIO_ENCODING_UNSPECIFIED):
        assert rate(encoding) == SR


# ------------------------------------------------------------------------------------------------
# Rates and speeds that are refused


@pytest.mark.parametrize(
    ("encoding", "rate", "message"),
    [
        (
            E.AUDIO_ENCODING_MP3,
            96000,
            "MP3 supports sample rates 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000 Hz, got 96000",
        ),
        (E.AUDIO_ENCODING_MP3, 22000, "MP3 supports sample rates .* got 22000"),
        (E.AUDIO_ENCODING_AAC, 22000, "AAC supports sample rates 8000, .*, 96000 Hz, got 22000"),
        (E.AUDIO_ENCODING_AAC, 192000, "AAC supports sample rates .* got 192000"),
        (
            E.AUDIO_ENCODING_OGG_OPUS,
            44100,
            "OGG_OPUS supports sample rates 8000, 12000, 16000, 24000, 48000 Hz",
        ),
        (E.AUDIO_ENCODING_MULAW, 7999, r"output.sample_rate 7999 Hz is out of range"),
        (E.AUDIO_ENCODING_ALAW, 192001, r"output.sample_rate 192001 Hz is out of range"),
    ],
)
def test_unsupported_rates_are_invalid_arguments(encoding: int, rate: int, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        check_output_format(encoding, rate)
    with pytest.raises(InvalidRequestError, match=message):
        create_encoder(encoding, rate)


def test_every_allowed_rate_opens_its_codec() -> None:
    for encoding, rates in _LOSSY_RATES.items():
        for rate in rates:
            create_encoder(encoding, rate)


@pytest.mark.parametrize("speed", [0.0, 0.2499, 4.0001, -1.0, float("nan"), float("inf")])
def test_out_of_range_speeds_are_invalid_arguments(speed: float) -> None:
    with pytest.raises(InvalidRequestError, match=r"speed must be in \[0.25, 4.0\]"):
        AudioOutput(E.AUDIO_ENCODING_PCM16, SR, speed=speed)


# ------------------------------------------------------------------------------------------------
# Speed (time-scale)


def dominant_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spectrum) * rate / x.size)


@settings(max_examples=25, deadline=None)
@given(
    speed=st.one_of(st.sampled_from([0.25, 0.5, 2.0, 4.0]), st.floats(0.25, 4.0)),
    sizes=chunkings(SR * 2, max_cuts=8),
)
@example(speed=0.26, sizes=[SR * 2]).via("the worst two-stage end found by a scan")
@example(speed=0.28125, sizes=[SR * 2]).via("discovered failure")
def test_speed_changes_tempo_not_pitch(speed: float, sizes: list[int]) -> None:
    tone = 440.0
    x = (0.5 * np.sin(2 * np.pi * tone * np.arange(SR * 2) / SR)).astype(np.float32)
    parts, tail, total = run_output(AudioOutput(E.AUDIO_ENCODING_FLOAT32, SR, speed=speed), x, sizes)
    y = np.frombuffer(b"".join(parts) + tail, "<f4")
    assert y.size == total == round(x.size / speed)
    # the audible part lasts input/speed: each chained atempo stage's end differs by at most ~a
    # window (50 ms); slowing below 0.5 chains two (0.26 ends 61 ms off: 0.5 then 0.52)
    audible = np.flatnonzero(np.abs(y) > 0.05)
    assert abs((audible[-1] + 1) - x.size / speed) <= len(atempo_stages(speed)) * 0.05 * SR
    assert abs(dominant_frequency(y, SR) - tone) <= 0.02 * tone


def test_speed_streams_and_chains_into_resampling_and_encoding() -> None:
    output = AudioOutput(E.AUDIO_ENCODING_MP3, 16000, speed=1.5)
    assert output.blocking
    parts, tail, total = run_output(output, _SIGNAL, [1920] * (_SIGNAL.size // 1920 + 1))
    assert sum(map(len, parts)) > 0 and total == -(-round(_SIGNAL.size / 1.5) * 16000 // SR)
    rate, decoded = decode_av(b"".join(parts) + tail)
    assert rate == 16000 and decoded.size >= total


@given(sizes=chunkings(_SIGNAL.size))
@settings(max_examples=10, deadline=None)
def test_speed_one_is_bypassed_bit_identically(sizes: list[int]) -> None:
    output = AudioOutput(E.AUDIO_ENCODING_FLOAT32, SR, speed=1.0)
    assert output.tempo is None and not output.blocking
    parts, tail, _ = run_output(output, _SIGNAL, sizes)
    assert b"".join(parts) + tail == _SIGNAL.astype("<f4").tobytes()


def test_atempo_stages_stay_in_the_filters_clean_range() -> None:
    for speed in (0.25, 0.3, 0.5, 0.9, 1.7, 2.0, 2.5, 4.0):
        stages = atempo_stages(speed)
        assert all(0.5 - 1e-9 <= s <= 2.0 + 1e-9 for s in stages)
        assert np.prod(stages) == pytest.approx(speed)
    assert len(atempo_stages(2.0)) == 1 and len(atempo_stages(4.0)) == 2 and len(atempo_stages(0.3)) == 2
    with pytest.raises(InvalidRequestError):
        StreamTempo(5.0, SR)
