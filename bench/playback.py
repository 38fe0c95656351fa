"""A real-time player of one audio stream, for the benches' underrun figures.

Playback starts when the first chunk arrives. A chunk that arrives after the audio before it has
played out is an underrun (how late: its ``late_ms``); the player, like any real one, waits for
it and resumes from then on, so each underrun is one gap, not the carry-over of an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


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


@dataclass
class PlayedStream:
    """A bench's figures of one stream, starting with what its player heard (:meth:`heard`);
    benches subclass it with their own timings. Fields with ``repr=False`` stay out of
    :meth:`figures`."""

    audio_s: float = 0.0
    underruns: int = 0
    underrun_ms: float = 0.0
    late_ms: list[float] = field(default_factory=list, repr=False)

    def heard(self, player: Playback) -> None:
        """Take the player's figures once the stream has ended."""
        self.audio_s = player.played_s
        self.late_ms = player.late_ms
        self.underruns = player.underruns
        self.underrun_ms = player.underrun_ms

    def figures(self) -> dict[str, float | int | str]:
        """The scalar figures (for the JSON report)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.repr}


__all__ = ["PlayedStream", "Playback"]
