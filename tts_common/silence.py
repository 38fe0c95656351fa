"""The silence stop: ending an utterance whose audio has gone quiet after speech.

A few generations in a thousand of Qwen3-TTS finish the words and then keep producing
near-silence without the end-of-speech code until the frame budget runs out (the runaway guard
bounds that, at up to 0.8 s per text token, but a listener waits through all of it and the slot
stays taken). :class:`SilenceDetector` watches an utterance's audio in order, one codec frame
(80 ms) at a time: a frame whose RMS level is below :attr:`SilenceStop.threshold_dbfs` is silent,
any other is sound. Once the utterance has had sound, a run of silent frames lasting
:attr:`SilenceStop.seconds` stops it: the audio is kept up to the end of that run (the pause
itself included, so the stop is never shorter than a natural pause could be) and the rest is
dropped. Silence before the first sound never stops anything.

The decision depends only on the utterance's samples, frame by frame from its first sample, never
on how the samples were chunked: the gateway (streamed PCM) and the offline command (a whole
decode) stop at the same sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SilenceStop:
    """When an utterance counts as gone silent (see the module doc)."""

    threshold_dbfs: float = -45.0
    """A frame whose RMS level is below this (dB relative to full scale 1.0) is silent. Speech is
    around -20 dBFS; -45 dBFS is well under quiet speech and breaths, above the near-silence of a
    run-on generation."""
    seconds: float = 2.0
    """Silence after speech that stops the utterance (longer than a natural pause)."""


DEFAULT_SILENCE_STOP = SilenceStop()
"""The silence stop's default settings (the gateway's and the offline command's)."""


def frame_level_dbfs(frame: np.ndarray) -> float:
    """RMS level of ``frame`` in dBFS (-inf for digital silence)."""
    rms = math.sqrt(float(np.mean(np.square(frame, dtype=np.float64)))) if frame.size else 0.0
    return 20 * math.log10(rms) if rms > 0 else -math.inf


class SilenceDetector:
    """Decides the silence stop of one utterance from its samples, pushed in order."""

    def __init__(self, rule: SilenceStop, sample_rate: int, frame_samples: int) -> None:
        """``sample_rate`` and ``frame_samples`` (samples per codec frame) of the pushed audio."""
        if frame_samples < 1 or sample_rate < 1:
            raise ValueError(f"bad audio geometry: {sample_rate} Hz, {frame_samples} samples per frame")
        self.rule = rule
        self.frame_samples = frame_samples
        self.limit_frames = max(1, math.ceil(rule.seconds * sample_rate / frame_samples - 1e-9))
        """Silent frames after sound that stop the utterance."""
        self._pending = np.zeros(0, dtype=np.float32)  # the start of an incomplete frame
        self._heard = False
        self._silent_run = 0
        self.stopped = False

    def push(self, samples: np.ndarray) -> int | None:
        """Consume the next ``samples``. None: keep them all and go on. An int ``n``: the stop;
        keep the first ``n`` of these samples (and push nothing more)."""
        if self.stopped:
            raise RuntimeError("samples pushed after the silence stop")
        carried = self._pending.size
        audio = np.concatenate([self._pending, samples]) if carried else samples
        n = self.frame_samples
        complete = audio.size // n
        for f in range(complete):
            frame = audio[f * n : (f + 1) * n]
            if frame_level_dbfs(frame) >= self.rule.threshold_dbfs:
                self._heard, self._silent_run = True, 0
            elif self._heard:
                self._silent_run += 1
                if self._silent_run >= self.limit_frames:
                    self.stopped = True
                    return (f + 1) * n - carried
        self._pending = np.array(audio[complete * n :], dtype=np.float32)
        return None


def silence_stop_sample(
    audio: np.ndarray, rule: SilenceStop, sample_rate: int, frame_samples: int
) -> int | None:
    """Where the silence stop cuts a whole utterance's ``audio`` (samples to keep), or None."""
    return SilenceDetector(rule, sample_rate, frame_samples).push(audio)


__all__ = [
    "DEFAULT_SILENCE_STOP",
    "SilenceDetector",
    "SilenceStop",
    "frame_level_dbfs",
    "silence_stop_sample",
]
