"""Streaming sample-rate conversion for the output chain."""

from __future__ import annotations

import numpy as np
import soxr


def resampled_length(samples: int, in_rate: int, out_rate: int) -> int:
    """How many output samples ``samples`` input samples become: ``ceil(samples * out / in)``
    (exact integer arithmetic)."""
    return -(-samples * out_rate // in_rate)


class StreamResampler:
    """Chunked soxr HQ resampling whose output equals resampling the whole signal at once,
    with the total length exactly :func:`resampled_length` of the input at :meth:`flush` (and
    never more than that of the input so far before it)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
        self._n_in = 0
        self._n_out = 0
        self._held = np.zeros(0, dtype=np.float32)

    def process(self, samples: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(samples, dtype=np.float32)
        self._n_in += x.size
        y = self._stream.resample_chunk(x)
        if self._held.size:
            y = np.concatenate([self._held, y])
        # Never ahead of the input's length (the total is fixed at flush).
        room = max(resampled_length(self._n_in, self.in_rate, self.out_rate) - self._n_out, 0)
        y, self._held = y[:room], y[room:]
        self._n_out += y.size
        return np.asarray(y, dtype=np.float32)

    def flush(self) -> np.ndarray:
        """The remaining output (call once, at the end)."""
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        if self._held.size:
            tail = np.concatenate([self._held, tail])
        self._held = np.zeros(0, dtype=np.float32)
        want = max(resampled_length(self._n_in, self.in_rate, self.out_rate) - self._n_out, 0)
        if tail.size > want:
            tail = tail[:want]
        elif tail.size < want:
            tail = np.concatenate([tail, np.zeros(want - tail.size, dtype=np.float32)])
        self._n_out += tail.size
        return np.asarray(tail, dtype=np.float32)
