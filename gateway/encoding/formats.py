"""Which output encodings exist, at which sample rates and speeds: the request checks.

Everything here is pure validation (no codec is opened), so the gateway can reject a request
before any work starts. Errors are :class:`InvalidRequestError` (gRPC ``INVALID_ARGUMENT``).
"""

from __future__ import annotations

import math

from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2

NATIVE_SAMPLE_RATE = 24000
MIN_OUTPUT_SAMPLE_RATE = 8000
MAX_OUTPUT_SAMPLE_RATE = 192000

OPUS_SAMPLE_RATES = (8000, 12000, 16000, 24000, 48000)
# The MPEG-1/2/2.5 Layer III rates (libmp3lame refuses others).
MP3_SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# The ADTS sampling-frequency table (ISO 14496-3) within 8..192 kHz.
AAC_SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
# G.711 is defined at 8 kHz: the default for MULAW/ALAW when the request leaves the rate at 0
# (the one exception to "0 = native rate"); other rates are still allowed.
G711_SAMPLE_RATE = 8000

# Time-scale factor range (OpenAI's `speed`); 1.0 bypasses the stage.
MIN_SPEED = 0.25
MAX_SPEED = 4.0

ENCODING_NAMES: dict[int, str] = {
    tts_pb2.AUDIO_ENCODING_PCM16: "PCM16",
    tts_pb2.AUDIO_ENCODING_FLOAT32: "FLOAT32",
    tts_pb2.AUDIO_ENCODING_WAV: "WAV",
    tts_pb2.AUDIO_ENCODING_FLAC: "FLAC",
    tts_pb2.AUDIO_ENCODING_OGG_OPUS: "OGG_OPUS",
    tts_pb2.AUDIO_ENCODING_OGG_VORBIS: "OGG_VORBIS",
    tts_pb2.AUDIO_ENCODING_MP3: "MP3",
    tts_pb2.AUDIO_ENCODING_AAC: "AAC",
    tts_pb2.AUDIO_ENCODING_MULAW: "MULAW",
    tts_pb2.AUDIO_ENCODING_ALAW: "ALAW",
}

_G711_ENCODINGS = (tts_pb2.AUDIO_ENCODING_MULAW, tts_pb2.AUDIO_ENCODING_ALAW)

# Encodings whose codec accepts only some rates of the general range.
_RESTRICTED_RATES: dict[int, tuple[int, ...]] = {
    tts_pb2.AUDIO_ENCODING_OGG_OPUS: OPUS_SAMPLE_RATES,
    tts_pb2.AUDIO_ENCODING_MP3: MP3_SAMPLE_RATES,
    tts_pb2.AUDIO_ENCODING_AAC: AAC_SAMPLE_RATES,
}


def default_sample_rate(encoding: int, native_rate: int = NATIVE_SAMPLE_RATE) -> int:
    """The rate a request with ``sample_rate`` 0 gets: 8000 Hz for G.711, else ``native_rate``."""
    return G711_SAMPLE_RATE if encoding in _G711_ENCODINGS else native_rate


def check_output_format(encoding: int, sample_rate: int) -> None:
    """InvalidRequestError unless ``encoding`` at ``sample_rate`` can be produced."""
    if encoding not in ENCODING_NAMES:
        raise InvalidRequestError(
            f"unknown output.encoding {encoding} (expected one of {', '.join(ENCODING_NAMES.values())})"
        )
    if not MIN_OUTPUT_SAMPLE_RATE <= sample_rate <= MAX_OUTPUT_SAMPLE_RATE:
        raise InvalidRequestError(
            f"output.sample_rate {sample_rate} Hz is out of range (0 for the native "
            f"{NATIVE_SAMPLE_RATE} Hz, or {MIN_OUTPUT_SAMPLE_RATE}..{MAX_OUTPUT_SAMPLE_RATE} Hz)"
        )
    rates = _RESTRICTED_RATES.get(encoding)
    if rates is not None and sample_rate not in rates:
        raise InvalidRequestError(
            f"{ENCODING_NAMES[encoding]} supports sample rates {', '.join(map(str, rates))} Hz, got {sample_rate}"
        )


def check_speed(speed: float) -> None:
    """InvalidRequestError unless ``speed`` is a time-scale factor in [0.25, 4.0]."""
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise InvalidRequestError(
            f"speed must be in [{MIN_SPEED}, {MAX_SPEED}] (1.0 = unchanged), got {speed}"
        )


__all__ = [
    "AAC_SAMPLE_RATES",
    "ENCODING_NAMES",
    "G711_SAMPLE_RATE",
    "MAX_OUTPUT_SAMPLE_RATE",
    "MAX_SPEED",
    "MIN_OUTPUT_SAMPLE_RATE",
    "MIN_SPEED",
    "MP3_SAMPLE_RATES",
    "NATIVE_SAMPLE_RATE",
    "OPUS_SAMPLE_RATES",
    "check_output_format",
    "check_speed",
    "default_sample_rate",
]
