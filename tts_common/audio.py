"""Audio input and output helpers shared by every process.

Input side: reference audio arrives either as an encoded file (WAV/FLAC/OGG/... decoded with
soundfile) or as raw little-endian samples (float32 or PCM16, interleaved when multi-channel) with
a sample rate. It is validated, downmixed to mono (mean over channels), converted to float32 and
resampled with soxr "HQ" — the resampler the official implementation reaches through
``librosa.resample(res_type="soxr_hq")``, including librosa's length fix to
``ceil(n * sr_out / sr_in)`` samples (ARCHITECTURE.md §9.2, §10).

Output side: float32 [-1, 1] waveforms to PCM16 / float32 bytes, whole files (WAV, FLAC,
OGG Vorbis/Opus) and a WAV header for streamed PCM of unknown length.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np
import soundfile as sf
import soxr

MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
DEFAULT_MAX_SECONDS = 60.0
DEFAULT_MIN_SECONDS = 0.1
MAX_CHANNELS = 16

RawEncoding = Literal["pcm16", "float32"]
FileFormat = Literal["wav", "flac", "ogg", "opus"]
SampleFormat = Literal["pcm16", "float32"]


class AudioError(ValueError):
    """Audio that cannot be used: undecodable, empty, non-finite, too short/long, bad rate."""


@dataclass(frozen=True)
class AudioLimits:
    """Duration limits applied to reference audio (seconds, measured at the input rate)."""

    min_seconds: float = DEFAULT_MIN_SECONDS
    max_seconds: float = DEFAULT_MAX_SECONDS


# --------------------------------------------------------------------------------------------
# Input: decoding
# --------------------------------------------------------------------------------------------


def check_sample_rate(sample_rate: int) -> int:
    """Return ``sample_rate`` as int, or raise :class:`AudioError` if outside [8000, 192000] Hz."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise AudioError(f"sample rate must be an integer number of Hz, got {sample_rate!r}")
    if not MIN_SAMPLE_RATE <= int(sample_rate) <= MAX_SAMPLE_RATE:
        raise AudioError(
            f"unsupported sample rate {int(sample_rate)} Hz (supported: {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz)"
        )
    return int(sample_rate)


def _check_frames(frames: int, sample_rate: int, limits: AudioLimits) -> None:
    """Raise :class:`AudioError` if ``frames`` samples at ``sample_rate`` break ``limits``."""
    if frames <= 0:
        raise AudioError("audio is empty (0 samples)")
    seconds = frames / sample_rate
    if seconds > limits.max_seconds:
        raise AudioError(f"audio too long: {seconds:.2f} s (maximum {limits.max_seconds:g} s)")
    if seconds < limits.min_seconds:
        raise AudioError(f"audio too short: {seconds:.3f} s (minimum {limits.min_seconds:g} s)")


def decode_audio_file(data: bytes, limits: AudioLimits = AudioLimits()) -> tuple[np.ndarray, int]:
    """Decode an encoded audio file held in memory.

    Returns ``(samples, sample_rate)`` with samples float32 of shape ``[frames, channels]``.
    The header (rate, length) is checked before the samples are decoded so that an oversized
    upload is rejected cheaply.
    """
    if not data:
        raise AudioError("audio is empty (0 bytes)")
    try:
        with sf.SoundFile(io.BytesIO(data)) as fh:
            sample_rate = check_sample_rate(fh.samplerate)
            if fh.channels > MAX_CHANNELS:
                raise AudioError(f"too many channels: {fh.channels} (maximum {MAX_CHANNELS})")
            # Some containers report no reliable length up front; re-checked after decoding.
            if 0 < fh.frames < 2**62:
                _check_frames(fh.frames, sample_rate, limits)
            samples = fh.read(dtype="float32", always_2d=True)
    except AudioError:
        raise
    except Exception as exc:  # soundfile raises LibsndfileError/RuntimeError/TypeError
        # Only libsndfile's own reason: soundfile's message names its file object (a repr with
        # a heap address), and this message reaches API clients.
        reason = getattr(exc, "error_string", "") or "not a supported audio format"
        raise AudioError(f"could not decode audio file ({len(data)} bytes): {reason}") from exc
    _check_frames(samples.shape[0], sample_rate, limits)
    return samples, sample_rate


def decode_raw_samples(data: bytes, encoding: RawEncoding, channels: int = 1) -> np.ndarray:
    """Interpret little-endian raw samples (interleaved channels) as float32 ``[frames, channels]``.

    PCM16 is scaled by 1/32768 (the soundfile/libsndfile convention for reading).
    """
    if channels < 1 or channels > MAX_CHANNELS:
        raise AudioError(f"invalid channel count {channels} (1..{MAX_CHANNELS})")
    if encoding == "pcm16":
        width, dtype = 2, np.dtype("<i2")
    elif encoding == "float32":
        width, dtype = 4, np.dtype("<f4")
    else:
        raise AudioError(f"unknown raw sample encoding {encoding!r} (expected 'pcm16' or 'float32')")
    if len(data) % (width * channels):
        raise AudioError(
            f"raw {encoding} audio has {len(data)} bytes, not a multiple of {width * channels} "
            f"({width} bytes x {channels} channel(s))"
        )
    samples = np.frombuffer(data, dtype=dtype).reshape(-1, channels)
    if encoding == "pcm16":
        return samples.astype(np.float32) / np.float32(32768.0)
    return samples.astype(np.float32)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Downmix ``[frames]`` or ``[frames, channels]`` to float32 ``[frames]`` (channel mean)."""
    x = np.asarray(samples)
    if x.ndim == 1:
        return x.astype(np.float32, copy=False)
    if x.ndim != 2:
        raise AudioError(f"audio must be 1-D or [frames, channels], got shape {x.shape}")
    if x.shape[1] == 1:
        return np.ascontiguousarray(x[:, 0], dtype=np.float32)
    return x.astype(np.float32, copy=False).mean(axis=1, dtype=np.float32)


def check_finite(samples: np.ndarray) -> None:
    """Raise :class:`AudioError` if any sample is NaN or infinite."""
    if not np.isfinite(samples).all():
        bad = int(np.count_nonzero(~np.isfinite(samples)))
        raise AudioError(f"audio contains {bad} NaN/Inf sample(s)")


def resample(samples: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample mono float32 audio with soxr HQ, as ``librosa.resample(res_type="soxr_hq")``.

    Like librosa (``fix=True``) the result is padded/trimmed to ``ceil(n * sr_out / sr_in)``.
    """
    x = np.ascontiguousarray(samples, dtype=np.float32)
    if sr_in == sr_out:
        return x
    y = soxr.resample(x, sr_in, sr_out, quality="HQ")
    n_out = int(np.ceil(x.shape[-1] * (float(sr_out) / sr_in)))
    if y.shape[-1] > n_out:
        y = y[:n_out]
    elif y.shape[-1] < n_out:
        y = np.pad(y, (0, n_out - y.shape[-1]))
    return np.asarray(y, dtype=np.float32)


def prepare_audio(
    samples: np.ndarray,
    sample_rate: int,
    target_sample_rate: int = 24000,
    limits: AudioLimits = AudioLimits(),
) -> np.ndarray:
    """Validate decoded samples, downmix to mono float32 and resample to ``target_sample_rate``.

    ``samples``: float ``[frames]`` or ``[frames, channels]`` (int16 is scaled by 1/32768).
    """
    sample_rate = check_sample_rate(sample_rate)
    x = np.asarray(samples)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / np.float32(32768.0)
    elif x.dtype.kind != "f":
        raise AudioError(f"audio samples must be float (or int16 PCM), got dtype {x.dtype}")
    _check_frames(x.shape[0] if x.ndim else 0, sample_rate, limits)
    check_finite(x)
    return resample(to_mono(x), sample_rate, target_sample_rate)


def load_audio(
    data: bytes | np.ndarray,
    sample_rate: int | None = None,
    *,
    encoding: Literal["file", "pcm16", "float32"] = "file",
    channels: int = 1,
    target_sample_rate: int = 24000,
    limits: AudioLimits = AudioLimits(),
) -> np.ndarray:
    """Reference audio in any accepted form -> mono float32 at ``target_sample_rate``.

    * ``bytes`` with ``encoding="file"``: an encoded file (rate from its header; ``sample_rate``
      must be None or equal to it).
    * ``bytes`` with ``encoding="pcm16"|"float32"``: raw little-endian samples, ``channels``
      interleaved; ``sample_rate`` required.
    * ``np.ndarray`` (float, ``[frames]`` or ``[frames, channels]``): ``sample_rate`` required.

    Raises :class:`AudioError` with a precise message for every rejected input.
    """
    if isinstance(data, np.ndarray):
        if sample_rate is None:
            raise AudioError("sample_rate is required for raw audio samples")
        return prepare_audio(data, sample_rate, target_sample_rate, limits)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise AudioError(f"audio must be bytes or a numpy array, got {type(data).__name__}")
    data = bytes(data)
    if encoding == "file":
        samples, file_rate = decode_audio_file(data, limits)
        if sample_rate is not None and sample_rate != file_rate:
            raise AudioError(f"sample_rate {sample_rate} Hz contradicts the file header ({file_rate} Hz)")
        return prepare_audio(samples, file_rate, target_sample_rate, limits)
    if sample_rate is None:
        raise AudioError(f"sample_rate is required for raw {encoding} audio")
    check_sample_rate(sample_rate)
    if not data:
        raise AudioError("audio is empty (0 bytes)")
    samples = decode_raw_samples(data, encoding, channels)  # type: ignore[arg-type]
    return prepare_audio(samples, sample_rate, target_sample_rate, limits)


def read_audio_file(
    path: str, target_sample_rate: int = 24000, limits: AudioLimits = AudioLimits()
) -> np.ndarray:
    """:func:`load_audio` for a file on disk (offline CLI, tests)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise AudioError(f"cannot read audio file {path}: {exc}") from exc
    return load_audio(data, encoding="file", target_sample_rate=target_sample_rate, limits=limits)


# --------------------------------------------------------------------------------------------
# Output: encoding
# --------------------------------------------------------------------------------------------


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float audio in [-1, 1] -> PCM16 little-endian bytes (clipped, scaled by 32767, rounded).

    Symmetric scaling never overflows; :func:`encode_audio_file` uses the same conversion for
    PCM_16 files so raw PCM, WAV and FLAC outputs carry identical sample values.
    """
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.rint(x * np.float32(32767.0)).astype("<i2").tobytes()


def float_to_f32le(samples: np.ndarray) -> bytes:
    """Float audio -> float32 little-endian bytes (no clipping)."""
    return np.asarray(samples, dtype="<f4").tobytes()


_FILE_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "opus": ("OGG", "OPUS"),
}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def supported_file_formats() -> list[str]:
    """Output file formats that the installed libsndfile can write."""
    out = []
    for name, (fmt, subtype) in _FILE_FORMATS.items():
        try:
            if sf.check_format(fmt, subtype):
                out.append(name)
        except Exception:  # noqa: BLE001 - old libsndfile builds raise various types for an unknown subtype
            continue
    return out


def encode_audio_file(
    samples: np.ndarray, sample_rate: int, fmt: FileFormat = "wav", subtype: str | None = None
) -> bytes:
    """Mono float audio -> a complete file in memory (``wav``/``flac``: PCM16; ``ogg``: Vorbis;
    ``opus``: Ogg Opus). ``subtype`` overrides the libsndfile subtype (e.g. ``"FLOAT"`` for WAV)."""
    if fmt not in _FILE_FORMATS:
        raise AudioError(f"unknown output format {fmt!r} (expected one of {sorted(_FILE_FORMATS)})")
    container, default_subtype = _FILE_FORMATS[fmt]
    subtype = subtype or default_subtype
    if fmt not in supported_file_formats() and subtype == default_subtype:
        raise AudioError(f"output format {fmt!r} is not supported by the installed libsndfile")
    if fmt == "opus" and sample_rate not in _OPUS_RATES:
        raise AudioError(f"opus needs a sample rate in {_OPUS_RATES}, got {sample_rate}")
    x: np.ndarray = np.asarray(samples, dtype=np.float32)
    if subtype == "PCM_16":
        x = np.frombuffer(float_to_pcm16(x), dtype="<i2")  # written verbatim by libsndfile
    elif subtype != "FLOAT":
        x = np.clip(x, -1.0, 1.0)
    buf = io.BytesIO()
    try:
        sf.write(buf, x, sample_rate, format=container, subtype=subtype)
    except Exception as exc:
        raise AudioError(f"could not encode {fmt} ({subtype}): {exc}") from exc
    return buf.getvalue()


STREAMING_SIZE = 0xFFFFFFFF
"""RIFF/data chunk size written for streams of unknown length (the usual streaming convention)."""


def wav_header(
    sample_rate: int,
    num_samples: int | None = None,
    channels: int = 1,
    sample_format: SampleFormat = "pcm16",
) -> bytes:
    """A 44-byte canonical WAV header for raw PCM16 (format 1) or float32 (format 3) data.

    With ``num_samples=None`` (streaming) the RIFF and data sizes are set to 0xFFFFFFFF so that
    players read until the end of the stream; otherwise they describe exactly ``num_samples``
    frames. Append the sample bytes (:func:`float_to_pcm16` / :func:`float_to_f32le`) after it.
    """
    if sample_format == "pcm16":
        fmt_tag, width = 1, 2
    elif sample_format == "float32":
        fmt_tag, width = 3, 4
    else:
        raise AudioError(f"unknown WAV sample format {sample_format!r}")
    block_align = channels * width
    if num_samples is None:
        data_size = riff_size = STREAMING_SIZE
    else:
        data_size = num_samples * block_align
        if data_size + 36 > 0xFFFFFFFF:
            raise AudioError(f"{num_samples} samples do not fit in a WAV file")
        riff_size = 36 + data_size
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVEfmt "
        + struct.pack(
            "<IHHIIHH", 16, fmt_tag, channels, sample_rate, sample_rate * block_align, block_align, 8 * width
        )
        + b"data"
        + struct.pack("<I", data_size)
    )
