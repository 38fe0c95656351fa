"""When the decoder cuts a stream's next chunk: at the chunk schedule's size, or earlier with the
frames it holds when a listener would otherwise run out of audio (a playout deadline).

Why: the schedule doubles its chunks (2, 4, 8, 16, 25 frames) for a low first-audio latency and
few forwards later. Filling a chunk of ``2n`` frames takes ``2n`` frames of generation, while
the chunk before it plays for ``n`` frames, so a stream generated at any pace slower than twice
real time runs dry at every doubling. On a 2-core AMD EPYC (Zen 5) one int8 stream through the
stack ran at an RTF of 0.62-0.79 (faster than real time) and still had 19-20 underruns in every
run of 5 requests, all in the first 4 seconds of each; paced at 120 ms, 4-14 in 1-3 of the 5
requests, over six runs (``bench/cpu_serving.py``, 2026-11-27,
``bench/results/cpu_issue30_zen5_s43.json``).

The listener is :class:`tts_common.playback.Playback`, the one the benches measure (as any real
player behaves): playback starts when the first chunk leaves, plays continuously, and when a
chunk comes late waits for it and resumes from then on. :class:`PlayoutPacer` keeps that
listener's clock and cuts the frames it holds once the audio left to play, less their decode,
falls to ``headroom_s`` (:meth:`PlayoutPacer.cut`), also between frames
(:meth:`PlayoutPacer.wait_s`: a talker that pauses does not keep frames already here from a
listener who needs them). Where the stream is fast (a GPU, several times real time) the deadline
is never near and the chunks are the schedule's, as before. The audio does not depend on where
chunks are cut (streaming decode is seamless: :mod:`.model.streaming`) beyond float rounding:
the cuts depend on timing, so paced, two runs of one request can differ in the last bits
(~1e-7), which is why the decoder paces only when ``--playout-headroom-ms`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tts_common.playback import Playback

from .model.streaming import ChunkSchedule

_TICK_S = 1e-6
"""A cut due within this is due now: a wait of :meth:`PlayoutPacer.wait_s` can end a rounding
error short of the deadline."""
FORGET = 0.7
"""Weight left to the chunks before, at each new one, in :class:`DecodeTime`'s fit."""


@dataclass
class DecodeTime:
    """A stream's decode wall seconds for a chunk of ``n`` frames, ``fixed + per_frame * n``,
    fitted by least squares to its chunks so far, each older chunk weighted down by
    :data:`FORGET`. Why a fixed part: a forward costs about the same for 1 frame as for 2 or 3
    on CPU (a frame's share would price 3 frames at 3 single-frame forwards, so held frames were
    cut ever sooner, in ever smaller and costlier chunks). Before the chunks differ in size:
    proportional to ``n``."""

    weight: float = 0.0
    """The chunks' weights summed (each :data:`FORGET` times the next one's)."""
    sum_n: float = 0.0
    """Weighted sum of chunk sizes (frames)."""
    sum_d: float = 0.0
    """Weighted sum of decode seconds."""
    sum_nn: float = 0.0
    """Weighted sum of squared chunk sizes."""
    sum_nd: float = 0.0
    """Weighted sum of size times seconds."""

    def add(self, frames: int, seconds: float) -> None:
        """A chunk of ``frames`` frames took ``seconds`` to decode."""
        self.weight = FORGET * self.weight + 1
        self.sum_n = FORGET * self.sum_n + frames
        self.sum_d = FORGET * self.sum_d + seconds
        self.sum_nn = FORGET * self.sum_nn + frames * frames
        self.sum_nd = FORGET * self.sum_nd + frames * seconds

    def seconds(self, frames: int) -> float:
        """The expected decode of ``frames`` frames (0 before any chunk)."""
        if not self.weight or not frames:
            return 0.0
        mean_n, mean_d = self.sum_n / self.weight, self.sum_d / self.weight
        spread = self.sum_nn / self.weight - mean_n * mean_n
        if spread < 1e-6:
            return mean_d * frames / mean_n
        per_frame = max((self.sum_nd / self.weight - mean_n * mean_d) / spread, 0.0)
        return max(mean_d - per_frame * mean_n, 0.0) + per_frame * frames


@dataclass
class PlayoutPacer:
    """One stream's chunk cuts (see the module doc). Times are ``time.monotonic()`` seconds.

    A chunk cut early must also be decoded before the listener's audio runs out, and decoding
    takes time (on 2 CPU cores shared with the talker, 40-130 ms for 1-3 frames, then 20-30 ms a
    frame, measured through the stack): so the frames held are cut once the audio left, less
    their decode as this stream's chunks have taken (:class:`DecodeTime`), falls to the
    headroom. And only while the stream keeps up with real time: a stream generated slower than
    real time runs dry whatever the cuts, and cutting it frame by frame only costs the decoder (a
    first version without this check, through the stack at 8 streams: 0.8x the audio seconds per
    second, 20x the gaps), so it keeps the schedule once it is more than the headroom behind."""

    schedule: ChunkSchedule
    """The chunk sizes the stream follows while its listener has audio to spare."""
    frame_s: float
    """Seconds of audio per codec frame (0.08 at 12.5 Hz)."""
    headroom_s: float
    """The audio a listener should still have when a chunk cut early arrives
    (``--playout-headroom-ms``); 0 = the schedule only."""
    chunks: int = 0
    """Chunks sent so far."""
    listener: Playback = field(default_factory=Playback, init=False)
    """The listener's clock: playing from the first chunk, waiting out each late one."""
    decode_time: DecodeTime = field(default_factory=DecodeTime, init=False)
    """This stream's decode wall time by chunk size."""
    first_frame_at: float | None = field(default=None, init=False)
    """When the first frame came."""
    last_frame_at: float = field(default=0.0, init=False)
    """When the latest frame came."""
    frames_in: int = field(default=0, init=False)
    """Frames received so far."""

    def left_s(self, now: float) -> float | None:
        """Seconds of audio sent but not yet played at ``now`` (negative: the listener has been
        waiting that long); None before the first chunk."""
        return self.listener.left_s(now)

    def keeping_up(self) -> bool:
        """Whether the frames, from the first to the latest, have come in the time they play,
        give or take the headroom (the first frames can come unevenly: on 2 CPU cores the third
        came 133 ms after the second, behind the first chunk's decode, then every ~50 ms)."""
        if self.first_frame_at is None:
            return True
        return (
            self.frames_in - 1
        ) * self.frame_s + self.headroom_s >= self.last_frame_at - self.first_frame_at

    def _slack_s(self, held: int, now: float) -> float | None:
        """Audio left at ``now`` once the ``held`` frames are decoded, beyond the headroom; None
        where no early cut applies (nothing held, no headroom, before the first chunk, a stream
        slower than real time)."""
        left = self.left_s(now)
        if not held or self.headroom_s <= 0 or left is None or not self.keeping_up():
            return None
        return left - self.decode_time.seconds(held) - self.headroom_s

    def cut(self, held: int, now: float) -> int:
        """How many of the ``held`` frames to decode and send now: the schedule's next size once
        that many are here, all of them once the listener's audio runs low, else 0 (wait)."""
        size = self.schedule.size(self.chunks)
        if held >= size:
            return size
        slack = self._slack_s(held, now)
        return held if slack is not None and slack <= _TICK_S else 0

    def wait_s(self, held: int, now: float) -> float | None:
        """How long to wait for more frames before :meth:`cut` would send the ``held`` ones
        (None: no limit, the next frame decides)."""
        slack = self._slack_s(held, now)
        return None if slack is None else max(slack, 0.0)

    def arrived(self, frames: int, now: float) -> None:
        """``frames`` frames came at ``now``."""
        if self.first_frame_at is None:
            self.first_frame_at = now
        self.last_frame_at = now
        self.frames_in += frames

    def sent(self, frames: int, now: float, decode_s: float) -> None:
        """A chunk of ``frames`` frames, decoded in ``decode_s``, left at ``now``."""
        self.listener.chunk(now, frames * self.frame_s)
        self.decode_time.add(frames, decode_s)
        self.chunks += 1


__all__ = ["DecodeTime", "PlayoutPacer"]
