"""Sample-by-sample encodings: PCM16, FLOAT32, WAV (PCM16 behind a header) and G.711.

Each chunk's bytes depend on that chunk alone, so they all stream exactly: nothing is held back.
G.711 (ITU-T G.711, mu-law and A-law) compands the same PCM16 values the PCM16 encoding sends,
implemented here from the standard's segment/quantisation rule. FFmpeg's ``pcm_mulaw`` /
``pcm_alaw`` encoders are not used: they round at the segment boundaries differently from
G.711 (512 of the 65536 inputs differ for mu-law, 964 for A-law, against the reference
``audioop`` implementation).
"""

from __future__ import annotations

import numpy as np

from tts_common.audio import float_to_f32le, float_to_pcm16, wav_header

from .base import AudioEncoder

# Upper ends of the eight G.711 segments, on the biased 14-bit magnitude (mu-law) and on the
# 13-bit magnitude (A-law); a segment's quantisation step doubles from one to the next.
_ULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
_ULAW_BIAS = 33  # 0x84 >> 2: shifts the magnitude so segment edges fall on powers of two


def pcm16_to_ulaw(pcm: np.ndarray) -> bytes:
    """G.711 mu-law bytes for int16 samples (the 14 most significant bits are coded)."""
    x = np.asarray(pcm, dtype=np.int16).astype(np.int32) >> 2
    negative = x < 0
    # Magnitudes past the top segment (|x| >= 8159) overload to its largest code.
    magnitude = np.minimum(np.abs(x) + _ULAW_BIAS, _ULAW_SEGMENT_ENDS[-1])
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, magnitude).astype(np.int32)
    step = (magnitude >> (segment + 1)) & 0x0F
    code = (segment << 4) | step
    # Transmitted inverted (more one bits on the line); the sign bit is set for positive values.
    return (code ^ np.where(negative, 0x7F, 0xFF)).astype(np.uint8).tobytes()


def pcm16_to_alaw(pcm: np.ndarray) -> bytes:
    """G.711 A-law bytes for int16 samples (the 13 most significant bits are coded)."""
    x = np.asarray(pcm, dtype=np.int16).astype(np.int32) >> 3
    negative = x < 0
    magnitude = np.where(negative, -x - 1, x)  # one's complement: -1 -> 0 keeps 4096 levels a side
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude).astype(np.int32)
    step = (magnitude >> np.maximum(segment, 1)) & 0x0F  # segments 0 and 1 share the finest step
    code = (segment << 4) | step
    # Even bits inverted (0x55) per G.711; the sign bit is set for positive values.
    return (code ^ np.where(negative, 0x55, 0xD5)).astype(np.uint8).tobytes()


class Pcm16Encoder(AudioEncoder):
    """Raw signed 16-bit little-endian samples."""

    def encode(self, samples: np.ndarray) -> bytes:
        return float_to_pcm16(samples)


class Float32Encoder(AudioEncoder):
    """Raw float32 little-endian samples."""

    def encode(self, samples: np.ndarray) -> bytes:
        return float_to_f32le(samples)


class WavEncoder(AudioEncoder):
    """Streaming WAV: header of unknown length in front of the first bytes, then PCM16."""

    def __init__(self, sample_rate: int) -> None:
        self._header: bytes | None = wav_header(sample_rate, None)

    def _take_header(self) -> bytes:
        header, self._header = self._header or b"", None
        return header

    def encode(self, samples: np.ndarray) -> bytes:
        return self._take_header() + float_to_pcm16(samples)

    def finish(self) -> bytes:
        return self._take_header()  # a stream without samples is still a (valid, empty) WAV


class G711Encoder(AudioEncoder):
    """Headerless G.711 mu-law or A-law, one byte per sample."""

    def __init__(self, law: str) -> None:
        if law not in ("mulaw", "alaw"):
            raise ValueError(f"unknown G.711 law {law!r}")
        self._compand = pcm16_to_ulaw if law == "mulaw" else pcm16_to_alaw

    def encode(self, samples: np.ndarray) -> bytes:
        return self._compand(np.frombuffer(float_to_pcm16(samples), dtype="<i2"))
