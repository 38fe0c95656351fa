"""Streaming sample-rate conversion for the output chain."""

from __future__ import annotations

import math

import numpy as np
import soxr


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
