"""FLAC (buffered) and Ogg Vorbis (streamed by Ogg page) through libsndfile.

* ``OGG_VORBIS``: libvorbis through libsndfile, written to an in-memory sink. libogg closes a
  page once it holds about 4 KB (~0.7 s of speech at libsndfile's default quality), and libsndfile offers no flush or page-latency control for
  Vorbis (``SFC_SET_OGG_PAGE_LATENCY_MS`` only affects its Opus writer), so most chunks carry no
  bytes and the rest comes with the last one. FFmpeg is no alternative: PyAV's wheels ship no
  libvorbis and FFmpeg's own Vorbis encoder is experimental and stereo-only.
* ``FLAC``: **buffered**. libFLAC writes its frames incrementally, but on close it seeks back
  and patches STREAMINFO (total length, MD5). A FLAC stream without that patch ("unknown
  length") decodes in FFmpeg and in libsndfile's C API, but python-soundfile reports its length
  as 2**63-1 frames: ``soundfile.read`` fails allocating it and ``SoundFile.read`` fails on the
  seek it does after each block (checked with libsndfile 1.2.2 / soundfile 0.14; the gateway
  itself reads voice-clone references that way). Ogg FLAC is worse: libsndfile does not open it.
  So the gateway keeps the FLAC bytes and sends the whole, correct file in the last chunk;
  earlier chunks have empty ``data`` but correct ``num_samples`` / ``start_sample``.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import soundfile as sf

from tts_common.audio import float_to_pcm16
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2

from .base import AudioEncoder
from .formats import ENCODING_NAMES

logger = logging.getLogger(__name__)

# encoding -> (libsndfile container, subtype, streams incrementally)
SOUNDFILE_FORMATS: dict[int, tuple[str, str, bool]] = {
    tts_pb2.AUDIO_ENCODING_FLAC: ("FLAC", "PCM_16", False),
    tts_pb2.AUDIO_ENCODING_OGG_VORBIS: ("OGG", "VORBIS", True),
}


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
    """FLAC / Ogg Vorbis through libsndfile (see the module doc for streaming)."""

    blocking = True

    def __init__(self, encoding: int, sample_rate: int) -> None:
        container, subtype, self.streaming = SOUNDFILE_FORMATS[encoding]
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
