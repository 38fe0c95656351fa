"""Lossy encoders through FFmpeg's libraries (PyAV): MP3, AAC (ADTS) and Opus (Ogg).

Each wraps one FFmpeg encoder (a codec context, no muxer) and frames its packets itself, so every
packet leaves with the chunk whose samples completed it:

* MP3 (``libmp3lame``, constant bit rate): packets are whole MP3 frames; the stream is their
  concatenation. No ID3 tag and no Xing/LAME header: the latter is only written by seeking back
  at the end, which a stream cannot do, so decoders keep the encoder delay (1105 samples of
  near-silence in front) and the padding of the last frame.
* AAC-LC (FFmpeg's native ``aac``): every packet gets a 7-byte ADTS header (ISO 14496-3), which
  makes the stream self-synchronising; decoders output the 1024 priming samples first.
* Opus (``libopus``) in Ogg: the Opus headers (RFC 7845) and one Ogg page per chunk holding the
  packets it completed (:mod:`.ogg`); the pre-skip and the final page's granule position make
  decoders return exactly the input's samples.

What an encoder still holds (an incomplete codec frame, its look-ahead) is flushed by
:meth:`finish`. Frames are fed at the codec's native float format, clipped to [-1, 1] like the
libsndfile encoders.
"""

from __future__ import annotations

import random
from typing import Any

import av
import numpy as np

from tts_common.errors import InvalidRequestError

from .base import AudioEncoder
from .ogg import OggStreamWriter

MP3_BIT_RATE = 64000
"""Constant bit rate of MP3 output: near-transparent for mono speech at 24 kHz, and a valid
Layer III rate for MPEG-1, 2 and 2.5 (every allowed sample rate)."""

AAC_BIT_RATE = 64000
"""AAC-LC bit rate (lowered at 8 kHz to AAC's ceiling of 6144 bits per 1024-sample frame)."""

OPUS_BIT_RATE = 32000
"""Opus (VBR) target bit rate: Opus' recommended range for full-band mono speech."""

# ISO 14496-3 sampling frequency index (7350 Hz, index 12, is below the gateway's range).
_ADTS_RATE_INDEX = {
    rate: i
    for i, rate in enumerate(
        (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000)
    )
}
_OPUS_GRANULE_RATE = 48000  # Ogg Opus granule positions always count 48 kHz samples
_OPUS_VENDOR = b"qwen3-tts-grpc"


def _open_codec(name: str, sample_rate: int, bit_rate: int) -> Any:
    """An opened mono encoder taking float samples (packed when offered, else planar)."""
    try:
        ctx: Any = av.CodecContext.create(name, "w")
        formats = [fmt.name for fmt in ctx.codec.audio_formats]
        ctx.format = "flt" if "flt" in formats else "fltp"
        ctx.sample_rate = sample_rate
        ctx.layout = "mono"
        ctx.bit_rate = bit_rate
        ctx.open()
    except (av.FFmpegError, ValueError) as exc:
        raise InvalidRequestError(f"{name} cannot encode mono audio at {sample_rate} Hz: {exc}") from exc
    return ctx


class PyAVEncoder(AudioEncoder):
    """Float chunks into one FFmpeg encoder; subclasses turn its packets into stream bytes."""

    blocking = True

    def __init__(self, codec: str, sample_rate: int, bit_rate: int) -> None:
        self.sample_rate = sample_rate
        self._ctx = _open_codec(codec, sample_rate, bit_rate)
        self._pts = 0
        self._finished = False

    def _packets(self, samples: np.ndarray) -> list[bytes]:
        assert not self._finished, "encode() after finish()"
        if not samples.size:
            return []
        x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(x, format=self._ctx.format.name, layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += x.shape[1]
        # PyAV re-cuts the frames to the codec's frame size and keeps the remainder for later.
        return [bytes(packet) for packet in self._ctx.encode(frame)]

    def _flush_packets(self) -> list[bytes]:
        if self._finished:
            return []
        self._finished = True
        return [bytes(packet) for packet in self._ctx.encode(None)]


class Mp3Encoder(PyAVEncoder):
    """MP3 at :data:`MP3_BIT_RATE` CBR: a bare sequence of MP3 frames."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__("libmp3lame", sample_rate, MP3_BIT_RATE)

    def encode(self, samples: np.ndarray) -> bytes:
        return b"".join(self._packets(samples))

    def finish(self) -> bytes:
        return b"".join(self._flush_packets())


def adts_header(payload_size: int, sample_rate: int) -> bytes:
    """The 7-byte ADTS header (no CRC) of one mono AAC-LC frame of ``payload_size`` bytes."""
    frame_length = payload_size + 7
    if frame_length >= 1 << 13:
        raise ValueError(f"AAC frame of {payload_size} bytes does not fit in ADTS")
    index = _ADTS_RATE_INDEX[sample_rate]
    bits = (
        (0xFFF << 44)  # syncword
        | (0 << 43)  # MPEG-4
        | (0 << 41)  # layer
        | (1 << 40)  # protection absent (no CRC)
        | (1 << 38)  # profile: audio object type 2 (AAC LC) - 1
        | (index << 34)  # sampling frequency index
        | (1 << 30)  # channel configuration: mono
        | (frame_length << 13)
        | (0x7FF << 2)  # buffer fullness: variable bit rate
    )  # private/original/home/copyright bits and "raw data blocks - 1" are 0
    return bits.to_bytes(7, "big")


class AacEncoder(PyAVEncoder):
    """AAC-LC in ADTS framing."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__("aac", sample_rate, min(AAC_BIT_RATE, 6 * sample_rate))

    def _frame(self, packets: list[bytes]) -> bytes:
        return b"".join(adts_header(len(p), self.sample_rate) + p for p in packets)

    def encode(self, samples: np.ndarray) -> bytes:
        return self._frame(self._packets(samples))

    def finish(self) -> bytes:
        return self._frame(self._flush_packets())


class OggOpusEncoder(PyAVEncoder):
    """Opus in Ogg: headers with the first bytes, then one page per chunk's packets."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__("libopus", sample_rate, OPUS_BIT_RATE)
        self._scale = _OPUS_GRANULE_RATE // sample_rate
        # FFmpeg's libopus wrapper puts the identification header (OpusHead, RFC 7845 5.1) in
        # the codec extradata, with the encoder's look-ahead as pre-skip.
        opus_head = bytes(self._ctx.extradata)
        if opus_head[:8] != b"OpusHead":
            raise RuntimeError("libopus did not provide an OpusHead header")
        self._pre_skip = int.from_bytes(opus_head[10:12], "little")
        opus_tags = b"OpusTags" + len(_OPUS_VENDOR).to_bytes(4, "little") + _OPUS_VENDOR + bytes(4)
        self._ogg = OggStreamWriter(random.getrandbits(32))
        # Each header packet alone on its page, both with granule position 0 (RFC 7845 3).
        self._headers: bytes | None = self._ogg.pages([(opus_head, 0)]) + self._ogg.pages([(opus_tags, 0)])
        self._n_packets = 0
        self._n_samples = 0

    def _take_headers(self) -> bytes:
        headers, self._headers = self._headers or b"", None
        return headers

    def _granules(self, packets: list[bytes]) -> list[tuple[bytes, int]]:
        # Granule = 48 kHz samples decodable through the packet, pre-skip included: every
        # libopus packet codes one codec frame.
        step = self._ctx.frame_size * self._scale
        out = []
        for packet in packets:
            self._n_packets += 1
            out.append((packet, self._n_packets * step))
        return out

    def encode(self, samples: np.ndarray) -> bytes:
        self._n_samples += int(samples.size)
        return self._take_headers() + self._ogg.pages(self._granules(self._packets(samples)))

    def finish(self) -> bytes:
        headers = self._take_headers()
        packets = self._granules(self._flush_packets())
        # The last page's granule ends the stream at exactly the input length: decoders drop
        # the padding of the final frame (RFC 7845 4.5).
        end = self._pre_skip + self._n_samples * self._scale
        packets = [(data, min(granule, end)) for data, granule in packets]
        if packets:
            packets[-1] = (packets[-1][0], end)
        return headers + self._ogg.pages(packets, last=True)


__all__ = [
    "AAC_BIT_RATE",
    "AacEncoder",
    "MP3_BIT_RATE",
    "Mp3Encoder",
    "OPUS_BIT_RATE",
    "OggOpusEncoder",
    "PyAVEncoder",
    "adts_header",
]
