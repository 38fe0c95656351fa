"""Streaming output encoders: float32 24 kHz PCM chunks in, encoded ``AudioChunk`` bytes out.

Which encodings stream (bytes leave with the chunk that produced them):

* ``PCM16``, ``FLOAT32``: raw samples, every chunk independently usable.
* ``WAV``: a 44-byte header with unknown length (sizes 0xFFFFFFFF) in front of the first
  chunk, then PCM16; a stream without any sample is just the header.
* ``OGG_VORBIS``, ``OGG_OPUS``: encoded incrementally with libsndfile writing to an in-memory
  sink; libsndfile emits Ogg pages as they fill (every few hundred ms of audio), so some chunks
  carry no bytes and the rest comes with the last chunk. The concatenation is one complete file.
* ``FLAC``: **buffered**. libFLAC writes its frames incrementally, but on close it seeks back
  and patches STREAMINFO (total length, MD5); a streamed FLAC without that patch has "unknown
  length", which libsndfile (hence ``soundfile.read``) cannot decode. So the gateway keeps the
  FLAC bytes and sends the whole, correct file in the last chunk; earlier chunks have empty
  ``data`` but correct ``num_samples`` / ``start_sample``.

Resampling to another output rate uses ``soxr.ResampleStream`` (HQ), whose chunked output
concatenates to exactly what one-shot ``soxr.resample`` gives for the whole signal, and the total
length is fixed up at the end to ``ceil(n * out / in)`` like ``tts_common.audio.resample``.

PCM16 conversion is the shared :func:`tts_common.audio.float_to_pcm16` (clip, x32767, round), so
PCM16, WAV and FLAC carry identical sample values.
"""

from __future__ import annotations

import io
import logging
import math
from abc import ABC, abstractmethod

import numpy as np
import soundfile as sf
import soxr

from tts_common.audio import float_to_f32le, float_to_pcm16, wav_header
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2

logger = logging.getLogger(__name__)

NATIVE_SAMPLE_RATE = 24000
MIN_OUTPUT_SAMPLE_RATE = 8000
MAX_OUTPUT_SAMPLE_RATE = 192000
OPUS_SAMPLE_RATES = (8000, 12000, 16000, 24000, 48000)

ENCODING_NAMES: dict[int, str] = {
    tts_pb2.AUDIO_ENCODING_PCM16: "PCM16",
    tts_pb2.AUDIO_ENCODING_FLOAT32: "FLOAT32",
    tts_pb2.AUDIO_ENCODING_WAV: "WAV",
    tts_pb2.AUDIO_ENCODING_FLAC: "FLAC",
    tts_pb2.AUDIO_ENCODING_OGG_OPUS: "OGG_OPUS",
    tts_pb2.AUDIO_ENCODING_OGG_VORBIS: "OGG_VORBIS",
}

# encoding -> (libsndfile container, subtype, streams incrementally)
_SOUNDFILE_FORMATS: dict[int, tuple[str, str, bool]] = {
    tts_pb2.AUDIO_ENCODING_FLAC: ("FLAC", "PCM_16", False),
    tts_pb2.AUDIO_ENCODING_OGG_VORBIS: ("OGG", "VORBIS", True),
    tts_pb2.AUDIO_ENCODING_OGG_OPUS: ("OGG", "OPUS", True),
}


class AudioEncoder(ABC):
    """Turns consecutive mono float32 chunks into bytes that concatenate to one stream."""

    blocking: bool = False
    """True when encoding costs enough CPU to be worth a worker thread."""

    @abstractmethod
    def encode(self, samples: np.ndarray) -> bytes:
        """Bytes for the next ``samples`` (possibly empty while the encoder buffers)."""

    def finish(self) -> bytes:
        """Bytes still held back at the end of the stream (call once)."""
        return b""


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


class _StreamSink:
    """File-like object libsndfile writes to through soundfile's virtual I/O.

    Keeps only the bytes not yet taken (:meth:`take`). Writes landing before the taken offset
    (libFLAC patching its header on close) are dropped, which is why FLAC is not streamed.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._base = 0  # absolute offset of _buf[0]
        self._pos = 0
        self._size = 0
        self.dropped_bytes = 0

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = self._size + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        start = max(self._pos - self._base, 0)
        end = len(self._buf) if size < 0 else min(start + size, len(self._buf))
        data = bytes(self._buf[start:end]) if end > start else b""
        self._pos += len(data)
        return data

    def write(self, data: bytes) -> int:
        data = bytes(data)
        written = len(data)
        start, end = self._pos, self._pos + written
        if start < self._base:
            cut = min(self._base - start, len(data))
            self.dropped_bytes += cut
            data, start = data[cut:], start + cut
        if data:
            rel_start, rel_end = start - self._base, end - self._base
            if rel_end > len(self._buf):
                self._buf.extend(bytes(rel_end - len(self._buf)))
            self._buf[rel_start:rel_end] = data
        self._pos = end
        self._size = max(self._size, end)
        return written

    def take(self) -> bytes:
        """The bytes written since the last take (they can no longer be changed)."""
        data = bytes(self._buf)
        self._base += len(data)
        self._buf.clear()
        return data


class SoundFileEncoder(AudioEncoder):
    """FLAC / Ogg Vorbis / Ogg Opus through libsndfile (see the module doc for streaming)."""

    blocking = True

    def __init__(self, encoding: int, sample_rate: int) -> None:
        container, subtype, self.streaming = _SOUNDFILE_FORMATS[encoding]
        self._pcm16 = subtype == "PCM_16"
        self._sink = _StreamSink()
        try:
            self._file: sf.SoundFile | None = sf.SoundFile(
                self._sink, "w", samplerate=sample_rate, channels=1, format=container, subtype=subtype
            )
        except Exception as exc:  # LibsndfileError/TypeError: unsupported by this libsndfile
            raise InvalidRequestError(
                f"output encoding {ENCODING_NAMES[encoding]} at {sample_rate} Hz is not supported: {exc}"
            ) from exc

    def encode(self, samples: np.ndarray) -> bytes:
        assert self._file is not None, "encode() after finish()"
        if samples.size:
            if self._pcm16:  # written verbatim: same values as the PCM16 encoding
                self._file.write(np.frombuffer(float_to_pcm16(samples), dtype="<i2"))
            else:
                self._file.write(np.clip(samples, -1.0, 1.0))
        return self._sink.take() if self.streaming else b""

    def finish(self) -> bytes:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._sink.dropped_bytes:
            logger.warning("encoder patched %d already-sent bytes", self._sink.dropped_bytes)
        return self._sink.take()


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
    if encoding == tts_pb2.AUDIO_ENCODING_OGG_OPUS and sample_rate not in OPUS_SAMPLE_RATES:
        raise InvalidRequestError(
            f"OGG_OPUS supports sample rates {', '.join(map(str, OPUS_SAMPLE_RATES))} Hz, got {sample_rate}"
        )


def create_encoder(encoding: int, sample_rate: int) -> AudioEncoder:
    """The encoder for a resolved (never UNSPECIFIED) encoding; InvalidRequestError if it
    cannot be produced at ``sample_rate``."""
    check_output_format(encoding, sample_rate)
    if encoding == tts_pb2.AUDIO_ENCODING_PCM16:
        return Pcm16Encoder()
    if encoding == tts_pb2.AUDIO_ENCODING_FLOAT32:
        return Float32Encoder()
    if encoding == tts_pb2.AUDIO_ENCODING_WAV:
        return WavEncoder(sample_rate)
    return SoundFileEncoder(encoding, sample_rate)


class StreamResampler:
    """Chunked soxr HQ resampling whose output equals resampling the whole signal at once,
    with the total length fixed to ``ceil(n_in * out / in)`` at :meth:`flush`."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
        self._n_in = 0
        self._n_out = 0

    def process(self, samples: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(samples, dtype=np.float32)
        self._n_in += x.size
        y = self._stream.resample_chunk(x)
        self._n_out += y.size
        return y

    def flush(self) -> np.ndarray:
        """The remaining output (call once, at the end)."""
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        expected = math.ceil(self._n_in * self.out_rate / self.in_rate)
        want = max(expected - self._n_out, 0)
        if tail.size > want:
            tail = tail[:want]
        elif tail.size < want:
            tail = np.concatenate([tail, np.zeros(want - tail.size, dtype=np.float32)])
        self._n_out += tail.size
        return np.asarray(tail, dtype=np.float32)


class AudioOutput:
    """Resampling (if the output rate is not native) followed by the encoder."""

    def __init__(self, encoding: int, sample_rate: int, input_sample_rate: int = NATIVE_SAMPLE_RATE) -> None:
        self.encoding = encoding
        self.sample_rate = sample_rate
        self.encoder = create_encoder(encoding, sample_rate)
        self.resampler = (
            StreamResampler(input_sample_rate, sample_rate) if sample_rate != input_sample_rate else None
        )

    @property
    def blocking(self) -> bool:
        """Whether :meth:`process` is CPU-heavy enough for a worker thread."""
        return self.resampler is not None or self.encoder.blocking

    def process(self, samples: np.ndarray) -> tuple[bytes, int]:
        """Encoded bytes and the number of output samples for the next input chunk."""
        if self.resampler is not None:
            samples = self.resampler.process(samples)
        return self.encoder.encode(samples), int(samples.size)

    def finish(self) -> tuple[bytes, int]:
        """Everything held back (resampler tail, encoder trailer) and its sample count."""
        data, n = b"", 0
        if self.resampler is not None:
            tail = self.resampler.flush()
            if tail.size:
                data, n = self.encoder.encode(tail), int(tail.size)
        return data + self.encoder.finish(), n


__all__ = [
    "AudioEncoder",
    "AudioOutput",
    "ENCODING_NAMES",
    "Float32Encoder",
    "MAX_OUTPUT_SAMPLE_RATE",
    "MIN_OUTPUT_SAMPLE_RATE",
    "NATIVE_SAMPLE_RATE",
    "OPUS_SAMPLE_RATES",
    "Pcm16Encoder",
    "SoundFileEncoder",
    "StreamResampler",
    "WavEncoder",
    "check_output_format",
    "create_encoder",
]
