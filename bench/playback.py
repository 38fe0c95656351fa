"""A real-time player of one audio stream, for the benches' underrun figures.

Playback starts when the first chunk arrives. A chunk that arrives after the audio before it has
played out is an underrun (how late: its ``late_ms``); the player, like any real one, waits for
it and resumes from then on, so each underrun is one gap, not the carry-over of an earlier one.
"""

from __future__ import annotations


class Playback:
    """Feed it every audio chunk of a stream with :meth:`chunk` (see the module doc)."""

    def __init__(self) -> None:
        self.first_at: float | None = None
        """Arrival of the first chunk (``time.monotonic()``), once one came."""
        self.played_s = 0.0
        """Seconds of audio received."""
        self.stalled_s = 0.0
        self.late_ms: list[float] = []
        """Every chunk's lateness in milliseconds (0: in time)."""

    def chunk(self, now: float, seconds: float) -> float:
        """A chunk of ``seconds`` of audio arrived at ``now``; returns its lateness in ms."""
        if self.first_at is None:
            self.first_at = now
            late = 0.0
        else:
            late = max(now - (self.first_at + self.stalled_s + self.played_s), 0.0)
            self.stalled_s += late
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
