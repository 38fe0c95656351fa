"""tts_common.audio: decoding, validation, resampling and output encoding."""

from __future__ import annotations

import io
import math
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tts_common import audio
from tts_common.audio import AudioError, AudioLimits

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "reference"

SR = 24000


def _tone(seconds: float = 0.5, sr: int = SR, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 220 * t)
    if channels > 1:
        x = np.stack([x * (c + 1) / channels for c in range(channels)], axis=1)
    return x.astype(np.float32)


def _file_bytes(x: np.ndarray, sr: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


# ---------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    "fmt,subtype,tol", [("WAV", "FLOAT", 0.0), ("WAV", "PCM_16", 1e-4), ("FLAC", "PCM_16", 1e-4)]
)
def test_decode_file_formats_roundtrip(fmt: str, subtype: str, tol: float) -> None:
    x = _tone()
    y = audio.load_audio(_file_bytes(x, SR, fmt, subtype))
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.abs(y - x).max() <= tol


def test_decode_ogg_vorbis() -> None:
    x = _tone(1.0)
    y = audio.load_audio(_file_bytes(x, SR, "OGG", "VORBIS"))
    assert y.dtype == np.float32 and abs(len(y) - len(x)) < 100
    assert abs(np.sqrt(np.mean(y**2)) - np.sqrt(np.mean(x**2))) < 0.02


def test_fixture_wav_reads_exactly() -> None:
    path = REFERENCE_DIR / "tiny_base" / "ref_24k.wav"
    expected, sr = sf.read(path, dtype="float32")
    assert sr == SR
    np.testing.assert_array_equal(audio.read_audio_file(str(path)), expected)


def test_stereo_downmix_is_channel_mean() -> None:
    x = _tone(channels=2)
    y = audio.load_audio(_file_bytes(x, SR, "WAV", "FLOAT"))
    np.testing.assert_allclose(y, x.mean(axis=1), atol=1e-7)


def test_raw_float32_and_pcm16() -> None:
    x = _tone()
    y = audio.load_audio(x.astype("<f4").tobytes(), SR, encoding="float32")
    np.testing.assert_array_equal(y, x)
    pcm = np.round(x * 32767).astype("<i2")
    y = audio.load_audio(pcm.tobytes(), SR, encoding="pcm16")
    np.testing.assert_allclose(y, pcm / 32768.0, atol=1e-7)
    # interleaved stereo
    st = _tone(channels=2)
    y = audio.load_audio(st.astype("<f4").tobytes(), SR, encoding="float32", channels=2)
    np.testing.assert_allclose(y, st.mean(axis=1), atol=1e-7)


def test_numpy_input_and_int16_array() -> None:
    x = _tone()
    np.testing.assert_array_equal(audio.load_audio(x, SR), x)
    pcm = np.round(x * 32767).astype(np.int16)
    np.testing.assert_allclose(audio.load_audio(pcm, SR), pcm / 32768.0, atol=1e-7)


def test_resample_matches_librosa_length_rule() -> None:
    for n, sr_in in [(16000, 16000), (16001, 16000), (44100, 44100), (12345, 22050), (8000, 8000)]:
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 0.1
        y = audio.resample(x, sr_in, SR)
        assert y.dtype == np.float32
        assert len(y) == math.ceil(n * (SR / sr_in))


def test_resample_16k_fixture_through_soxr_hq() -> None:
    """16 kHz -> 24 kHz is soxr HQ (fixture embeddings/codes confirm it numerically elsewhere)."""
    import soxr

    x, sr = sf.read(REFERENCE_DIR / "tiny_base" / "ref_16k.wav", dtype="float32")
    y = audio.read_audio_file(str(REFERENCE_DIR / "tiny_base" / "ref_16k.wav"))
    np.testing.assert_array_equal(y, soxr.resample(x, sr, SR, quality="soxr_hq"))
    assert len(y) == 48000


def test_same_rate_is_identity() -> None:
    x = _tone()
    np.testing.assert_array_equal(audio.resample(x, SR, SR), x)


# ---------------------------------------------------------------------------- validation


def test_undecodable_bytes() -> None:
    with pytest.raises(AudioError, match="could not decode audio"):
        audio.load_audio(b"this is not audio at all" * 10)


@pytest.mark.parametrize(
    "data,kwargs",
    [
        (b"", {}),
        (b"", {"encoding": "pcm16", "sample_rate": SR}),
        (np.zeros(0, np.float32), {"sample_rate": SR}),
    ],
)
def test_empty(data: object, kwargs: dict) -> None:
    with pytest.raises(AudioError, match="empty"):
        audio.load_audio(data, **kwargs)  # type: ignore[arg-type]


def test_empty_wav_file() -> None:
    with pytest.raises(AudioError, match="empty"):
        audio.load_audio(_file_bytes(np.zeros(0, np.float32), SR, "WAV", "FLOAT"))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite(bad: float) -> None:
    x = _tone()
    x[100] = bad
    with pytest.raises(AudioError, match="NaN/Inf"):
        audio.load_audio(x, SR)
    with pytest.raises(AudioError, match="NaN/Inf"):
        audio.load_audio(_file_bytes(x, SR, "WAV", "FLOAT"))


def test_too_long_and_configurable() -> None:
    x = _tone(2.0)
    with pytest.raises(AudioError, match=r"too long: 2\.00 s \(maximum 1 s\)"):
        audio.load_audio(_file_bytes(x, SR, "WAV", "FLOAT"), limits=AudioLimits(max_seconds=1.0))
    with pytest.raises(AudioError, match="too long"):
        audio.load_audio(x, SR, limits=AudioLimits(max_seconds=1.0))
    long = np.zeros(int(61 * 8000), np.float32)
    with pytest.raises(AudioError, match="maximum 60 s"):
        audio.load_audio(long, 8000)
    assert len(audio.load_audio(x, SR, limits=AudioLimits(max_seconds=3.0))) == len(x)


def test_too_short() -> None:
    with pytest.raises(AudioError, match="too short"):
        audio.load_audio(_tone(0.05), SR)
    assert len(audio.load_audio(_tone(0.1), SR)) == 2400


@pytest.mark.parametrize("sr", [4000, 7999, 192001, 384000])
def test_unsupported_sample_rate(sr: int) -> None:
    with pytest.raises(AudioError, match="unsupported sample rate"):
        audio.load_audio(np.zeros(sr, np.float32), sr)
    with pytest.raises(AudioError, match="unsupported sample rate"):
        audio.load_audio(b"\x00\x00" * 100, sr, encoding="pcm16")


def test_unsupported_rate_in_file_header() -> None:
    data = _file_bytes(np.zeros(1000, np.float32), 4000, "WAV", "FLOAT")
    with pytest.raises(AudioError, match="unsupported sample rate 4000"):
        audio.load_audio(data)


def test_raw_misc_errors() -> None:
    with pytest.raises(AudioError, match="not a multiple of 2"):
        audio.load_audio(b"\x00" * 4801, SR, encoding="pcm16")
    with pytest.raises(AudioError, match="sample_rate is required"):
        audio.load_audio(b"\x00" * 4800, encoding="pcm16")
    with pytest.raises(AudioError, match="sample_rate is required"):
        audio.load_audio(_tone())
    with pytest.raises(AudioError, match="contradicts"):
        audio.load_audio(_file_bytes(_tone(), SR, "WAV", "FLOAT"), 16000)
    with pytest.raises(AudioError, match="unknown raw sample encoding"):
        audio.load_audio(b"\x00" * 4800, SR, encoding="mulaw")  # type: ignore[arg-type]


def test_audio_error_is_value_error() -> None:
    assert issubclass(AudioError, ValueError)


# ---------------------------------------------------------------------------- output


def test_pcm16_and_f32_bytes() -> None:
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0], np.float32)
    pcm = np.frombuffer(audio.float_to_pcm16(x), "<i2")
    np.testing.assert_array_equal(pcm, [0, 16384, -16384, 32767, -32767, 32767, -32767])
    np.testing.assert_array_equal(np.frombuffer(audio.float_to_f32le(x), "<f4"), x)


@pytest.mark.parametrize("fmt", ["wav", "flac", "ogg", "opus"])
def test_encode_audio_file_roundtrip(fmt: str) -> None:
    if fmt not in audio.supported_file_formats():
        pytest.skip(f"libsndfile lacks {fmt}")
    x = _tone(1.0)
    data = audio.encode_audio_file(x, SR, fmt)  # type: ignore[arg-type]
    y, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == SR
    if fmt in ("wav", "flac"):
        # PCM_16 files carry exactly the raw PCM16 stream values.
        np.testing.assert_array_equal(np.round(y * 32768).astype("<i2").tobytes(), audio.float_to_pcm16(x))
    else:
        assert abs(len(y) - len(x)) < 1000


def test_encode_float_wav_and_errors() -> None:
    x = _tone()
    y, _ = sf.read(io.BytesIO(audio.encode_audio_file(x, SR, "wav", subtype="FLOAT")), dtype="float32")
    np.testing.assert_array_equal(y, x)
    with pytest.raises(AudioError, match="unknown output format"):
        audio.encode_audio_file(x, SR, "mp4")  # type: ignore[arg-type]
    with pytest.raises(AudioError, match="opus needs"):
        audio.encode_audio_file(x, 22050, "opus")


@pytest.mark.parametrize("sample_format", ["pcm16", "float32"])
def test_wav_header_known_length(sample_format: str) -> None:
    x = _tone()
    body = audio.float_to_pcm16(x) if sample_format == "pcm16" else audio.float_to_f32le(x)
    header = audio.wav_header(SR, len(x), sample_format=sample_format)  # type: ignore[arg-type]
    assert len(header) == 44
    y, sr = sf.read(io.BytesIO(header + body), dtype="float32")
    assert sr == SR and len(y) == len(x)
    assert np.abs(y - x).max() < (1e-4 if sample_format == "pcm16" else 1e-9)


def test_wav_header_streaming() -> None:
    x = _tone()
    header = audio.wav_header(SR)
    assert header[4:8] == b"\xff\xff\xff\xff" and header[40:44] == b"\xff\xff\xff\xff"
    data = header + audio.float_to_pcm16(x[:1000]) + audio.float_to_pcm16(x[1000:])
    y, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == SR and len(y) == len(x)
    with wave.open(io.BytesIO(data)) as w:
        assert w.getframerate() == SR and w.getnchannels() == 1 and w.getsampwidth() == 2
        assert w.readframes(len(x)) == audio.float_to_pcm16(x)
