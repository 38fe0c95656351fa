"""Streaming time-scaling (tempo change without pitch change) with FFmpeg's ``atempo``.

``atempo`` (WSOLA-style overlap-add) runs in a PyAV filter graph fed chunk by chunk; what it has
produced is returned right away, and :meth:`StreamTempo.flush` drains the rest. One ``atempo``
stage is used for factors in [0.5, 2.0]; outside, equal stages are chained (two for the
[0.25, 4.0] range) because a single stage below 0.5 is refused and above 2.0 skips input instead
of overlapping it. The total output length is exactly :func:`time_scaled_length` of the input
(``atempo`` alone ends up to a window short or long): output ahead of it is held back, and the
end is trimmed or padded.
"""

from __future__ import annotations

import math
from typing import Any

import av
import numpy as np
from av.filter import Graph

from .formats import check_speed

_STAGE_MIN, _STAGE_MAX = 0.5, 2.0


def time_scaled_length(samples: int, speed: float) -> int:
    """How many output samples ``samples`` input samples become at ``speed``:
    ``round(samples / speed)``."""
    return round(samples / speed)


def atempo_stages(speed: float) -> list[float]:
    """Equal per-stage factors in [0.5, 2.0] whose product is ``speed``."""
    n = max(1, math.ceil(abs(math.log(speed)) / math.log(2.0) - 1e-12))
    return [speed ** (1.0 / n)] * n


class StreamTempo:
    """Changes the tempo of a mono float32 stream by ``speed`` (2.0 = twice as fast)."""

    def __init__(self, speed: float, sample_rate: int) -> None:
        check_speed(speed)
        self.speed = speed
        self.sample_rate = sample_rate
        self._graph: Any = Graph()
        node = self._graph.add_abuffer(
            sample_rate=sample_rate, format="flt", layout="mono", time_base=f"1/{sample_rate}"
        )
        for factor in atempo_stages(speed):
            stage = self._graph.add("atempo", f"{factor:.12g}")
            node.link_to(stage)
            node = stage
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()
        self._n_in = 0
        self._n_out = 0
        self._held = np.zeros(0, dtype=np.float32)

    def _drain(self) -> np.ndarray:
        """What the filter has produced (after what was held back), not yet counted."""
        parts = [self._held]
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            parts.append(frame.to_ndarray().reshape(-1))
        self._held = np.zeros(0, dtype=np.float32)
        return np.concatenate(parts).astype(np.float32, copy=False)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """The time-scaled samples available after ``samples`` (possibly fewer or none yet)."""
        x = np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1)
        if x.shape[1]:
            frame = av.AudioFrame.from_ndarray(x, format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.pts = self._n_in
            self._n_in += x.shape[1]
            self._graph.push(frame)
        y = self._drain()
        # Never ahead of the input's length (the total is fixed at flush).
        room = max(time_scaled_length(self._n_in, self.speed) - self._n_out, 0)
        y, self._held = y[:room], y[room:]
        self._n_out += y.size
        return y

    def flush(self) -> np.ndarray:
        """The remaining output (call once, at the end), trimmed or zero-padded so the whole
        output has exactly ``time_scaled_length(n_in, speed)`` samples."""
        self._graph.push(None)
        tail = self._drain()
        want = max(time_scaled_length(self._n_in, self.speed) - self._n_out, 0)
        if tail.size > want:
            tail = tail[:want]
        elif tail.size < want:
            tail = np.concatenate([tail, np.zeros(want - tail.size, dtype=np.float32)])
        self._n_out += tail.size
        return tail
