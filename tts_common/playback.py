"""A real-time listener of one audio stream: the benches count its underruns, the decoder paces
its chunks by it (``decoder_service/pacing.py``).

Playback starts when the first chunk arrives. A chunk that arrives after the audio before it has
played out is an underrun (how late: its ``late_ms``); the player, like any real one, waits for
it and resumes from then on, so each underrun is one gap, not the carry-over of an earlier one.
"""

from __future__ import annotations


class Playback:
    """Feed it every audio chunk of a stream with :meth:`chunk` (see the module doc). Times are
    seconds on one clock (``time.monotonic()``)."""

    def __init__(self) -> None:
        self.first_at: float | None = None
        """Arrival of the first chunk, once one came."""
        self.played_s = 0.0
        """Seconds of audio received."""
        self.stalled_s = 0.0
        """Seconds spent waiting for late chunks."""
        self.late_ms: list[float] = []
        """Every chunk's lateness in milliseconds (0: in time)."""

    def left_s(self, now: float) -> float | None:
        """Seconds of audio received but not yet played at ``now`` (negative: the player has
        been waiting that long); None before the first chunk."""
        if self.first_at is None:
            return None
        return self.first_at + self.stalled_s + self.played_s - now

    def chunk(self, now: float, seconds: float) -> float:
        """A chunk of ``seconds`` of audio arrived at ``now``; returns its lateness in ms."""
        left = self.left_s(now)
        if left is None:
            self.first_at = now
        late = 0.0 if left is None else max(-left, 0.0)
        self.stalled_s += late  # the player waited for this chunk and resumes now
        self.played_s += seconds
        self.late_ms.append(late * 1000)
        return late * 1000

    @property
    def underruns(self) -> int:
        return sum(1 for late in self.late_ms if late > 0)

    @property
    def underrun_ms(self) -> float:
        return sum(self.late_ms)


__all__ = ["Playback"]
