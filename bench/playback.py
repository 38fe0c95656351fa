"""A real-time player of one audio stream, for the benches' underrun figures:
:class:`tts_common.playback.Playback` (playback from the first chunk; a late chunk is one gap,
waited out), and :class:`PlayedStream`, a bench's figures of one stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tts_common.playback import Playback


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
