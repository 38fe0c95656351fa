"""The encoder interface every output encoding implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class AudioEncoder(ABC):
    """Turns consecutive mono float32 chunks into bytes that concatenate to one stream.

    Streaming contract: :meth:`encode` returns every byte the codec can produce from the samples
    seen so far (possibly none while a frame or an Ogg page is incomplete); :meth:`finish` returns
    what the codec still held (its delay, padding, trailers). ``encode()* + finish()`` is one
    complete file or stream.
    """

    blocking: bool = False
    """True when encoding costs enough CPU to be worth a worker thread."""

    @abstractmethod
    def encode(self, samples: np.ndarray) -> bytes:
        """Bytes for the next ``samples`` (possibly empty while the encoder buffers)."""

    def finish(self) -> bytes:
        """Bytes still held back at the end of the stream (call once)."""
        return b""
